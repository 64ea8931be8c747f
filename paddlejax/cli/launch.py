"""Run a training script as N processes joined by jax.distributed, with a log per rank.

    paddlejax launch --nproc 2 --devices-per-proc 4 train.py --epochs 3
    paddlejax launch --nproc 4 --nnodes 2 --node-rank 0 --master 10.0.0.1:6170 train.py
    paddlejax launch --elastic --max-restarts 5 --nproc 2 train.py

The script calls paddlejax.distributed.env.init_from_env() before any JAX work; jax.devices() then
lists the devices of every process. If a rank fails, the others are stopped and its log tail is
shown; Ctrl-C stops all ranks. The exit status is the failing rank's (0 when all succeed).
With --elastic a failed run is restarted, every rank together, up to --max-restarts times; a
Trainer with a checkpoint_dir resumes from its last checkpoint (on any number of processes).
"""
from __future__ import annotations

import argparse


def add_arguments(p) -> None:
    p.add_argument("--nproc", type=int, default=1, metavar="N", help="processes on this node (default 1)")
    p.add_argument("--devices-per-proc", type=int, metavar="K", help="CPU devices per process")
    p.add_argument("--log-dir", default="log", metavar="DIR", help="where DIR/rank{i}.log go (default ./log)")
    p.add_argument("--nnodes", type=int, default=1, help="machines taking part (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..nnodes-1 (default 0)")
    p.add_argument("--master", metavar="ADDR:PORT",
                   help="coordinator on node 0 (default: a free port on 127.0.0.1; required with --nnodes > 1)")
    p.add_argument("--grace-period", type=float, default=5.0, metavar="SECONDS",
                   help="time a rank gets to exit after SIGTERM before SIGKILL (default 5)")
    p.add_argument("--elastic", action="store_true",
                   help="restart the whole run when a rank fails, up to --max-restarts times")
    p.add_argument("--max-restarts", type=int, default=3, metavar="N",
                   help="restarts of an --elastic run before giving up (default 3)")
    p.add_argument("script", help="Python script every process runs")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def main(args) -> int:
    from paddlejax.distributed.launch import launch

    return launch(args.script, args.script_args, nproc=args.nproc, devices_per_proc=args.devices_per_proc,
                  log_dir=args.log_dir, nnodes=args.nnodes, node_rank=args.node_rank, master=args.master,
                  grace_period=args.grace_period, max_restarts=args.max_restarts if args.elastic else 0)
