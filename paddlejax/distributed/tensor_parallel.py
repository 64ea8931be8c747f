"""Megatron-style tensor (model) parallel layers over the mesh axis ``"mp"`` (Paddle's
``fleet.meta_parallel``): the layers hold the whole weight, marked with the dimension that is
split over ``"mp"`` (Flax's ``out_sharding`` metadata, which capture records on the program's
param ops), and mark where activations are split (:func:`paddlejax.ops.sharding_constraint`).
XLA's partitioner then gives each device its slice of every weight and inserts the collectives
Megatron writes by hand:

- :class:`ColumnParallelLinear`: weight ``[in, out]`` split by columns (output features); each
  device computes its share of the outputs, gathered whole (``gather_output=True``) or left split
  for a :class:`RowParallelLinear` that follows;
- :class:`RowParallelLinear`: weight split by rows (input features); each device multiplies its
  share of the inputs, and the partial sums are all-reduced;
- :class:`VocabParallelEmbedding`: the table split by rows (the vocabulary); each device looks
  up the ids it holds and the rows are summed over ``"mp"``;
- :class:`ParallelCrossEntropy`: softmax cross-entropy over logits split along the vocabulary
  (the max and the sum of the softmax are reduced over ``"mp"``; the logits are never gathered).

On a mesh without ``"mp"`` (one device, data parallel only) they are the plain layers, with
the same parameters by the same names: a checkpoint moves between layouts unchanged. Train with
``Trainer(..., strategy=Strategy(tensor_parallel_degree=N))``.

A model built from plain layers is made tensor parallel by :func:`parallelize` with a plan
(layer names to ``"column"``, ``"row"`` or ``"vocab"``, as PyTorch's ``parallelize_module``);
:func:`megatron_plan` writes Megatron's plan for the Transformer layers of ``paddlejax.nn``
(attention: q/k/v by column, the output projection by row; feed-forward: ``linear1`` by column,
``linear2`` by row; the word embeddings by rows), which covers the zoo's BERT and Transformer
models.

>>> import jax.numpy as jnp
>>> mlp = ColumnParallelLinear(8, 16, gather_output=False)
>>> mlp.weight.get_metadata()["out_sharding"]
(None, 'mp')
>>> RowParallelLinear(16, 8, input_is_parallel=True)(mlp(jnp.ones((2, 8)))).shape
(2, 8)
"""
from __future__ import annotations

import fnmatch

import jax.numpy as jnp
from flax import nnx

from paddlejax import ops
from paddlejax.nn import Embedding, Layer, Linear, MultiHeadAttention, TransformerDecoderLayer, \
    TransformerEncoderLayer
from paddlejax.nn.args import arg_error

MP = "mp"
# how each style splits a layer's (weight, bias)
STYLES = {"column": ((None, MP), (MP,)), "row": ((MP, None), None), "vocab": ((MP, None), None)}


def mark_sharding(variable: nnx.Variable | None, *spec) -> None:
    """Record that ``variable``'s dimensions are split over the mesh axes ``spec`` (None: whole).

    >>> import jax.numpy as jnp
    >>> w = nnx.Param(jnp.ones((4, 2)))
    >>> mark_sharding(w, "mp", None); w.get_metadata()["out_sharding"]
    ('mp', None)
    """
    if variable is not None:
        variable.set_metadata(out_sharding=tuple(spec), eager_sharding=False)


def _group(layer: str, mp_group) -> None:
    if mp_group not in (None, MP):
        raise arg_error(layer, "mp_group", f"None or {MP!r} (the tensor-parallel mesh axis)", mp_group)


class ColumnParallelLinear(Linear):
    """``y = x @ weight + bias`` with ``weight [in, out]`` split by output columns over ``"mp"``.

    ``gather_output=False`` leaves ``y`` split along its last dimension, for a
    :class:`RowParallelLinear` (``input_is_parallel=True``) to consume without communication.

    >>> import jax.numpy as jnp
    >>> ColumnParallelLinear(4, 6)(jnp.ones((3, 4))).shape
    (3, 6)
    """

    def __init__(self, in_features, out_features, weight_attr=None, has_bias=True, gather_output=True,
                 fuse_matmul_bias=False, mp_group=None, name=None, *, rngs: nnx.Rngs | None = None):
        _group("ColumnParallelLinear", mp_group)
        super().__init__(in_features, out_features, weight_attr, None if has_bias else False, rngs=rngs)
        mark_sharding(self.weight, None, MP)
        mark_sharding(self.bias, MP)
        self.gather_output = bool(gather_output)

    def forward(self, x):
        y = super().forward(x)
        return ops.sharding_constraint(y, dim=-1, mesh_axis=None if self.gather_output else MP)


class RowParallelLinear(Linear):
    """``y = x @ weight + bias`` with ``weight [in, out]`` split by input rows over ``"mp"``: each
    device multiplies its share of ``x``'s features, and the partial products are summed
    (all-reduced) before the bias, which every device holds whole.

    ``input_is_parallel=True`` says ``x`` arrives split along its last dimension (from a
    :class:`ColumnParallelLinear` with ``gather_output=False``); otherwise it is split here.

    >>> import jax.numpy as jnp
    >>> RowParallelLinear(6, 4)(jnp.ones((3, 6))).shape
    (3, 4)
    """

    def __init__(self, in_features, out_features, weight_attr=None, has_bias=True, input_is_parallel=False,
                 fuse_matmul_bias=False, mp_group=None, name=None, *, rngs: nnx.Rngs | None = None):
        _group("RowParallelLinear", mp_group)
        super().__init__(in_features, out_features, weight_attr, None if has_bias else False, rngs=rngs)
        mark_sharding(self.weight, MP, None)
        self.input_is_parallel = bool(input_is_parallel)

    def forward(self, x):
        x = ops.sharding_constraint(x, dim=-1, mesh_axis=MP)
        y = ops.linear(x, self.weight[...])
        y = ops.sharding_constraint(y, dim=-1, mesh_axis=None)  # the partial sums, all-reduced
        return y if self.bias is None else y + self.bias[...]


class VocabParallelEmbedding(Embedding):
    """Rows of ``weight [num_embeddings, embedding_dim]`` with the table split by rows (the
    vocabulary) over ``"mp"``: each device holds ``num_embeddings / mp`` rows.

    >>> import jax.numpy as jnp
    >>> VocabParallelEmbedding(16, 4)(jnp.array([[1, 15]])).shape
    (1, 2, 4)
    """

    def __init__(self, num_embeddings, embedding_dim, weight_attr=None, mp_group=None, name=None, *,
                 rngs: nnx.Rngs | None = None):
        _group("VocabParallelEmbedding", mp_group)
        super().__init__(num_embeddings, embedding_dim, weight_attr=weight_attr, rngs=rngs)
        mark_sharding(self.weight, MP, None)

    def forward(self, x):
        return ops.sharding_constraint(super().forward(x), dim=-1, mesh_axis=None)


class ParallelCrossEntropy(Layer):
    """Softmax cross-entropy of logits split along the class (vocabulary) dimension over
    ``"mp"``; one loss per example, shaped ``[..., 1]`` as Paddle's. ``ignore_index`` labels
    give a loss of 0.

    >>> import jax.numpy as jnp
    >>> loss = ParallelCrossEntropy()(jnp.zeros((2, 4)), jnp.array([1, 3]))
    >>> loss.shape, round(float(loss[0, 0]), 4)
    ((2, 1), 1.3863)
    """

    def __init__(self, mp_group=None, name=None, ignore_index=-100):
        _group("ParallelCrossEntropy", mp_group)
        self.ignore_index = int(ignore_index)

    def forward(self, input, label):
        logits = ops.sharding_constraint(input, dim=-1, mesh_axis=MP)
        label = label[..., 0] if label.ndim == logits.ndim else label
        loss = ops.cross_entropy(logits, label, ignore_index=self.ignore_index, reduction="none")
        return jnp.expand_dims(loss, -1)


def parallelize(model, plan: dict[str, str]):
    """Mark ``model``'s layers for tensor parallelism as ``plan`` says: dotted layer names (glob
    patterns allowed) to ``"column"`` / ``"row"`` (Linear layers) or ``"vocab"`` (Embedding
    layers). The model is changed in place and returned; a pattern that matches no layer, or a
    style that does not fit the layer, raises ``ValueError``.

    >>> import paddlejax.nn as nn
    >>> mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    >>> mlp = parallelize(mlp, {"0": "column", "2": "row"})
    >>> mlp[0].weight.get_metadata()["out_sharding"], mlp[2].weight.get_metadata()["out_sharding"]
    ((None, 'mp'), ('mp', None))
    """
    unknown = sorted({style for style in plan.values()} - set(STYLES))
    if unknown:
        raise ValueError(f"parallelize: unknown style(s) {unknown}; choose from {sorted(STYLES)}")
    used = set()
    for path, layer in nnx.iter_graph(model):
        name = ".".join(map(str, path))
        pattern = next((p for p in plan if fnmatch.fnmatchcase(name, p)), None)
        if pattern is None or not isinstance(layer, Layer):
            continue
        used.add(pattern)
        style = plan[pattern]
        want = Embedding if style == "vocab" else Linear
        if not isinstance(layer, want):
            raise ValueError(f"parallelize: '{name}' is a {type(layer).__name__}; style {style!r} splits a "
                             f"{want.__name__}")
        weight, bias = STYLES[style]
        mark_sharding(layer.weight, *weight)
        if bias is not None:
            mark_sharding(getattr(layer, "bias", None), *bias)
    unmatched = sorted(set(plan) - used)
    if unmatched:
        raise ValueError(f"parallelize: no layer of {type(model).__name__} matches {unmatched}")
    return model


def megatron_plan(model, vocab: str | None = "*word_embedding*") -> dict[str, str]:
    """Megatron's tensor-parallel plan for ``model``'s ``paddlejax.nn`` Transformer layers: every
    ``MultiHeadAttention`` splits q/k/v by column (so whole heads on each device) and
    ``out_proj`` by row; every encoder or decoder layer splits ``linear1`` by column and
    ``linear2`` by row; the ``Embedding`` layers whose names match ``vocab`` (a glob; the zoo's
    BERT and Transformer name theirs ``*word_embedding*``; None: none) are split by rows.

    >>> import paddlejax.nn as nn
    >>> plan = megatron_plan(nn.TransformerEncoderLayer(8, 2, 16))
    >>> plan["linear1"], plan["self_attn.q_proj"], plan["self_attn.out_proj"]
    ('column', 'column', 'row')
    """
    plan = {}
    for path, layer in nnx.iter_graph(model):
        name = ".".join(map(str, path))
        prefix = f"{name}." if name else ""
        if isinstance(layer, MultiHeadAttention):
            plan |= {f"{prefix}{p}": "column" for p in ("q_proj", "k_proj", "v_proj")} | {f"{prefix}out_proj": "row"}
        elif isinstance(layer, (TransformerEncoderLayer, TransformerDecoderLayer)):
            plan |= {f"{prefix}linear1": "column", f"{prefix}linear2": "row"}
        elif isinstance(layer, Embedding) and vocab is not None and fnmatch.fnmatchcase(name, vocab):
            plan[name] = "vocab"
    return plan
