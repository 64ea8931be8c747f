"""The HTTP app: PaddleHub Serving's ``POST /predict/<module>``, dynamically batched, plus
health, module descriptions, Prometheus metrics and an OpenAPI document.

Every answer of ``/predict`` is JSON shaped as PaddleHub Serving's:
``{"status": CODE, "msg": MESSAGE, "results": [...]}``, one result per text or image, in order.
``CODE`` is ``"000"`` when all went well, else (with ``results`` empty and ``msg`` naming the
problem, and the HTTP status beside it):

======  ====  ================================================================================
code    HTTP  meaning
======  ====  ================================================================================
"000"   200   ok
"101"   400   bad request: not JSON, binary garbage, an empty body, not an object, a missing
              key or wrong type (the module's ``parse_request`` says which), a malformed header
"102"   404   no such module (the message lists the served ones), or no such route
"103"   413   too large: the body (over ``Limits.max_body_bytes``), or the items (how many, or
              one of them) when the module says so (it may say 400)
"104"   503   overloaded: ``Limits.max_concurrency`` requests in flight, ``Limits.max_queue``
              items queued for the module, or the server is shutting down; retry later
"105"   504   timeout: the results were not ready within ``Limits.request_timeout_s``
"105"   408   timeout: the request body did not arrive within it (a slow or stalled client)
"106"   405   method not allowed (``GET /predict/x``)
"107"   415   unsupported media type: ``Content-Type`` is not JSON (none at all is taken as JSON)
"199"   500   internal error: the module failed on the batch holding this request (logged with
              its traceback; the server keeps serving)
======  ====  ================================================================================

The other routes: ``GET /health``, ``GET /modules/<name>`` (the module's ``info()``),
``GET /metrics`` (Prometheus' text format, :mod:`~paddlejax.hub.serving.metrics`) and
``GET /openapi.json``. Unknown routes and methods get the same JSON error shape.

:func:`create_app`'s docstring shows a servable: any object with ``name``, ``version``, ``task``,
``max_batch_size``, ``parse_request``, ``run_batch`` and ``info``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os

from paddlejax._extras import require
from paddlejax.hub.errors import RequestError
from paddlejax.hub.serving.batcher import Batcher, BatchError
from paddlejax.hub.serving.body import Body, ClientGone
from paddlejax.hub.serving.limits import Limits
from paddlejax.hub.serving.metrics import Metrics
from paddlejax.hub.serving.openapi import openapi

require("starlette", extra="hub", feature="paddlejax.hub.serving")
require("prometheus_client", extra="hub", feature="paddlejax.hub.serving")

from starlette.applications import Starlette  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

log = logging.getLogger("paddlejax.hub.serving")

# HTTP status -> (PaddleHub-style status code, metrics reason)
CODES = {200: ("000", ""), 400: ("101", "bad_request"), 404: ("102", "not_found"), 408: ("105", "client_timeout"),
         405: ("106", "method_not_allowed"), 413: ("103", "too_large"), 415: ("107", "unsupported_media_type"),
         500: ("199", "internal"), 503: ("104", "overloaded"), 504: ("105", "timeout")}
SERVABLE_ATTRIBUTES = ("name", "version", "task", "max_batch_size", "parse_request", "run_batch", "info")
# After refusing a body part-way, this long is spent reading (and dropping) what the client
# still sends, so that it sees the answer instead of a reset connection.
DISCARD_SECONDS = 1.0
# The most a client gone or stalled before its body arrived is answered with (nginx's code)
CLIENT_GONE = 499


def code_for(status: int) -> str:
    """The PaddleHub-style status string of an HTTP status.

    >>> code_for(200), code_for(413), code_for(429), code_for(502)
    ('000', '103', '101', '199')
    """
    if status in CODES:
        return CODES[status][0]
    return "101" if status < 500 else "199"


def _jsonable(value):
    if hasattr(value, "tolist"):  # NumPy arrays and scalars
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(content) -> bytes:
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                      default=_jsonable).encode()


def paddle_response(status: int, msg: str = "", results=(), headers: dict | None = None) -> Response:
    """A JSON response in PaddleHub Serving's shape.

    >>> paddle_response(404, "no module 'x'").body
    b'{"status":"102","msg":"no module \\'x\\'","results":[]}'
    """
    return Response(_dumps({"status": code_for(status), "msg": msg, "results": list(results)}), status,
                    headers=headers, media_type="application/json")


def _json_response(content, status: int = 200) -> Response:
    return Response(_dumps(content), status, media_type="application/json")


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True
    media = content_type.split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _parse(raw: bytes, module, limits: Limits) -> list:
    """The items of a request body: JSON, an object, then the module's own checks."""
    if not raw.strip():
        raise RequestError("empty request body: expected a JSON object such as {\"texts\": [...]}")
    try:
        payload = json.loads(raw)
    except RecursionError:
        raise RequestError("request body is not JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise RequestError(f"request body is not JSON: {str(e)[:200]}") from None
    if not isinstance(payload, dict):
        raise RequestError(f"request body must be a JSON object such as {{\"texts\": [...]}}, "
                           f"got a JSON {type(payload).__name__}")
    items = module.parse_request(payload, limits)
    if not isinstance(items, list):
        raise TypeError(f"{type(module).__name__}.parse_request returned {type(items).__name__}, not a list")
    if len(items) > limits.max_items:  # the module should have said so; the queue relies on it
        raise RequestError(f"too many items: {len(items)} (at most {limits.max_items} per request)", status=413)
    return items


class ServingState:
    """What the routes of one app share: modules, their batchers, limits, metrics, and the
    count of requests in flight (the lifespan drains it at shutdown)."""

    def __init__(self, modules: dict, *, batching: bool, max_batch_size: int | None, max_wait_ms: float,
                 limits: Limits, workers_per_module: int):
        self.modules = dict(modules)
        self.limits = limits
        self.metrics = Metrics()
        self.batchers = {name: Batcher(m, name=name, batching=batching, max_batch_size=max_batch_size,
                                       max_wait_s=max_wait_ms / 1e3, max_queue=limits.max_queue,
                                       workers=workers_per_module, metrics=self.metrics)
                         for name, m in self.modules.items()}
        self.in_flight = 0
        self.closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        # JSON decoding and the module's parse_request (base64, image decoding) stay off the event loop
        self.parse_pool = concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1),
                                                                thread_name_prefix="hub-parse")

    def start(self) -> None:
        for batcher in self.batchers.values():
            batcher.start()

    async def close(self) -> None:
        """Refuse new requests, wait (at most ``request_timeout_s``) for those in flight,
        then stop the batchers and threads."""
        self.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout_s
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        for batcher in self.batchers.values():
            await batcher.stop(timeout=max(deadline - loop.time(), 0))
        self.parse_pool.shutdown(wait=False, cancel_futures=True)

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.set(self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()
        self.metrics.in_flight.set(self.in_flight)


async def predict(request: Request) -> Response:
    """``POST /predict/{module}``: the module's results for the request's items."""
    state: ServingState = request.app.state.serving
    loop = asyncio.get_running_loop()
    start = loop.time()
    name = request.path_params["module"]
    label = name if name in state.modules else "-"
    try:
        body = Body(request.receive, request.headers, state.limits.max_body_bytes,
                    deadline=start + state.limits.request_timeout_s)
    except RequestError as e:  # a malformed Content-Length: the body's end cannot be found
        response = paddle_response(e.status, str(e), headers={"connection": "close"})
    else:
        if state.closing or state.in_flight >= state.limits.max_concurrency:
            error = RequestError("server is shutting down" if state.closing else
                                 f"server is overloaded: {state.in_flight} requests in flight "
                                 f"(at most {state.limits.max_concurrency}); retry later", status=503)
            response = await _refuse(body, error)
        else:
            state.enter()
            try:
                response = await _predict(state, request, body, name)
            finally:
                state.leave()
    state.metrics.requests.labels(module=label, code=str(response.status_code)).inc()
    if response.status_code != 200:
        reason = CODES.get(response.status_code, ("", "client_gone" if response.status_code == CLIENT_GONE
                                                  else "other"))[1]
        state.metrics.errors.labels(module=label, reason=reason).inc()
    state.metrics.latency.labels(module=label).observe(loop.time() - start)
    return response


async def _refuse(body: Body, error: RequestError) -> Response:
    """The error's response; when the body is not all read, drop what more arrives (within
    limits) or close the connection after answering."""
    headers = None
    if not body.complete:
        announced_too_large = body.length is not None and body.length > body.limit
        ended = False
        if error.status != 408 and not announced_too_large:  # a stalled client would only stall us too
            seconds = min(DISCARD_SECONDS, body.deadline - asyncio.get_running_loop().time())
            ended = await body.discard(body.limit, seconds)
        if not ended:
            headers = {"connection": "close"}
    status = error.status if 400 <= error.status < 600 else 400  # a module's RequestError may say anything
    log.debug("refused: %s %s", status, error)
    return paddle_response(status, str(error), headers=headers)


async def _predict(state: ServingState, request: Request, body: Body, name: str) -> Response:
    loop = asyncio.get_running_loop()
    try:
        raw = await body.read()
        module = state.modules.get(name)
        if module is None:
            raise RequestError(f"no module {name!r} is served here; served: {', '.join(sorted(state.modules))}",
                               status=404)
        if not _is_json(request.headers.get("content-type")):
            raise RequestError(f"unsupported Content-Type {request.headers['content-type'][:80]!r}: "
                               f"send application/json", status=415)
        async with asyncio.timeout_at(body.deadline):
            items = await loop.run_in_executor(state.parse_pool, _parse, raw, module, state.limits)
            results = await state.batchers[name].submit(items)
        return paddle_response(200, "", results)
    except RequestError as e:
        return await _refuse(body, e)
    except TimeoutError:
        return paddle_response(504, f"module {name!r} did not answer within {state.limits.request_timeout_s} s")
    except ClientGone:
        return paddle_response(CLIENT_GONE, "client disconnected")
    except BatchError as e:  # logged by the batcher, once for the whole batch
        return paddle_response(500, str(e))
    except Exception as e:
        log.exception("module %r failed on a request", name)
        return paddle_response(500, f"module {name!r} failed: {type(e).__name__}: {str(e)[:200]}")


async def health(request: Request) -> Response:
    """``GET /health``: ok and the modules served (503 while shutting down)."""
    state: ServingState = request.app.state.serving
    modules = {n: {"version": m.version, "task": m.task} for n, m in state.modules.items()}
    if state.closing:
        return _json_response({"status": "shutting down", "modules": modules}, 503)
    return _json_response({"status": "ok", "modules": modules})


async def module_info(request: Request) -> Response:
    """``GET /modules/{name}``: the module's ``info()``."""
    state: ServingState = request.app.state.serving
    name = request.path_params["name"]
    if name not in state.modules:
        return paddle_response(404, f"no module {name!r} is served here; served: {', '.join(sorted(state.modules))}")
    return _json_response(state.modules[name].info())


async def metrics(request: Request) -> Response:
    """``GET /metrics``: Prometheus' text format."""
    content, media_type = request.app.state.serving.metrics.render()
    return Response(content, headers={"content-type": media_type})


async def openapi_json(request: Request) -> Response:
    """``GET /openapi.json``: the OpenAPI 3.1 document of this server."""
    return _json_response(request.app.state.openapi)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        msg = f"no route {request.url.path!r}; POST /predict/<module>, GET /health, /modules/<name>, /metrics"
    elif exc.status_code == 405:
        msg = f"method {request.method} not allowed on {request.url.path!r}"
    else:
        msg = exc.detail
    return paddle_response(exc.status_code, msg, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return paddle_response(500, f"internal error: {type(exc).__name__}")


def create_app(modules: dict, *, batching: bool = True, max_batch_size: int | None = None, max_wait_ms: float = 5.0,
               limits: Limits = Limits(), workers_per_module: int = 1) -> Starlette:
    """A Starlette app serving ``modules`` (name -> servable) at ``POST /predict/<name>``.

    A servable has ``name``, ``version``, ``task``, ``max_batch_size``,
    ``parse_request(payload, limits) -> items``, ``run_batch(items) -> results`` and
    ``info() -> dict`` (:class:`paddlejax.hub.Module` has them).

    - ``batching``: gather concurrent requests into one ``run_batch`` call of up to
      ``max_batch_size`` items (default each module's own), waiting at most ``max_wait_ms``
      for the first request's company; with ``False``, each request runs alone.
    - ``limits``: what requests may hold and how long they may take (:class:`Limits`).
    - ``workers_per_module``: batches of one module running at once (threads); more than 1
      only for modules whose ``run_batch`` may run in several threads at the same time.

    The lifespan starts the batch workers; at shutdown it refuses new requests, lets those
    in flight finish (at most ``limits.request_timeout_s``), then stops the workers. Run it
    with :func:`~paddlejax.hub.serving.serve` or any ASGI server.

    >>> class Echo:
    ...     name, version, task, max_batch_size = "echo", "1.0.0", "text-embedding", 8
    ...     def parse_request(self, payload, limits):
    ...         return payload["texts"]
    ...     def run_batch(self, items):
    ...         return [len(t) for t in items]
    ...     def info(self):
    ...         return {"name": self.name}
    >>> app = create_app({"echo": Echo()}, max_wait_ms=2, limits=Limits(max_items=64))
    >>> app.state.serving.batchers["echo"].max_batch_size
    8
    >>> sorted(r.path for r in app.routes)
    ['/health', '/metrics', '/modules/{name}', '/openapi.json', '/predict/{module}']
    """
    for name, module in modules.items():
        missing = [a for a in SERVABLE_ATTRIBUTES if not hasattr(module, a)]
        if missing:
            raise TypeError(f"create_app: module {name!r} ({type(module).__name__}) lacks {', '.join(missing)}")
    if not isinstance(limits, Limits):
        raise TypeError(f"create_app: limits must be a Limits, got {type(limits).__name__}")
    state = ServingState(modules, batching=batching, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                         limits=limits, workers_per_module=workers_per_module)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.start()
        try:
            yield
        finally:
            await state.close()

    app = Starlette(
        routes=[Route("/predict/{module}", predict, methods=["POST"]),
                Route("/health", health, methods=["GET"]),
                Route("/modules/{name}", module_info, methods=["GET"]),
                Route("/metrics", metrics, methods=["GET"]),
                Route("/openapi.json", openapi_json, methods=["GET"])],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        lifespan=lifespan)
    app.state.serving = state
    app.state.openapi = openapi({n: m.info() for n, m in state.modules.items()})
    return app
