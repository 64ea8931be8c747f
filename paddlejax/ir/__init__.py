"""The program IR: Program, Block, Op, Value, the Rewriter, the verifier and the text form."""
from paddlejax.ir.core import Block, Op, Program, TensorType, Value, walk_blocks  # noqa: F401
from paddlejax.ir.rewriter import Rewriter  # noqa: F401
from paddlejax.ir.verifier import VerificationError, verify  # noqa: F401
