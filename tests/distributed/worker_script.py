"""A rank that reports its launch environment and pid, then exits, fails or waits until stopped.

    worker_script.py DIR [--fail-rank R] [--wait] [--ignore-sigterm]

Every rank prints its place in the run and writes its pid to DIR/pid{rank}. Rank R waits until
every rank has written its pid (one node only), then prints an error and exits with code 3.
The others exit at once, or with --wait sleep until the launcher stops them (with
--ignore-sigterm, only SIGKILL can).
"""
import argparse
import os
import pathlib
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("dir", type=pathlib.Path)
parser.add_argument("--fail-rank", type=int)
parser.add_argument("--wait", action="store_true")
parser.add_argument("--ignore-sigterm", action="store_true")
args = parser.parse_args()
if args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

env = os.environ
rank, local = int(env["PADDLEJAX_PROCESS_ID"]), int(env["PADDLEJAX_LOCAL_RANK"])
print(f"rank {rank} of {env['PADDLEJAX_NUM_PROCESSES']}, local rank {local}, "
      f"coordinator {env['PADDLEJAX_COORDINATOR']}")
partial = args.dir / f".pid{rank}"
partial.write_text(str(os.getpid()))
partial.rename(args.dir / f"pid{rank}")  # whole, or not there yet

if rank == args.fail_rank:
    while not all((args.dir / f"pid{r}").exists() for r in range(int(env["PADDLEJAX_NUM_PROCESSES"]))):
        time.sleep(0.05)
    print(f"rank {rank}: shard {rank} is missing", file=sys.stderr)
    sys.exit(3)
if args.wait:
    time.sleep(120)
