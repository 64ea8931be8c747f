"""Dynamic loss scaling for float16 training (Paddle's defaults).

The loss is multiplied by ``scale`` before differentiation and the gradients divided by it
after; when any gradient is not finite the update is skipped and the scale halved, and after
``growth_interval`` finite steps in a row the scale doubles.

>>> import jax.numpy as jnp
>>> ls = LossScale.dynamic()
>>> float(ls.scale)
32768.0
>>> ls, ok = ls.adjust(jnp.array(False))
>>> float(ls.scale), bool(ok)
(16384.0, False)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class LossScale:
    """The scale, the count of finite steps since it last changed, and the policy."""

    scale: jax.Array
    good_steps: jax.Array
    is_dynamic: bool = struct.field(pytree_node=False, default=True)
    growth_interval: int = struct.field(pytree_node=False, default=1000)
    factor: float = struct.field(pytree_node=False, default=2.0)

    @classmethod
    def dynamic(cls, initial: float = 2.0 ** 15, growth_interval: int = 1000, factor: float = 2.0) -> "LossScale":
        """Paddle's dynamic loss scaling: start at 2**15, ×2 after 1000 good steps, ×0.5 on overflow."""
        return cls(jnp.float32(initial), jnp.int32(0), True, growth_interval, factor)

    @classmethod
    def none(cls) -> "LossScale":
        """No scaling (float32 and bfloat16 training)."""
        return cls(jnp.float32(1.0), jnp.int32(0), False)

    def unscale(self, grads):
        """``grads`` divided by the scale; unchanged without dynamic scaling (the scale is 1)."""
        if not self.is_dynamic:
            return grads
        return jax.tree.map(lambda g: g / self.scale.astype(g.dtype), grads)

    def adjust(self, finite: jax.Array) -> tuple["LossScale", jax.Array]:
        """The next scale after a step whose gradients were ``finite``; also whether to apply it."""
        if not self.is_dynamic:
            return self, jnp.asarray(True)
        grow = finite & (self.good_steps + 1 >= self.growth_interval)
        scale = jnp.where(finite, jnp.where(grow, self.scale * self.factor, self.scale), self.scale / self.factor)
        good = jnp.where(finite & ~grow, self.good_steps + 1, 0)
        return self.replace(scale=scale.astype(jnp.float32), good_steps=good.astype(jnp.int32)), finite


def all_finite(tree) -> jax.Array:
    """True when every leaf of ``tree`` is finite.

    >>> bool(all_finite({"a": jnp.ones(2), "b": jnp.array([1.0, jnp.inf])}))
    False
    """
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)
