"""Program analysis: FLOPs per call, sizes, buffers."""
import jax
import jax.numpy as jnp

import paddlejax as pj
from paddlejax import analysis


def test_flops_count_matmuls_inside_custom_derivative_rules_once():
    @jax.custom_vjp
    def project(x, w):
        return x @ w

    project.defvjp(lambda x, w: (x @ w, (x, w)), lambda r, g: (g @ r[1].T, r[0].T @ g))
    plain = pj.trace(lambda x, w: x @ w, jnp.ones((4, 8)), jnp.ones((8, 3)))
    custom = pj.trace(project, jnp.ones((4, 8)), jnp.ones((8, 3)))
    assert any(op.type == "custom_vjp" for op in custom.body.ops)
    assert analysis.flops(custom) == analysis.flops(plain) == 2 * 4 * 8 * 3
