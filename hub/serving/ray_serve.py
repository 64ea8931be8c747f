"""The same app in Ray Serve replicas: each replica loads the modules itself and serves
:func:`~paddlejax.hub.serving.create_app`'s app; Ray's proxy spreads requests over them.

Modules hold compiled executables and cannot be pickled, so a replica builds them: it imports
the loader named ``"package.module:function"`` and calls it on each spec string (by default
:func:`paddlejax.hub.module.load_servable`, taking ``"name"`` or ``"name==version"``).

>>> _import_loader("json:dumps")([1])
'[1]'
"""
from __future__ import annotations

import importlib

from paddlejax._extras import require

DEFAULT_LOADER = "paddlejax.hub.module:load_servable"
APP_NAME = "paddlejax-hub"


def _import_loader(path: str):
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"loader must be 'package.module:function', got {path!r}")
    return getattr(importlib.import_module(module), attribute)


class HubReplica:
    """One replica: the modules of ``module_specs``, loaded here, behind one app.

    Ray Serve calls ``__serve_build_asgi_app__`` after ``__init__`` and runs the app's
    lifespan (batch workers) in the replica's event loop.
    """

    def __init__(self, module_specs: list[str], loader: str, create_app_kwargs: dict):
        load = _import_loader(loader)
        servables = [load(spec) for spec in module_specs]
        self.modules = {s.name: s for s in servables}
        if len(self.modules) != len(servables):
            raise ValueError(f"module specs {module_specs} name the same module twice")
        self.create_app_kwargs = create_app_kwargs

    def __serve_build_asgi_app__(self):
        from paddlejax.hub.serving.app import create_app

        return create_app(self.modules, **self.create_app_kwargs)


def deploy_on_ray(module_specs: list[str], *, loader: str = DEFAULT_LOADER, num_replicas: int = 2,
                  autoscaling: dict | None = None, ray_actor_options: dict | None = None, host: str = "127.0.0.1",
                  port: int = 8000, route_prefix: str = "/", hub_home: str | None = None, name: str = APP_NAME,
                  blocking: bool = False, **create_app_kwargs):
    """Deploy ``module_specs`` on Ray Serve behind its HTTP proxy at ``host:port``; the
    deployment handle once every replica is up.

    - ``module_specs``: what ``loader`` (``"package.module:function"``) takes, one per module;
    - ``num_replicas``, or ``autoscaling`` (Ray Serve's ``autoscaling_config``: ``min_replicas``,
      ``max_replicas``, ``target_ongoing_requests`` ...) in its place;
    - ``ray_actor_options``: each replica's resources (``{"num_cpus": 1}``, ``{"num_gpus": 1}``);
    - ``hub_home``: the replicas' ``HUB_HOME``, where they find installed modules;
    - ``blocking``: return only at Ctrl-C (SIGINT). A command line needs it unless it deploys
      onto a cluster started apart (``ray start --head``): a local cluster that this call
      starts ends with this process.
    - ``create_app_kwargs``: :func:`~paddlejax.hub.serving.create_app`'s (batching, limits ...),
      applied in every replica.

    Connects to the Ray cluster of ``ray.init`` (``ray.init()``'s choice when not yet
    connected: ``RAY_ADDRESS``, a cluster running here, or a new local one). The deployment
    lives as long as that cluster; ``ray.serve.shutdown()`` removes it.

    >>> deploy_on_ray(["all_minilm_l6_v2"], num_replicas=2, port=8866)  # doctest: +SKIP
    """
    serve = require("ray.serve", extra="serve-ray", feature="paddlejax.hub.serving.deploy_on_ray")
    _import_loader(loader)  # a wrong path fails here, not in every replica
    options = dict(ray_actor_options or {})
    if hub_home is not None:
        runtime_env = dict(options.get("runtime_env") or {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), "HUB_HOME": str(hub_home)}
        options["runtime_env"] = runtime_env
    serve.start(http_options={"host": host, "port": port})
    scale = {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": num_replicas}
    deployment = serve.deployment(serve.ingress()(HubReplica), name="HubReplica", ray_actor_options=options,
                                  **scale)
    app = deployment.bind(list(module_specs), loader, create_app_kwargs)
    return serve.run(app, name=name, route_prefix=route_prefix, blocking=blocking)
