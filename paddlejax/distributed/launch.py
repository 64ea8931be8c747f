"""Start a script as several processes on this node and supervise them: the engine behind
``paddlejax launch``.

Every process runs ``python script args...`` with the environment that
:func:`paddlejax.distributed.env.init_from_env` reads (coordinator, process count and id, local
rank, devices per process). Its stdout and stderr go to ``log_dir/rank{i}.log``; local rank 0
is also echoed here, each line prefixed ``[rank{i}]``. When a rank exits non-zero, the others get
SIGTERM, then SIGKILL after ``grace_period`` seconds, and the failing rank's exit code and log
tail are printed; SIGINT (Ctrl-C) or SIGTERM to the launcher stops every rank the same way, and
a second one kills them at once. (A rank that joined JAX's distributed runtime takes SIGTERM as
a preemption notice and keeps running: it has the grace period to save a checkpoint.)

Elastic runs (``max_restarts > 0``, ``paddlejax launch --elastic``): when a rank fails, every rank
is stopped and the whole run started again, on a fresh coordinator, up to ``max_restarts`` times
(JAX's distributed runtime cannot take a lone process back in, so the run restarts together).
Each start sees ``PADDLEJAX_RESTART_COUNT``; logs are appended to, one header per restart. A
script that trains with a ``checkpoint_dir`` resumes from its last checkpoint, and the
checkpoint reads back on any number of processes and devices, so the run may be restarted by
hand with another ``nproc`` too.

>>> import pathlib, tempfile
>>> work = pathlib.Path(tempfile.mkdtemp())
>>> script = work / "hello.py"
>>> _ = script.write_text("import os\\n"
...                       "print('process', os.environ['PADDLEJAX_PROCESS_ID'],"
...                       " 'of', os.environ['PADDLEJAX_NUM_PROCESSES'])\\n")
>>> launch(script, nproc=2, log_dir=work / "log")
[rank0] process 0 of 2
0
>>> (work / "log" / "rank1.log").read_text()
'process 1 of 2\\n'
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from paddlejax.distributed import env as launch_env

TAIL_LINES = 20
_POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on at ``host`` right now (the OS picks it).

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_master(master: str) -> tuple[str, int]:
    """``"ADDR:PORT"`` as ``(addr, port)``; ``ValueError`` naming ``master`` otherwise.

    >>> parse_master("10.0.0.1:6170")
    ('10.0.0.1', 6170)
    """
    host, sep, port = master.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"master must be ADDR:PORT with a port in 1..65535 (e.g. 10.0.0.1:6170), got {master!r}")
    return host, int(port)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: killed by signal N gives 128 + N.

    >>> exit_status(3), exit_status(-signal.SIGKILL)
    (3, 137)
    """
    return 128 - returncode if returncode < 0 else returncode


class _Rank:
    """One process of the run, with the thread that copies its output to its log file (and,
    when ``echo`` is given, to ``echo`` with a ``[rank{i}]`` prefix)."""

    def __init__(self, cmd: list[str], environ: dict[str, str], rank: int, log_path: Path, echo, append: bool):
        self.rank, self.log_path, self.append = rank, log_path, append
        # A session of its own: a Ctrl-C in the terminal reaches only the launcher, which then
        # stops every rank in order, and killpg also reaches whatever the rank itself started.
        self.proc = subprocess.Popen(cmd, env=environ, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._copier = threading.Thread(target=self._copy, args=(echo,), daemon=True)
        self._copier.start()

    def _copy(self, echo) -> None:
        prefix = f"[rank{self.rank}] "
        with self.log_path.open("ab" if self.append else "wb") as log:
            for line in iter(self.proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                if echo is not None:
                    echo.write(prefix + line.decode(errors="replace"))
                    echo.flush()

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:  # exited since the poll
                pass

    def finish(self) -> None:
        """Wait for the process and for its output to reach the log."""
        self.proc.wait()
        # a grandchild that outlived the rank may hold the pipe open: do not wait on it forever
        self._copier.join(timeout=2.0)
        self.proc.stdout.close()

    def tail(self, lines: int) -> list[str]:
        with self.log_path.open(encoding="utf-8", errors="replace") as f:
            return list(deque(f, maxlen=lines))


class _Supervisor:
    """Watches the ranks; stops them all on the first failure or on a signal to the launcher."""

    def __init__(self, grace_period: float, err):
        self.grace_period, self.err = grace_period, err
        self.ranks: list[_Rank] = []
        self.signals: list[int] = []

    def on_signal(self, signum, frame) -> None:
        self.signals.append(signum)

    def watch(self) -> int:
        """Wait until every rank succeeded (0), one failed (its status) or a signal came (128 + N)."""
        while True:
            if self.signals:
                sig = self.signals[0]
                self.say(f"{_signal_name(sig)} received; stopping {len(self.ranks)} ranks "
                          f"(send it again to kill them at once)")
                self.stop()
                return 128 + sig
            codes = [r.proc.poll() for r in self.ranks]
            failed = next((r for r, c in zip(self.ranks, codes) if c not in (None, 0)), None)
            if failed is not None:
                return self._fail(failed)
            if all(c == 0 for c in codes):
                for r in self.ranks:
                    r.finish()
                return 0
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """SIGTERM to every running rank, SIGKILL to those still running after the grace period
        (or at once on a second signal to the launcher)."""
        signals_seen = len(self.signals)
        for r in self.ranks:
            r.signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        while (any(r.running() for r in self.ranks) and time.monotonic() < deadline
               and len(self.signals) == signals_seen):
            time.sleep(_POLL_S)
        for r in self.ranks:
            r.signal(signal.SIGKILL)
        for r in self.ranks:
            r.finish()

    def _fail(self, rank: _Rank) -> int:
        code = rank.proc.returncode
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        self.say(f"rank {rank.rank} {how}; stopping the others ({sum(r.running() for r in self.ranks)} running)")
        self.stop()
        lines = rank.tail(TAIL_LINES)
        self.err.write(f"--- last {len(lines)} lines of {rank.log_path} (rank {rank.rank}, {how}) ---\n")
        self.err.writelines(line if line.endswith("\n") else line + "\n" for line in lines)
        self.err.flush()
        return exit_status(code)

    def say(self, message: str) -> None:
        self.err.write(f"paddlejax launch: {message}\n")
        self.err.flush()


def launch(script: str | os.PathLike, args: Sequence[str] = (), *, nproc: int, devices_per_proc: int | None = None,
           log_dir: str | os.PathLike = "log", nnodes: int = 1, node_rank: int = 0, master: str | None = None,
           grace_period: float = 5.0, max_restarts: int = 0, environ: Mapping[str, str] | None = None,
           python: str = sys.executable, echo=None, err=None) -> int:
    """Run ``python script *args`` as ``nproc`` processes on this node and supervise them;
    the exit status: 0 when every rank succeeded, else the failing rank's (128 + N for a
    signal N, also when the launcher itself is stopped by one).

    Ranks on this node are ``node_rank * nproc + local_rank`` of ``nnodes * nproc``. The
    coordinator is ``master`` (``"ADDR:PORT"`` of node 0, required with several nodes), else a
    free port on 127.0.0.1. ``devices_per_proc`` CPU devices per process are set up by
    ``init_from_env``. After a rank fails, the whole run is started again up to ``max_restarts``
    times (see the module doc); a stop by a signal is never restarted. ``environ`` (default ``os.environ``) is the children's base environment;
    ``echo`` (default stdout) receives local rank 0's output, ``err`` (default stderr) the
    launcher's messages. Bad arguments raise ``ValueError`` naming the argument.

    >>> launch("train.py", nproc=0)
    Traceback (most recent call last):
    ...
    ValueError: nproc must be at least 1 (processes on this node), got 0
    """
    _check_positive("nproc", nproc, "processes on this node")
    _check_positive("nnodes", nnodes, "machines")
    if devices_per_proc is not None:
        _check_positive("devices_per_proc", devices_per_proc, "CPU devices per process")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank must be in 0..{nnodes - 1} (nnodes={nnodes}), got {node_rank}")
    if master is not None:
        parse_master(master)
    elif nnodes > 1:
        raise ValueError(f"master ADDR:PORT (an address of node 0 that every node reaches) is required "
                         f"with nnodes={nnodes}")
    if grace_period < 0:
        raise ValueError(f"grace_period must be >= 0 seconds, got {grace_period}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an int >= 0 (restarts after a failure), got {max_restarts!r}")
    if not Path(script).is_file():
        raise ValueError(f"script {str(script)!r} is not a file")

    base = dict(os.environ if environ is None else environ)
    base.update({launch_env.NUM_PROCESSES: str(nnodes * nproc), "PYTHONUNBUFFERED": "1"})
    base.pop(launch_env.DEVICES_PER_PROC, None)
    if devices_per_proc is not None:
        base[launch_env.DEVICES_PER_PROC] = str(devices_per_proc)
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    echo = sys.stdout if echo is None else echo
    supervisor = _Supervisor(grace_period, sys.stderr if err is None else err)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, supervisor.on_signal) for s in (signal.SIGINT, signal.SIGTERM)} \
        if in_main_thread else {}
    try:
        for restart in range(max_restarts + 1):
            if restart:
                supervisor.say(f"restarting all {nproc} ranks (restart {restart} of {max_restarts})")
                supervisor.ranks = []
            base.update({launch_env.COORDINATOR: master or f"127.0.0.1:{free_port()}",
                         launch_env.RESTART_COUNT: str(restart)})
            for local in range(nproc):
                rank = node_rank * nproc + local
                log = log_dir / f"rank{rank}.log"
                if restart:
                    with log.open("a") as f:
                        f.write(f"--- paddlejax launch: restart {restart} of {max_restarts} ---\n")
                child_env = {**base, launch_env.PROCESS_ID: str(rank), launch_env.LOCAL_RANK: str(local)}
                supervisor.ranks.append(_Rank([python, str(script), *args], child_env, rank, log,
                                              echo if local == 0 else None, append=bool(restart)))
            status = supervisor.watch()
            if status == 0 or supervisor.signals:
                return status
        return status
    finally:
        if any(r.running() for r in supervisor.ranks):  # the launcher itself failed
            supervisor.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # real-time signals between SIGRTMIN and SIGRTMAX have no name
        return f"signal {number}"


def _check_positive(name: str, value: int, meaning: str) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be at least 1 ({meaning}), got {value!r}")
