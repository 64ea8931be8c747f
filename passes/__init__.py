"""Graph passes over programs (imported as ``paddlejax.passes``).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: x * 1.0, jnp.ones(3))
>>> [op.type for op in pj.passes.run(prog, "eliminate_identity,dce").walk()]
['return']
"""
from paddlejax.passes.base import (Pass, PassContext, PassResult, get_pass, register_pass,  # noqa: F401
                                   registered_passes)
from paddlejax.passes.canonicalize import Canonicalize  # noqa: F401
from paddlejax.passes.cleanup import (CommonSubexpressionElimination, DeadCodeElimination,  # noqa: F401
                                      EliminateIdentity, FoldConstants)
from paddlejax.passes.manager import (INFERENCE_PIPELINE, PassError, PassManager, PassRecord,  # noqa: F401
                                      inference_pipeline, parse_pipeline, register_pipeline, registered_pipelines,
                                      run)
from paddlejax.passes.rewrite import PatternPass, RewritePattern, apply_patterns, replace_pattern  # noqa: F401
from paddlejax.passes.amp import AutoMixedPrecision  # noqa: F401
from paddlejax.passes.fusion import (EliminateTransposes, FoldConvBatchNorm, FoldLinearBatchNorm,  # noqa: F401
                                     FuseBiasActivation, FuseElementwiseActivation)
from paddlejax.passes.layout import ConvertLayout  # noqa: F401
from paddlejax.passes.donation import Donate  # noqa: F401
from paddlejax.passes.fp8 import ConvertFp8, fp8_device_problem  # noqa: F401
from paddlejax.passes.quant import ConvertInt8, InsertFakeQuant, QuantAware  # noqa: F401
from paddlejax.passes.int8_dataflow import Int8Dataflow  # noqa: F401
from paddlejax.passes.memory import InplaceReuse, Remat, compare_with_xla, liveness, plan_inplace  # noqa: F401
from paddlejax.passes.autotune import Autotune, AutotuneCacheWarning, Decision, TuneCache  # noqa: F401
from paddlejax.passes.attention import FuseAttention  # noqa: F401
from paddlejax.passes.pipeline import PipelineSplit, Stage, balanced_partition, split_stages  # noqa: F401
