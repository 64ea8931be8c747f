"""Dynamic batching: requests for one module, queued, run together in one ``run_batch`` call.

A worker takes the first waiting request, then gathers the ones behind it until their items
reach the batch size or ``max_wait_s`` has passed since the first arrived (or, if shorter,
the time recent batches took to compute: waiting longer than that delays the whole batch more
than it would delay the late arrivals to run them in the next one); it runs
``module.run_batch`` on all their items in a thread of its own (JAX never blocks the event
loop) and hands each request its slice of the results. A request with more items than the
batch size runs alone (the module's predictor runs it in chunks). Without batching, each
request runs alone, in arrival order.

>>> import asyncio
>>> class Double:
...     name, max_batch_size = "double", 8
...     def run_batch(self, items):
...         return [2 * x for x in items]
>>> async def main():
...     batcher = Batcher(Double(), max_wait_s=0.01)
...     try:
...         return await asyncio.gather(batcher.submit([1, 2]), batcher.submit([3]))
...     finally:
...         await batcher.stop(timeout=1)
>>> asyncio.run(main())
[[2, 4], [6]]
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging

from paddlejax.hub.errors import RequestError

log = logging.getLogger("paddlejax.hub.serving")


class BatchError(RuntimeError):
    """``run_batch`` failed (or returned the wrong number of results); already logged with
    its traceback, once for the whole batch. Every request of the batch gets it."""


@dataclasses.dataclass
class _Request:
    items: list
    future: asyncio.Future
    arrived: float


class Batcher:
    """The queue and worker(s) of one module.

    - ``name``: the module's name in messages and metrics (default ``module.name``);
    - ``batching``: gather requests into batches (else each runs alone);
    - ``max_batch_size``: items per batch (default the module's ``max_batch_size``);
    - ``max_wait_s``: the longest the first request of a batch waits for others (less for a
      module whose batches compute faster than that);
    - ``max_queue``: items that may wait; :meth:`submit` refuses more with a 503 RequestError;
    - ``workers``: batches run at once, each in a thread of its own. Keep 1 unless the
      module's ``run_batch`` may run in several threads at the same time.
    - ``metrics``: a :class:`~paddlejax.hub.serving.metrics.Metrics` to record batch sizes
      and queue lengths in.

    The worker starts with the first :meth:`submit` (or :meth:`start`) and runs in that
    event loop; :meth:`stop` lets what is queued finish first.

    >>> Batcher(type("M", (), {"name": "m", "max_batch_size": 4})()).max_batch_size
    4
    """

    def __init__(self, module, *, name: str | None = None, batching: bool = True, max_batch_size: int | None = None,
                 max_wait_s: float = 0.005, max_queue: int = 4096, workers: int = 1, metrics=None):
        self.module = module
        self.name = name or module.name
        self.batching = batching
        self.max_batch_size = int(max_batch_size or module.max_batch_size)
        if self.max_batch_size < 1 or workers < 1 or max_queue < 1 or max_wait_s < 0:
            raise ValueError(f"Batcher({self.name}): max_batch_size, workers and max_queue must be positive and "
                             f"max_wait_s not negative, got {self.max_batch_size}, {workers}, {max_queue}, "
                             f"{max_wait_s}")
        self.max_wait_s = max_wait_s
        self.batch_seconds: float | None = None  # moving average of run_batch's time
        self.max_queue = max_queue
        self.workers = workers
        self.metrics = metrics
        self.queued_items = 0
        self._pending: collections.deque[_Request] = collections.deque()
        self._arrived: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopping = False

    def start(self) -> None:
        """Start the workers in the running event loop (once; later calls do nothing)."""
        if self._tasks:
            return
        self._arrived = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix=f"hub-{self.name}")
        self._tasks = [asyncio.create_task(self._work(), name=f"hub-batcher-{self.name}-{i}")
                       for i in range(self.workers)]

    async def submit(self, items: list) -> list:
        """The module's results for ``items``, in order, once a batch with them has run.

        Raises a 503 RequestError when the queue is full or the batcher is stopping, and
        :class:`BatchError` when the batch failed (or the module's RequestError, as is).
        Cancelling the wait drops the results; a batch already running still completes.
        """
        if not items:
            return []
        if self._stopping:
            raise RequestError(f"module {self.name!r} is shutting down", status=503)
        self.start()
        if self.queued_items + len(items) > self.max_queue:
            raise RequestError(f"module {self.name!r} is overloaded: {self.queued_items} items are queued "
                               f"(at most {self.max_queue}); retry later", status=503)
        loop = asyncio.get_running_loop()
        request = _Request(list(items), loop.create_future(), loop.time())
        self._pending.append(request)
        self._count_queued(len(items))
        self._arrived.set()
        return await request.future

    async def stop(self, timeout: float) -> None:
        """Refuse new requests, let the queued ones finish (for at most ``timeout`` seconds;
        those still waiting then get a 503), then stop the workers and their threads."""
        self._stopping = True
        if not self._tasks:
            return
        self._arrived.set()
        _, late = await asyncio.wait(self._tasks, timeout=timeout)
        for task in late:
            task.cancel()
        while self._pending:
            request = self._pending.popleft()
            self._count_queued(-len(request.items))
            if not request.future.done():
                request.future.set_exception(RequestError(f"module {self.name!r} shut down before this request "
                                                          f"ran", status=503))
        # a batch still computing cannot be interrupted: its thread ends on its own
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _count_queued(self, n: int) -> None:
        self.queued_items += n
        if self.metrics is not None:
            self.metrics.queue_items.labels(module=self.name).set(self.queued_items)

    def _pop(self) -> _Request | None:
        """The next request still awaited; requests cancelled while queued are dropped unrun."""
        while self._pending:
            request = self._pending.popleft()
            self._count_queued(-len(request.items))
            if not request.future.done():
                return request
        return None

    async def _next_batch(self) -> list[_Request] | None:
        while (first := self._pop()) is None:
            if self._stopping:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        batch, size = [first], len(first.items)
        if not self.batching:
            return batch
        loop = asyncio.get_running_loop()
        deadline = first.arrived + min(self.max_wait_s, self.batch_seconds or self.max_wait_s)
        while size < self.max_batch_size:
            if self._pending:
                following = self._pending[0]
                if following.future.done():
                    self._pop()
                    continue
                if size + len(following.items) > self.max_batch_size:
                    break  # it leads the next batch
                batch.append(self._pop())
                size += len(following.items)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0 or self._stopping:
                break
            self._arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                break
        return batch

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while (batch := await self._next_batch()) is not None:
            items = [item for request in batch for item in request.items]
            if self.metrics is not None:
                self.metrics.batch_size.labels(module=self.name).observe(len(items))
            try:
                started = loop.time()
                results = await loop.run_in_executor(self._executor, self.module.run_batch, items)
                seconds = loop.time() - started
                self.batch_seconds = seconds if self.batch_seconds is None else (
                    0.8 * self.batch_seconds + 0.2 * seconds)
                if not isinstance(results, (list, tuple)) or len(results) != len(items):
                    got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
                    raise BatchError(f"module {self.name!r}: run_batch returned {got} for {len(items)} items")
            except asyncio.CancelledError:  # stopped past its drain time
                self._fail(batch, RequestError(f"module {self.name!r} shut down while this request ran", status=503))
                raise
            except RequestError as error:
                self._fail(batch, error)
            except Exception as error:
                log.error("module %r: run_batch failed on a batch of %d items (%d requests)", self.name,
                          len(items), len(batch), exc_info=error)
                self._fail(batch, error if isinstance(error, BatchError) else
                           BatchError(f"module {self.name!r} failed: {type(error).__name__}: {error}"))
            else:
                start = 0
                for request in batch:
                    end = start + len(request.items)
                    if not request.future.done():  # else its client gave up: the results are dropped
                        request.future.set_result(list(results[start:end]))
                    start = end

    @staticmethod
    def _fail(batch: list[_Request], error: Exception) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(error)
