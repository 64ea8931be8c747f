"""Running the app on uvicorn, in this process.

>>> server = make_server({}, port=0, log_level="warning")
>>> server.config.timeout_graceful_shutdown, server.config.limit_concurrency
(31, 320)
"""
from __future__ import annotations

import math

from paddlejax._extras import require
from paddlejax.hub.serving.app import create_app
from paddlejax.hub.serving.limits import Limits

# Connections and tasks uvicorn takes beyond the app's max_concurrency (health checks,
# metrics scrapes, idle keep-alive connections) before answering a plain-text 503 itself.
CONNECTION_HEADROOM = 64


def make_server(modules: dict, host: str = "127.0.0.1", port: int = 8866, *, log_level: str = "info",
                **create_app_kwargs):
    """A ``uvicorn.Server`` for ``create_app(modules, **create_app_kwargs)``, not started.

    The server waits ``limits.request_timeout_s`` (rounded up, plus 1) for requests in
    flight when it shuts down (SIGINT, SIGTERM or ``server.should_exit = True``). ``port=0``
    picks a free port: read it from ``server.servers[0].sockets[0]`` once ``server.started``.

    >>> make_server({}, port=0).config.port
    0
    """
    uvicorn = require("uvicorn", extra="hub", feature="paddlejax.hub.serving.serve")
    limits = create_app_kwargs.get("limits") or Limits()
    app = create_app(modules, **create_app_kwargs)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=math.ceil(limits.request_timeout_s) + 1,
                            limit_concurrency=limits.max_concurrency + CONNECTION_HEADROOM)
    return uvicorn.Server(config)


def serve(modules: dict, host: str = "127.0.0.1", port: int = 8866, *, log_level: str = "info",
          **create_app_kwargs) -> None:
    """Serve ``modules`` over HTTP at ``host:port`` until SIGINT or SIGTERM (blocks), then
    shut down gracefully: new connections are refused and requests in flight are answered.

    ``create_app_kwargs`` are :func:`~paddlejax.hub.serving.create_app`'s (``batching``,
    ``max_batch_size``, ``max_wait_ms``, ``limits``, ``workers_per_module``).

    >>> import paddlejax.hub as hub  # doctest: +SKIP
    >>> serve({"all_minilm_l6_v2": hub.Module(name="all_minilm_l6_v2")}, port=8866)  # doctest: +SKIP
    """
    make_server(modules, host, port, log_level=log_level, **create_app_kwargs).run()
