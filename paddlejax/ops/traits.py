"""What an op means, declared once and read by every pass: :class:`Traits`.

Each registry op declares its traits in :func:`paddlejax.ops.define`; each generic ``lax.*``
op in :mod:`paddlejax.ops.lax_traits`; the program's structural ops (``param``, ``constant``,
``return``, control flow) here. Passes ask :func:`traits_of` (or ``op.traits`` /
``op.has_trait``) instead of keeping tables of op names, so a new op is handled by every pass
the moment it declares what it is, and an op that declares nothing is treated as opaque.

>>> traits_of("lax.add").commutative, traits_of("elementwise_sub").commutative
(True, False)
>>> traits_of("conv2d").amp, traits_of("softmax").amp, traits_of("relu").amp
('white', 'black', 'gray')
>>> traits_of("conv2d").channel_rule({"groups": 1}), traits_of("conv2d").channel_rule({"groups": 4})
('consumed', 'grouped')
"""
from __future__ import annotations

import dataclasses
from typing import Callable

# Paddle's AMP lists. ``norm`` ops take the low dtype on their data input and keep their
# statistics, scale and shift in float32; ``cast`` ops fix their output dtype by attribute.
AMP_CLASSES = ("white", "black", "gray", "norm", "cast")

# How an op carries a channel axis from its (first) input to its output, for structured
# pruning and layout passes:
#   identity     -- the same channels at the same axis (pointwise ops, norms, pools)
#   consumed     -- input channels are contracted away, the weight makes new ones (conv, linear)
#   grouped      -- channels stay in groups (depthwise and group convolutions: in ties to out)
#   concatenated -- channels of several inputs laid side by side (concat)
#   reshaped     -- channels merged with other axes (flatten, reshape)
#   produced     -- new channels read from a table's last axis, none consumed (embedding lookup)
#   heads        -- query, key and value heads side by side on ``channel_axis`` (attention)
#   reduced      -- axes (``axes`` or ``axis``, all if None; ``keepdim``) summed away, the others kept
CHANNEL_RULES = ("identity", "consumed", "grouped", "concatenated", "reshaped", "produced", "heads", "reduced")

# What the backward pass of an op reads, in the ``remat`` memory model (see passes/memory.py):
# its activation ``operands``, its ``result``, a ``new`` buffer of the result's size that the
# forward computes for the backward (``1 - tanh(x)**2``), a boolean ``mask`` of that size.
SAVED_KINDS = ("operands", "result", "new", "mask")


def always(attrs: dict) -> bool:
    """An ``identity_if`` for ops that return their operand whenever the types match."""
    return True


@dataclasses.dataclass(frozen=True)
class Traits:
    """The meaning of one op type. Every field has the conservative default, so an op that
    declares nothing is pure data flow that no pass rewrites.

    - ``pure``: same operands give the same results, and nothing else happens (False for
      random number generators and side effects: DCE, CSE and folding leave them be);
    - ``pointwise``: each output element depends only on the inputs' elements at its index
      (scalars broadcast), whatever the shape: transposes and layouts commute with it;
    - ``broadcasting``: operands of different shapes broadcast (Paddle's ``elementwise_*``);
    - ``commutative``: a binary op with ``f(a, b) == f(b, a)``;
    - ``reduction``: reduces one or more axes to fewer elements;
    - ``layout_sensitive``: its meaning depends on a ``data_format`` attribute;
    - ``reshaping``: the result holds the operand's elements in their order, regrouped into
      another shape or broadcast (a scalar stays that scalar, a ``[C]`` vector those C values);
    - ``batch_coupled``: an output row depends on other rows of the batch (a bool, or a
      function of the op's attributes, as for training-mode batch norm);
    - ``commutes_with_quantize``: applied to per-tensor quantized values it gives the quantized
      result, exactly: each output element is an input element, or the largest of several
      (transposes, reshapes, max-pooling; a bool or a function of the attributes), so any
      non-decreasing elementwise map commutes with it. The ``int8_dataflow`` pass moves such
      ops after a convolution's requantize;
    - ``nonnegative``: its result has no negative element, whatever its operands (relu,
      relu6, sigmoid; for an op with a fused activation, a function of its ``act``:
      :func:`paddlejax.ops.activation.nonnegative_act`);
    - ``keeps_sign``: a non-decreasing elementwise map of its first operand that keeps zero
      (quantize, dequantize): a non-negative operand gives a non-negative result;
    - ``amp``: the op's class in Paddle's mixed-precision lists (:data:`AMP_CLASSES`);
    - ``weight``: the input holding a quantizable weight (None: not quantizable) and
      ``weight_out_axis`` that weight's output-channel axis (a function of the attributes, or
      None for one scale per tensor);
    - ``channels``: the :data:`CHANNEL_RULES` entry, or a function of the attributes giving it
      (None: the op ends a channel dependency group); ``channel_axis`` the channel axis of its
      data input and output, and ``weight_in_axis`` its weight's input-channel axis (functions
      of the attributes and the rank), for ops whose channels sit at a place only they know;
    - ``identity_if``: a function of the attributes that says when the op returns its first
      operand unchanged (given equal types); ``unit``: the scalar operand that makes a binary op
      return the other one (``x + 0``, ``x * 1``; on the right unless commutative);
    - ``saved_for_backward``: what its gradient reads (:data:`SAVED_KINDS`; None: unknown,
      counted as operands and result);
    - ``canonical``: the registry op this generic op is (``lax.add`` is ``elementwise_add``):
      a function of the op's attributes and operand types giving ``(type, attrs)``, or None
      when this use has no exact twin. The ``canonicalize`` pass and :func:`canonical_form`
      read it.
    """

    pure: bool = True
    pointwise: bool = False
    broadcasting: bool = False
    commutative: bool = False
    reduction: bool = False
    layout_sensitive: bool = False
    reshaping: bool = False
    batch_coupled: bool | Callable[[dict], bool] = False
    commutes_with_quantize: bool | Callable[[dict], bool] = False
    nonnegative: bool | Callable[[dict], bool] = False
    keeps_sign: bool = False
    amp: str = "gray"
    weight: str | None = None
    weight_out_axis: Callable[[dict, int], int | None] | None = None
    channels: str | Callable[[dict], str | None] | None = None
    channel_axis: Callable[[dict, int], int] | None = None
    weight_in_axis: Callable[[dict, int], int] | None = None
    identity_if: Callable[[dict], bool] | None = None
    unit: float | None = None
    saved_for_backward: tuple[str, ...] | None = None
    canonical: Callable[[dict, tuple], tuple[str, dict] | None] | None = None

    def __post_init__(self):
        if self.amp not in AMP_CLASSES:
            raise ValueError(f"amp class must be one of {AMP_CLASSES}, got {self.amp!r}")
        if isinstance(self.channels, str) and self.channels not in CHANNEL_RULES:
            raise ValueError(f"channel rule must be one of {CHANNEL_RULES}, got {self.channels!r}")
        if self.saved_for_backward is not None and set(self.saved_for_backward) - set(SAVED_KINDS):
            raise ValueError(f"saved_for_backward entries must be among {SAVED_KINDS}, "
                             f"got {self.saved_for_backward}")

    def has(self, name: str, attrs: dict | None = None) -> bool:
        """Whether the boolean trait ``name`` holds for an op with ``attrs`` (a trait declared as
        a function of the attributes, such as ``batch_coupled``, is asked with them).

        >>> Traits(pointwise=True).has("pointwise"), Traits().has("pure")
        (True, True)
        >>> Traits(batch_coupled=lambda a: a["training"]).has("batch_coupled", {"training": True})
        True
        """
        if name not in _FLAGS:
            raise ValueError(f"unknown trait {name!r}; boolean traits: {', '.join(_FLAGS)}")
        value = getattr(self, name)
        return bool(value(attrs or {}) if callable(value) else value)

    def couples_batch(self, attrs: dict) -> bool:
        """Whether an op with these traits and ``attrs`` mixes the rows of its batch."""
        return self.has("batch_coupled", attrs)

    def channel_rule(self, attrs: dict) -> str | None:
        """How the channel axis flows through an op with ``attrs`` (:data:`CHANNEL_RULES`)."""
        return self.channels(attrs) if callable(self.channels) else self.channels


def data_format_axis(attrs: dict, rank: int) -> int:
    """The channel axis a ``data_format`` attribute names: 1 for channels-first (``NCHW``),
    the last for channels-last (``NHWC``).

    >>> data_format_axis({"data_format": "NHWC"}, 4), data_format_axis({}, 4)
    (3, 1)
    """
    return 1 if attrs.get("data_format", "NC").startswith("NC") else rank - 1


_FLAGS = ("pure", "pointwise", "broadcasting", "commutative", "reduction", "layout_sensitive", "reshaping",
          "batch_coupled", "commutes_with_quantize", "nonnegative", "keeps_sign")

OPAQUE = Traits(pure=False)
"""Traits of an op type nobody declared: impure (kept by DCE and CSE), nothing else."""

# Ops the IR itself provides: they carry no computation of their own.
STRUCTURAL: dict[str, Traits] = {
    "param": Traits(),
    "constant": Traits(),
    "return": Traits(pure=False, amp="black"),  # a program returns the dtypes it declares
    # control flow is pure as far as its bodies are: the cleanup passes skip ops with blocks
    "cond": Traits(amp="black"),
    "while": Traits(amp="black"),
    "scan": Traits(amp="black"),
    "custom_jvp": Traits(amp="black"),
    "custom_vjp": Traits(amp="black"),
    "reduce": Traits(amp="black", reduction=True),  # lax.reduce with its computation as a block
    "custom_linear_solve": Traits(amp="black"),
}


def traits_of(op_type: str) -> Traits:
    """The declared traits of ``op_type`` (a registry op, ``lax.<primitive>`` or structural),
    or :data:`OPAQUE` when none are declared.

    >>> traits_of("lax.rng_uniform").pure, traits_of("lax.no_such_op") is OPAQUE
    (False, True)
    """
    declared = declared_traits(op_type)
    return OPAQUE if declared is None else declared


def declared_traits(op_type: str) -> Traits | None:
    """Like :func:`traits_of`, but None when ``op_type`` declares no traits."""
    from paddlejax.ops import lax_traits, registry

    if op_type in STRUCTURAL:
        return STRUCTURAL[op_type]
    if op_type.startswith("lax."):
        return lax_traits.LAX_TRAITS.get(op_type[4:])
    opdef = registry.lookup(op_type)
    return None if opdef is None else opdef.traits


def canonical_form(op_type: str, attrs: dict, operand_types: tuple = ()) -> tuple[str, dict]:
    """The op type and attributes in the registry's vocabulary: ``lax.add`` becomes
    ``elementwise_add``, ``lax.transpose{permutation}`` becomes ``transpose{perm}``; an op
    without a twin comes back as it is. Passes match on this, so they see one vocabulary
    whether or not the ``canonicalize`` pass ran.

    >>> canonical_form("lax.transpose", {"permutation": (1, 0)})
    ('transpose', {'perm': (1, 0)})
    >>> canonical_form("lax.sin", {"accuracy": None})
    ('lax.sin', {'accuracy': None})
    """
    rule = traits_of(op_type).canonical
    twin = rule(attrs, tuple(operand_types)) if rule is not None else None
    return twin if twin is not None else (op_type, attrs)


def amp_class(op_type: str) -> str:
    """The op's class in the mixed-precision lists (:data:`AMP_CLASSES`).

    >>> amp_class("lax.dot_general"), amp_class("lax.exp"), amp_class("batch_norm")
    ('white', 'black', 'norm')
    """
    return traits_of(op_type).amp
