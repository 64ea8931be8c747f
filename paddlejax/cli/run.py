"""Run a saved program on inputs from .npy/.npz files and save or print the outputs."""
from __future__ import annotations

import numpy as np


def add_arguments(p) -> None:
    p.add_argument("path", help="saved program")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help=".npy per input, in order (repeat), or one .npz keyed by input name")
    p.add_argument("--output", help="write outputs here (.npy for one output, .npz otherwise)")


def _load_inputs(prog, files) -> list:
    if len(files) == 1 and files[0].endswith(".npz"):
        with np.load(files[0], allow_pickle=False) as data:
            names = [v.name for v in prog.inputs]
            missing = [n for n in names if n not in data]
            if missing:
                raise ValueError(f"{files[0]} lacks inputs {missing}; it has {sorted(data)}")
            return [data[n] for n in names]
    return [np.load(f, allow_pickle=False) for f in files]


def main(args) -> int:
    import jax

    from paddlejax.io import load

    prog = load(args.path)
    leaves = _load_inputs(prog, args.input)
    if len(leaves) != len(prog.inputs):
        raise ValueError(f"{prog.name} takes {len(prog.inputs)} inputs "
                         f"({', '.join(v.name for v in prog.inputs)}), got {len(leaves)}")
    inputs = jax.tree_util.tree_unflatten(prog.in_tree, leaves)
    outputs = jax.tree_util.tree_leaves(prog(*inputs))
    arrays = [np.asarray(o) for o in outputs]
    for i, a in enumerate(arrays):
        print(f"output {i}: {a.dtype}{list(a.shape)} min={a.min():.6g} max={a.max():.6g} mean={a.mean():.6g}")
    if args.output:
        if len(arrays) == 1 and not args.output.endswith(".npz"):
            np.save(args.output, arrays[0])
        else:
            np.savez(args.output, **{f"output{i}": a for i, a in enumerate(arrays)})
        print(f"saved {args.output}")
    return 0
