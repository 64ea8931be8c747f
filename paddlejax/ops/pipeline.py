"""Pipeline stage marks: ``pipeline_stage(x)`` is the identity and records where a program is
cut into pipeline stages (:func:`paddlejax.passes.pipeline.split_stages` cuts at each mark).

>>> import jax.numpy as jnp, paddlejax as pj
>>> prog = pj.trace(lambda x: pj.ops.pipeline_stage(x * 2.0) + 1.0, jnp.ones(3))
>>> [op.type for op in prog.walk()]
['constant', 'lax.mul', 'pipeline_stage', 'constant', 'lax.add', 'return']
>>> prog(jnp.zeros(3)).tolist()
[1.0, 1.0, 1.0]
"""
from __future__ import annotations

from paddlejax.ops.registry import Input, define
from paddlejax.ops.traits import Traits


def _pipeline_stage(x):
    """The identity; the ops after it (in program order) start a new pipeline stage."""
    return x


pipeline_stage = define("pipeline_stage", _pipeline_stage, inputs=[Input("x")], flops=lambda ins, outs, attrs: 0,
                        traits=Traits(channels="identity"))
