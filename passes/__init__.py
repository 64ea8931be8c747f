"""Graph passes over programs (imported as ``paddlejax.passes``).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: x * 1.0, jnp.ones(3))
>>> [op.type for op in pj.passes.run(prog, "eliminate_identity,dce").walk()]
['return']
"""
from paddlejax.passes.base import (Pass, PassContext, PassResult, get_pass, register_pass,  # noqa: F401
                                   registered_passes)
from paddlejax.passes.cleanup import (CommonSubexpressionElimination, DeadCodeElimination,  # noqa: F401
                                      EliminateIdentity, FoldConstants)
from paddlejax.passes.manager import PassError, PassManager, PassRecord, parse_pipeline, run  # noqa: F401
from paddlejax.passes.rewrite import PatternPass, RewritePattern, apply_patterns, replace_pattern  # noqa: F401
from paddlejax.passes.amp import AutoMixedPrecision  # noqa: F401
