"""Serving: throughput and latency of ``POST /predict/<module>`` with dynamic batching on and off;
then 1,000+ malformed requests.

One module is served on 127.0.0.1 by :func:`paddlejax.hub.serving.make_server` in a thread of
this process, twice: with dynamic batching, then without (each request runs alone, the
baseline). Each time, N concurrent clients (keep-alive connections on this process's event
loop, a minimal HTTP/1.1 client so that the clients cost little of the shared CPU) send one
item per request for T seconds after a short warm-up; every request has a timeout and the
count is capped. Printed: requests/s, p50 and p99 latency, errors, the process' RSS before
and after each run (memory stays flat), the mean batch size from the server's metrics, and
the ratio of throughputs batching / no batching.

Then the abuse run, on a server with a 1 MiB body limit and a 2 s request timeout: malformed
requests of every kind (bad JSON, binary garbage, wrong types, empty and huge bodies, 10k
texts, wrong content type, unknown module, wrong method, nesting 200,000 deep, a malformed
Content-Length, slow clients that send half a body and stall), 32 at a time, each on a new
connection and bounded by a timeout. Each must be answered 4xx; any other answer (or none)
is counted and printed. Then a correct request must still be answered 200.

    python benchmarks/serving.py                        # all_minilm_l6_v2, 64 clients, 30 s per run
    python benchmarks/serving.py --module digits_cnn    # an image module
    python benchmarks/serving.py --fake                 # a fake module (5 ms per batch): no model needed
    python benchmarks/serving.py --quick --fake         # a few seconds: a smoke test
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import dataclasses
import importlib.util
import io
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402

from paddlejax.hub.serving import Limits, make_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB = 2 ** 20
ABUSE_LIMITS = Limits(max_body_bytes=1 * MIB, request_timeout_s=2.0)
REQUEST_TIMEOUT_S = 60.0     # a load request not answered by then counts as an error
MAX_REQUESTS_PER_CLIENT = 1_000_000


# ---------------------------------------------------------------------------------------
# The module and its requests

def load_module(args):
    """The servable: the fake of the serving tests, or ``paddlejax.hub.Module(name=...)``."""
    if args.fake:
        spec = importlib.util.spec_from_file_location("serving_fakes", ROOT / "tests" / "hub" / "serving_fakes.py")
        fakes = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fakes)
        return fakes.TextLengths(name="fake", delay=0.005, max_batch_size=32)
    from paddlejax.hub import Module

    return Module(name=args.module)


def payloads(module, n: int) -> list[bytes]:
    """``n`` JSON bodies of one item each: sentences, or 8x8 PNG images for image modules."""
    rng = np.random.default_rng(0)
    if module.task.startswith("image") or module.task in ("detection", "ocr"):
        from PIL import Image

        bodies = []
        for _ in range(n):
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), "L").save(buffer, format="PNG")
            bodies.append(json.dumps({"images": [base64.b64encode(buffer.getvalue()).decode()]}).encode())
        return bodies
    words = "the quick brown fox jumps over a lazy dog while serving many small requests at once".split()
    return [json.dumps({"texts": [" ".join(rng.choice(words, int(rng.integers(4, 24))))]}).encode()
            for _ in range(n)]


def item_key(module) -> str:
    return "images" if module.task.startswith("image") or module.task in ("detection", "ocr") else "texts"


# ---------------------------------------------------------------------------------------
# A minimal HTTP/1.1 client on asyncio streams

def post_bytes(path: str, body: bytes, content_type: str = "application/json", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
    """Status, headers and body of one response (to the end of the stream without a length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read(1 * MIB)
    return int(lines[0].split()[1]), headers, body


class Server:
    """``make_server`` running in a thread; the port once it listens."""

    def __init__(self, modules: dict, **kwargs):
        self.server = make_server(modules, port=0, log_level="error", **kwargs)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.state = self.server.config.app.state.serving
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)


def rss_mib() -> float:
    """This process' resident memory now (Linux), in MiB; NaN elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------------------
# Load

@dataclasses.dataclass
class Load:
    name: str
    requests: int
    seconds: float
    latencies: list
    errors: int
    rss_before: float
    rss_after: float
    mean_batch: float

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1e3 if self.latencies else float("nan")


async def client(port: int, path: str, bodies: list[bytes], deadline: float, latencies: list, errors: list) -> None:
    """Send ``bodies`` in turn on one keep-alive connection until ``deadline``."""
    loop = asyncio.get_running_loop()
    reader = writer = None
    for i in range(MAX_REQUESTS_PER_CLIENT):
        if loop.time() >= deadline:
            break
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.perf_counter()
            writer.write(post_bytes(path, bodies[i % len(bodies)]))
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, headers, body = await read_response(reader)
            if status == 200 and body.startswith(b'{"status":"000"'):
                latencies.append(time.perf_counter() - start)
            else:
                errors.append(status)
            if headers.get("connection") == "close":
                writer.close()
                writer = None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
            errors.append(type(e).__name__)
            if writer is not None:
                writer.close()
            writer = None
    if writer is not None:
        writer.close()


async def load(port: int, path: str, bodies: list[bytes], clients: int, seconds: float) -> tuple[list, list, float]:
    loop = asyncio.get_running_loop()
    latencies, errors = [], []
    start = loop.time()
    await asyncio.gather(*(client(port, path, bodies[c::clients] or bodies, start + seconds, latencies, errors)
                           for c in range(clients)))
    return latencies, errors, loop.time() - start


def run_load(name: str, module, bodies: list[bytes], args, batching: bool, warmup: float) -> Load:
    path = f"/predict/{module.name}"
    with Server({module.name: module}, batching=batching) as server:
        asyncio.run(load(server.port, path, bodies, args.clients, warmup))
        metrics = server.state.metrics
        calls_before = _batch_stats(metrics, module.name)
        rss_before = rss_mib()
        latencies, errors, elapsed = asyncio.run(load(server.port, path, bodies, args.clients, args.seconds))
        rss_after = rss_mib()
        count, total = (a - b for a, b in zip(_batch_stats(metrics, module.name), calls_before))
    return Load(name, len(latencies), elapsed, latencies, len(errors), rss_before, rss_after,
                total / count if count else float("nan"))


def _batch_stats(metrics, name: str) -> tuple[float, float]:
    """(run_batch calls, items) so far, from the server's batch-size histogram."""
    for family in metrics.registry.collect():
        if family.name == "paddlejax_hub_batch_size":
            values = {s.name: s.value for s in family.samples if s.labels.get("module") == name}
            return values.get("paddlejax_hub_batch_size_count", 0.0), values.get("paddlejax_hub_batch_size_sum", 0.0)
    return 0.0, 0.0


# ---------------------------------------------------------------------------------------
# Abuse

def abuse_kinds(module, limits: Limits) -> dict:
    """Kind -> a coroutine function ``(port) -> status`` sending one malformed request."""
    path, key = f"/predict/{module.name}", item_key(module)
    rng = np.random.default_rng(1)

    def simple(data: bytes):
        async def send(port):
            return await exchange(port, data)
        return send

    async def chunked_huge(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Transfer-Encoding: chunked\r\n\r\n".encode())
            chunk = b"a" * (64 << 10)
            for _ in range(limits.max_body_bytes // len(chunk) + 4):  # past the limit, then the end
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            return (await read_response(reader))[0]
        finally:
            writer.close()

    async def stalled(port):
        body = json.dumps({key: ["half a body"] * 8}).encode()
        data = post_bytes(path, body)
        return await exchange(port, data[:len(data) - len(body) // 2])

    return {
        "bad JSON": simple(post_bytes(path, b'{"%s": ["a", ' % key.encode())),
        "binary garbage": simple(post_bytes(path, rng.integers(0, 256, 2000, dtype=np.uint8).tobytes())),
        "not an object": simple(post_bytes(path, b'["a", "b"]')),
        "wrong types": simple(post_bytes(path, json.dumps({key: [1, {"a": None}]}).encode())),
        "missing key": simple(post_bytes(path, b'{"data": []}')),
        "empty body": simple(post_bytes(path, b"")),
        "nested 200,000 deep": simple(post_bytes(path, b"[" * 200_000 + b"]" * 200_000)),
        "10k items": simple(post_bytes(path, json.dumps({key: ["word"] * 10_000}).encode())),
        "huge (Content-Length)": simple(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                                        f"\r\nContent-Length: 1000000000\r\n\r\n".encode()),
        "huge (chunked)": chunked_huge,
        "wrong content type": simple(post_bytes(path, b"texts=a", "application/x-www-form-urlencoded")),
        "unknown module": simple(post_bytes("/predict/no_such_module", b'{"texts": ["a"]}')),
        "GET on predict": simple(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()),
        "malformed Content-Length": simple(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                           f"Content-Length: 12abc\r\n\r\n{{}}".encode()),
        "stalled half body": stalled,
    }


async def exchange(port: int, data: bytes) -> int:
    """Send ``data`` on a new connection; the status answered (a client that sent half its
    body then waits: it stalls)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return (await read_response(reader))[0]
    finally:
        writer.close()


async def abuse(port: int, kinds: dict, total: int, timeout: float, parallel: int = 32) -> dict:
    """``{kind: Counter(status or error name)}`` over ``total`` requests, kinds in turn."""
    names = list(kinds)
    answers = {name: collections.Counter() for name in names}
    gate = asyncio.Semaphore(parallel)

    async def one(i):
        name = names[i % len(names)]
        async with gate:
            try:
                async with asyncio.timeout(timeout):
                    answers[name][await kinds[name](port)] += 1
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
                answers[name][type(e).__name__] += 1

    await asyncio.gather(*(one(i) for i in range(total)))
    return answers


async def correct(port: int, module, body: bytes) -> int:
    async with asyncio.timeout(REQUEST_TIMEOUT_S):
        return await exchange(port, post_bytes(f"/predict/{module.name}", body))


# ---------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--module", default="all_minilm_l6_v2", help="a hub module (all_minilm_l6_v2, digits_cnn ...)")
    p.add_argument("--fake", action="store_true", help="serve the tests' fake module (5 ms per batch) instead")
    p.add_argument("--clients", type=int, default=None, help="concurrent clients (default 64; 8 with --quick)")
    p.add_argument("--seconds", type=float, default=None, help="seconds per run (default 30; 2 with --quick)")
    p.add_argument("--malformed", type=int, default=None, help="malformed requests (default 1200; 150 with --quick)")
    p.add_argument("--quick", action="store_true", help="a few seconds in all (smoke test)")
    args = p.parse_args(argv)
    args.clients = args.clients or (8 if args.quick else 64)
    args.seconds = args.seconds or (2.0 if args.quick else 30.0)
    args.malformed = args.malformed or (150 if args.quick else 1200)
    warmup = 0.5 if args.quick else 3.0

    print(machine())
    module = load_module(args)
    bodies = payloads(module, 256)
    module.run_batch(module.parse_request(json.loads(bodies[0]), Limits()))  # builds and compiles before timing
    print(f"module {module.name} {module.version} ({module.task}), largest batch {module.max_batch_size}; "
          f"{args.clients} clients x {args.seconds:g} s per run (after {warmup:g} s of warm-up), 1 "
          f"{item_key(module)[:-1]} per request{' (quick)' if args.quick else ''}\n")

    runs = [run_load("batching", module, bodies, args, True, warmup),
            run_load("no batching", module, bodies, args, False, warmup)]
    print(f"{'run':<12}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'mean batch':>12}"
          f"{'RSS before':>12}{'RSS after':>11}")
    for r in runs:
        print(f"{r.name:<12}{r.requests:>10}{r.throughput:>10.1f}{r.percentile(50):>9.1f}{r.percentile(99):>9.1f}"
              f"{r.errors:>8}{r.mean_batch:>12.2f}{r.rss_before:>12.1f}{r.rss_after:>11.1f}")
    print("(RSS in MiB, of this process: server and clients)")
    print(f"ratio batching / no batching = {runs[0].throughput / runs[1].throughput:.2f} (requests/s), "
          f"{runs[0].percentile(50) / runs[1].percentile(50):.2f} (p50 latency)\n")

    with Server({module.name: module}, limits=ABUSE_LIMITS) as server:
        kinds = abuse_kinds(module, ABUSE_LIMITS)
        rss_before = rss_mib()
        answers = asyncio.run(abuse(server.port, kinds, args.malformed, ABUSE_LIMITS.request_timeout_s + 10))
        rss_after = rss_mib()
        after = asyncio.run(correct(server.port, module, bodies[0]))
    not_4xx = {k: {s: n for s, n in c.items() if not (isinstance(s, int) and 400 <= s < 500)}
               for k, c in answers.items()}
    bad = sum(sum(v.values()) for v in not_4xx.values())
    print(f"abuse: {args.malformed} malformed requests ({len(kinds)} kinds, 32 at a time; limits: "
          f"{ABUSE_LIMITS.max_body_bytes // MIB} MiB bodies, {ABUSE_LIMITS.request_timeout_s:g} s)")
    for kind, counts in answers.items():
        print(f"  {kind:<26}" + ", ".join(f"{s}: {n}" for s, n in sorted(counts.items(), key=str)))
    print(f"answered 4xx: {args.malformed - bad} of {args.malformed}; not 4xx: {bad}"
          + (f" ({ {k: v for k, v in not_4xx.items() if v} })" if bad else ""))
    print(f"RSS before / after the abuse: {rss_before:.1f} / {rss_after:.1f} MiB")
    print(f"then a correct request: {after}")
    return 0 if bad == 0 and after == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
