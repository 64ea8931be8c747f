"""``fuse_attention``: attention written out by hand becomes one ``scaled_dot_product_attention``.

The matched chain, over ``[batch, heads, seq, head_dim]`` values (as in Paddle's and
PaddleNLP's hand-written attention)::

    logits = matmul(q, k, transpose_y=True)     # or matmul(q, transpose(k, (0, 1, 3, 2)))
    logits = logits * c                        # optional; or c * q before the matmul, or / c
    logits = logits + mask                      # optional additive float mask, or
    logits = where(bool_mask, logits, -big)     #   a boolean one (-big <= -1e4, -inf included)
    out = matmul(softmax(logits, axis=-1), v)

becomes ``scaled_dot_product_attention(q', k', v', mask) {scale=c}`` on ``[batch, seq, heads,
head_dim]`` values: transposes that produced q, k and v (and the one reading the output) are
absorbed into the op, others are inserted. ``c`` is any constant scalar (``1`` when there is
none). Every intermediate value must have the chain's next op as its only reader: attention
weights that are also returned or used elsewhere keep the written-out form.

Tolerance: float rounding only (the scale is applied to the logits rather than to q, and the
kernel computes in at least float32): about 1e-5 relative in float32. A boolean mask's masked
logits become ``-0.7 * finfo.max`` instead of ``-big``, which changes nothing except rows with
every key masked: they average all values, where ``-inf`` would have given NaN.

``implementation`` (None, ``"xla"`` or ``"cudnn"``) is set on the fused ops, and on the
``scaled_dot_product_attention`` ops that had none (``nn.MultiHeadAttention`` records the op
itself): ``fuse_attention{implementation=cudnn}`` puts all attention on cuDNN's fused kernel
wherever its inputs fit, the float32 ones included that ``amp`` casts to bf16 later (the op
falls back to XLA's kernel where they do not). Asking for ``"cudnn"`` without a GPU is a
ValueError.

>>> import jax.numpy as jnp, paddlejax as pj
>>> from paddlejax import ops
>>> def attention(q, k, v):
...     return ops.matmul(ops.softmax(ops.matmul(q, k, transpose_y=True) * 0.5), v)
>>> q = jnp.ones((1, 2, 3, 4))
>>> print(pj.passes.run(pj.trace(attention, q, q, q), "fuse_attention,dce"))
program @attention(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
  %0 = transpose(%q) {perm=(0, 2, 1, 3)} : f32[1,3,2,4]
  %1 = transpose(%k) {perm=(0, 2, 1, 3)} : f32[1,3,2,4]
  %2 = transpose(%v) {perm=(0, 2, 1, 3)} : f32[1,3,2,4]
  %3 = scaled_dot_product_attention(%0, %1, %2) {is_causal=False, scale=0.5} : f32[1,3,2,4]
  %4 = transpose(%3) {perm=(0, 2, 1, 3)} : f32[1,2,3,4]
  return %4
}
"""
from __future__ import annotations

import dataclasses


from paddlejax.ir.core import Op, TensorType, Value
from paddlejax.ir.rewriter import Rewriter
from paddlejax.ops.attention import require_implementation, scaled_dot_product_attention
from paddlejax.passes.base import register_pass
from paddlejax.passes.query import only_reader, scalar_constant, transpose_perm
from paddlejax.passes.rewrite import PatternPass, RewritePattern

_HEADS_SEQ = (0, 2, 1, 3)  # [batch, heads, seq, dim] <-> [batch, seq, heads, dim]
_MASKED_BELOW = -1e4  # a logit this low has softmax weight exp(-1e4) = 0 in every float type


def canonical_type(op: Op | None) -> str | None:
    """The op's type in the registry's vocabulary (``lax.mul`` is ``elementwise_mul``), None
    for a block argument or an op with a fused activation."""
    return op.canonical[0] if op is not None and op.attrs.get("act") is None else None


def _matmul(op: Op | None) -> dict | None:
    """The attributes of a matrix product (``matmul``, or a ``lax.dot_general`` that is one)."""
    if op is None:
        return None
    kind, attrs = op.canonical
    return attrs if kind == "matmul" else None


def _scaled(program, v: Value, reader: Op) -> tuple[Value, float, Op | None]:
    """``(x, c, op)`` when ``v = op(x, c)`` is ``x * c`` (or ``c * x``, ``x / c``) for a constant
    ``c`` and ``reader`` alone reads ``v``; ``(v, 1.0, None)`` otherwise."""
    op = v.producer
    kind = canonical_type(op)
    if not only_reader(v, reader) or kind not in ("elementwise_mul", "elementwise_div"):
        return v, 1.0, None
    for i in ((0, 1) if kind == "elementwise_mul" else (0,)):
        x, c = op.operands[i], scalar_constant(program, op.operands[1 - i])
        if c is not None and x.type == v.type and c != 0:
            return x, (c if kind == "elementwise_mul" else 1 / c), op
    return v, 1.0, None


def _transposed(rewriter: Rewriter, anchor: Op, x: Value, perm: tuple[int, ...]) -> Value:
    """``transpose(x, perm)``, composed with a transpose that produced ``x`` (so that a
    transpose there and back disappears), inserted before ``anchor``."""
    op = x.producer
    inner = transpose_perm(op)
    if inner is not None:
        x, perm = op.operands[0], tuple(inner[i] for i in perm)
    if perm == tuple(range(len(perm))):
        return x
    shape = tuple(x.type.shape[i] for i in perm)
    return rewriter.insert_before(anchor, Op("transpose", [x], [TensorType(shape, x.type.dtype)],
                                             {"perm": perm})).result


@dataclasses.dataclass(frozen=True)
class _FuseAttention(RewritePattern):
    """Rooted at ``matmul(softmax(...), v)``; see the module doc for the chain."""

    implementation: str | None

    @property
    def label(self) -> str:
        return "attention"

    def match_and_rewrite(self, root: Op, rewriter: Rewriter) -> bool:
        program = rewriter.program
        root_attrs = _matmul(root)
        if root_attrs is None or root_attrs["transpose_x"] or root_attrs["transpose_y"]:
            return False
        probs, v = root.operands
        softmax = probs.producer
        if softmax is None or softmax.type != "softmax" or not only_reader(probs, root) \
                or softmax.attrs["axis"] not in (-1, len(probs.type.shape) - 1):
            return False
        chain = [softmax]  # the ops the fused op replaces
        logits, mask = self._mask(program, softmax.operands[0], softmax, chain)
        if logits is None:
            return False
        logits, scale, scale_op = _scaled(program, logits, chain[-1])
        chain += [scale_op] if scale_op else []
        scores = logits.producer
        score_attrs = _matmul(scores)
        if score_attrs is None or score_attrs["transpose_x"] or not only_reader(logits, chain[-1]):
            return False
        chain.append(scores)
        q, k = scores.operands
        q, q_scale, q_scale_op = _scaled(program, q, scores)
        chain += [q_scale_op] if q_scale_op else []
        # k as [batch, seq, heads, dim] is k transposed by k_perm (k is k^T without transpose_y)
        k_perm = _HEADS_SEQ if score_attrs["transpose_y"] else (0, 3, 1, 2)
        if not self._shapes_fit(q, k, k_perm, v, logits, mask):
            return False
        self._rewrite(rewriter, root, chain, q, k, k_perm, v, mask, scale * q_scale)
        return True

    @staticmethod
    def _mask(program, logits: Value, reader: Op, chain: list[Op]) -> tuple[Value | None, Value | None]:
        """``(unmasked logits, mask)`` read by ``reader``; the mask op joins ``chain``."""
        op = logits.producer
        if not only_reader(logits, reader):
            return None, None
        if canonical_type(op) == "elementwise_add":
            for i in (0, 1):
                x, mask = op.operands[i], op.operands[1 - i]
                if x.type == logits.type and (canonical_type(x.producer) in ("elementwise_mul", "elementwise_div")
                                              or _matmul(x.producer) is not None) \
                        and mask.type.dtype == logits.type.dtype and 1 <= len(mask.type.shape) <= 4:
                    chain.append(op)
                    return x, mask
        if op is not None and op.type == "lax.select_n" and len(op.operands) == 3:
            mask, filler, x = op.operands  # select_n picks x where the mask is True
            big = scalar_constant(program, filler)
            if mask.type.dtype == "bool" and big is not None and big <= _MASKED_BELOW:
                chain.append(op)
                return x, mask
        return logits, None

    @staticmethod
    def _shapes_fit(q: Value, k: Value, k_perm, v: Value, logits: Value, mask: Value | None) -> bool:
        """Rank-4 float q, k, v of one dtype, v shaped like k, the mask broadcasting to the logits."""
        types = (q.type, k.type, v.type)
        if any(len(t.shape) != 4 for t in types) or len({t.dtype for t in types}) != 1 \
                or not types[0].dtype.startswith(("float", "bfloat")) \
                or tuple(k.type.shape[i] for i in k_perm) != tuple(v.type.shape[i] for i in _HEADS_SEQ):
            return False
        if mask is None:
            return True
        shape, full = mask.type.shape, logits.type.shape
        return 1 <= len(shape) <= 4 and all(m in (1, f) for m, f in zip(shape[::-1], full[::-1]))

    def _rewrite(self, rewriter: Rewriter, root: Op, chain: list[Op], q: Value, k: Value, k_perm: tuple[int, ...],
                 v: Value, mask: Value | None, scale: float) -> None:
        qs, ks, vs = (_transposed(rewriter, root, x, perm) for x, perm in ((q, _HEADS_SEQ), (k, k_perm),
                                                                             (v, _HEADS_SEQ)))
        attrs = scaled_dot_product_attention.check_attrs({"scale": scale, "implementation": self.implementation})
        fused = rewriter.insert_before(root, Op("scaled_dot_product_attention",
                                                [qs, ks, vs] + ([mask] if mask is not None else []),
                                                [qs.type], attrs, loc=root.loc))
        out = root.result
        back = out.uses[0][0] if len(out.uses) == 1 else None
        if transpose_perm(back) == _HEADS_SEQ:
            rewriter.replace_op(back, [fused.result])
        else:
            rewriter.replace_all_uses_with(out, _transposed(rewriter, root, fused.result, _HEADS_SEQ))
        for op in [root, *chain]:  # readers before producers
            rewriter.erase_op(op)
        for x in dict.fromkeys((q, k, v)):  # transposes absorbed into the fused op
            op = x.producer
            if transpose_perm(op) is not None and not x.uses:
                rewriter.erase_op(op)


@dataclasses.dataclass(frozen=True)
class _ChooseKernel(RewritePattern):
    """An attention op with no ``implementation`` gets the pass's."""

    implementation: str

    @property
    def label(self) -> str:
        return "kernel"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if op.type != "scaled_dot_product_attention" or op.attrs.get("implementation") is not None:
            return False
        rewriter.set_attr(op, "implementation", self.implementation)
        return True


@register_pass
@dataclasses.dataclass(frozen=True)
class FuseAttention(PatternPass):
    """Fuse written-out attention into ``scaled_dot_product_attention`` (see the module doc;
    tolerance about 1e-5 relative in float32). ``implementation``: None, "xla" or "cudnn".

    >>> import paddlejax as pj
    >>> pj.passes.get_pass("fuse_attention", implementation="xla")
    FuseAttention(implementation='xla')
    """

    name = "fuse_attention"
    implementation: str | None = None

    def __post_init__(self):
        if self.implementation not in (None, "xla", "cudnn"):
            raise ValueError(f"pass 'fuse_attention': option 'implementation' expects None, 'xla' or 'cudnn', "
                             f"got {self.implementation!r}")

    def patterns(self) -> list[RewritePattern]:
        require_implementation(self.implementation)
        chosen = [_ChooseKernel(self.implementation)] if self.implementation else []
        return [_FuseAttention(self.implementation), *chosen]
