"""Run a saved program on inputs from .npy/.npz files and save or print the outputs.

    paddlejax run out/model --input x.npy --output y.npy

Inputs take the program's dtypes, or their 64-bit twins (NumPy's float64 for float32, ...),
which are cast; anything else is refused with the input's name.
"""
from __future__ import annotations

import os

import numpy as np

from paddlejax.cli.common import check_not_input, file_path, read_arrays


CPU_DISPATCH = "sync"  # each call is waited for: run it on the calling thread (paddlejax.dispatch)


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help=".npy per input, in order (repeat), or one .npz keyed by input name")
    p.add_argument("--output", help="write outputs here: a .npy file for one output, or a .npz file "
                                    "(output0, output1, ...)")


def _load_inputs(prog, files) -> list:
    if len(files) == 1 and files[0].endswith(".npz"):
        return read_arrays(files[0], [v.name for v in prog.inputs])
    return [a for f in files for a in read_arrays(f)]


def main(args) -> int:
    import jax

    from paddlejax.io import load
    from paddlejax.lowering import bind_inputs

    prog = load(args.path)
    if args.output:
        file_path(args.output, "--output", (".npz",) if len(prog.outputs) > 1 else (".npy", ".npz"))
        check_not_input(args.output, programs=[args.path], files=args.input, option="--output", program=False)
    leaves = _load_inputs(prog, args.input)
    if len(leaves) != len(prog.inputs):
        raise ValueError(f"{prog.name} takes {len(prog.inputs)} inputs "
                         f"({', '.join(v.name for v in prog.inputs)}), got {len(leaves)}")
    # checked and cast by the rule every program call follows, so the errors name the input
    leaves, _ = bind_inputs(prog, jax.tree_util.tree_unflatten(prog.in_tree, leaves))
    outputs = jax.tree_util.tree_leaves(prog(*jax.tree_util.tree_unflatten(prog.in_tree, leaves)))
    arrays = [np.asarray(o) for o in outputs]
    for i, a in enumerate(arrays):
        stats = f" min={a.min():.6g} max={a.max():.6g} mean={a.mean():.6g}" if a.size else " (empty)"
        print(f"output {i}: {a.dtype}{list(a.shape)}{stats}")
    if args.output:
        os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
        if args.output.endswith(".npy"):
            np.save(args.output, arrays[0])
        else:
            np.savez(args.output, **{f"output{i}": a for i, a in enumerate(arrays)})
        print(f"saved {args.output}")
    return 0
