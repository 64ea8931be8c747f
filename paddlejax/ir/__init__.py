"""The program IR: Program, Block, Op, Value, the Rewriter, the verifier, the text form and its parser."""
from paddlejax.ir.core import Block, Op, Program, TensorType, Value, walk_blocks  # noqa: F401
from paddlejax.ir.rewriter import Rewriter  # noqa: F401
from paddlejax.ir.verifier import VerificationError, verify  # noqa: F401


def __getattr__(name):
    # the parser reads parameter files through paddlejax.io, which imports this package
    if name in ("parse", "ParseError"):
        from paddlejax.ir import parser

        return getattr(parser, name)
    raise AttributeError(f"module 'paddlejax.ir' has no attribute '{name}'")
