"""Hub modules: install, run, serve, publish and convert (``paddlejax hub COMMAND``).

    paddlejax hub install digits_cnn                 # built from shipped data the first time
    paddlejax hub install ./module.tar.gz --sha256 HEX
    paddlejax hub install all_minilm_l6_v2 --registry https://example.org/hub
    paddlejax hub run all_minilm_l6_v2 --input "A man is eating food."
    paddlejax hub serve -m all_minilm_l6_v2,digits_cnn --port 8866
    paddlejax hub publish ./my_module --registry ./registry
    paddlejax hub convert out/model --task image-classification --name my_cnn --image-size 32,32 -o my_cnn/
"""
from __future__ import annotations

import json
import sys

from paddlejax.table import format_table

COMMANDS = {
    "install": "install a module: NAME[RANGE] (registries, then built-in), a directory, an archive or an archive URL",
    "uninstall": "remove installed versions of a module",
    "list": "the installed modules and versions",
    "search": "modules (installed, in registries, built-in) whose name, summary or keywords match",
    "show": "a module's manifest, files and schema",
    "download": "fetch a module's archive from a registry without installing it",
    "run": "run a module on texts or images and print the results as JSON",
    "serve": "serve modules over HTTP (PaddleHub Serving's /predict/<module>)",
    "config": "show or change the hub's settings (home, registries)",
    "clear": "empty the download cache and work directory (--all: uninstall everything too)",
    "publish": "add a module directory to a static registry directory",
    "convert": "make a module from a saved program and a processor spec",
}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="hub_command", required=True)
    c = {name: sub.add_parser(name, help=text, description=text, formatter_class=p.formatter_class)
         for name, text in COMMANDS.items()}
    for name in ("install", "search", "download"):
        c[name].add_argument("--registry", action="append", help="registry URL or directory (repeatable; "
                                                                 "default: the configured ones)")
    for name in ("install", "publish"):
        c[name].add_argument("--force", action="store_true", help="replace a version that differs")
    for name in ("install", "download", "serve", "run"):
        c[name].add_argument("--no-progress", action="store_true", help="no progress bars")
    for name in ("install", "uninstall", "show", "download", "run"):
        c[name].add_argument("--version", help="version or range, e.g. 1.0 or '>=1,<2'")
    c["install"].add_argument("target")
    c["install"].add_argument("--sha256", help="expected sha256 of an archive file or URL")
    c["uninstall"].add_argument("name")
    c["search"].add_argument("words", nargs="*")
    c["show"].add_argument("name", help="an installed module, or a module directory")
    c["download"].add_argument("name")
    c["download"].add_argument("-o", "--output", default=".", help="directory for the archive (default .)")
    c["run"].add_argument("name")
    c["run"].add_argument("--input", action="append", required=True,
                          help="a text (text modules) or an image file (image modules); repeatable")
    c["run"].add_argument("--top-k", type=int, help="classes per result (classification)")
    s = c["serve"]
    s.add_argument("-m", "--modules", required=True, help="NAME[,NAME...] of installed modules (ranges allowed)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8866, help="port (default 8866)")
    s.add_argument("--no-batching", action="store_true", help="run each request alone (no dynamic batching)")
    s.add_argument("--max-wait-ms", type=float, default=5.0, help="longest wait to fill a batch (default 5)")
    s.add_argument("--max-batch-size", type=int, help="items per batch (default each module's)")
    s.add_argument("--max-body-bytes", type=int, help="largest request body")
    s.add_argument("--max-items", type=int, help="texts or images per request")
    s.add_argument("--timeout", type=float, help="seconds a request may take")
    s.add_argument("--max-concurrency", type=int, help="requests in flight at once")
    s.add_argument("--ray", action="store_true", help="deploy on Ray Serve (replicas from Ray) instead")
    s.add_argument("--replicas", type=int, default=2, help="Ray Serve replicas (with --ray; default 2)")
    c["config"].add_argument("key", nargs="?", help="home or registries")
    c["config"].add_argument("values", nargs="*", help="the new value (registries: one or more)")
    c["config"].add_argument("--unset", action="store_true", help="remove the setting")
    c["clear"].add_argument("--all", action="store_true", help="also uninstall every module")
    c["publish"].add_argument("directory")
    c["publish"].add_argument("--registry", required=True, help="registry directory (created if new)")
    c["publish"].add_argument("--format", choices=("tar.gz", "zip"), default="tar.gz")
    v = c["convert"]
    v.add_argument("program", help="saved program (PATH for PATH.json + PATH.safetensors)")
    v.add_argument("--task", required=True, help="text-embedding, text-classification, image-classification, ...")
    v.add_argument("--name", required=True)
    v.add_argument("--module-version", default="1.0.0")
    v.add_argument("--summary", default="")
    v.add_argument("--license", default="")
    v.add_argument("--labels", help="class names: a text file (one a line) or NAME,NAME,...")
    v.add_argument("--tokenizer", help="tokenizer.json (text modules)")
    v.add_argument("--max-length", type=int, default=512, help="tokens per text (default 512)")
    v.add_argument("--image-size", help="H,W of the program's images (image modules)")
    v.add_argument("--mode", choices=("L", "RGB"), default="RGB")
    v.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW")
    v.add_argument("--scale", type=float, default=1 / 255)
    v.add_argument("--mean", help="per-channel means, e.g. 0.485,0.456,0.406")
    v.add_argument("--std", help="per-channel standard deviations")
    v.add_argument("--activation", choices=("softmax", "sigmoid", "none"), default="softmax")
    v.add_argument("--threshold", type=float, help="multi-label: classes scoring at least this")
    v.add_argument("--normalize", action="store_true", help="embeddings: scale to unit length")
    v.add_argument("-o", "--output", required=True, help="the new module directory")


def _table(rows: list[dict], columns: list[str]) -> str:
    return format_table([columns] + [[str(r.get(c, "")) for c in columns] for r in rows]) if rows else "(none)"


def main(args) -> int:
    return globals()[f"_{args.hub_command}"](args) or 0


def _install(args):
    from paddlejax.hub.installer import install

    m = install(args.target, version=args.version, registries=args.registry, sha256=args.sha256, force=args.force,
                progress=not args.no_progress)
    print(f"installed {m.label} ({m.task})")


def _uninstall(args):
    from paddlejax.hub import store

    name, spec = store.split_requirement(args.name, args.version)
    for m in store.uninstall(name, spec):
        print(f"uninstalled {m.label}")


def _list(args):
    from paddlejax.hub import home, store

    rows = [{"name": m.name, "version": m.version, "task": m.task, "summary": m.summary} for m in store.installed()]
    print(f"HUB_HOME {home.hub_home()}")
    print(_table(rows, ["name", "version", "task", "summary"]))


def _search(args):
    from paddlejax.hub.installer import search

    print(_table(search(" ".join(args.words), args.registry), ["name", "version", "task", "source", "summary"]))


def _show(args):
    from pathlib import Path

    from paddlejax.hub import manifest, store

    if Path(args.name).is_dir():
        directory = Path(args.name)
    else:
        directory, _ = store.find(*store.split_requirement(args.name, args.version))
    m = manifest.read(directory)  # verifies every file: an error says which one is wrong
    print(json.dumps({"directory": str(directory), **m.to_json()}, indent=2))


def _download(args):
    from pathlib import Path

    from paddlejax.hub import home, registry, store

    name, spec = store.split_requirement(args.name, args.version)
    errors = []
    for location in args.registry or home.registries():
        try:
            version, release = registry.resolve(location, name, spec)
        except ValueError as e:
            errors.append(str(e))
            continue
        cached = registry.download(registry.archive_url(location, release), sha256=release["sha256"],
                                   size=release["size"], progress=not args.no_progress)
        out = Path(args.output) / Path(release["archive"]).name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(cached.read_bytes())
        print(f"{name} {version}: {out} (sha256 {release['sha256']})")
        return 0
    raise ValueError(f"no registry has {name}{spec}: {'; '.join(errors) or 'no registry configured'}")


def _run(args):
    from paddlejax.hub.module import Module

    module = Module(name=args.name, version=args.version, progress=not args.no_progress)
    if module.task == "text-embedding":
        results = module.embedding(args.input).tolist()
    else:
        results = module.predict(args.input, top_k=args.top_k)
    json.dump(results, sys.stdout, indent=None if module.task == "text-embedding" else 2)
    print()


def _serve(args):
    import dataclasses

    from paddlejax.hub.serving import Limits

    specs = [s.strip() for s in args.modules.split(",") if s.strip()]
    if not specs:
        raise ValueError("-m names no module")
    limits = {"max_body_bytes": args.max_body_bytes, "max_items": args.max_items,
              "request_timeout_s": args.timeout, "max_concurrency": args.max_concurrency}
    limits = dataclasses.replace(Limits(), **{k: v for k, v in limits.items() if v is not None})
    options = {"batching": not args.no_batching, "max_wait_ms": args.max_wait_ms,
               "max_batch_size": args.max_batch_size, "limits": limits}
    if args.ray:
        from paddlejax.hub.home import hub_home
        from paddlejax.hub.serving import deploy_on_ray

        print(f"serving {', '.join(specs)} on Ray Serve at http://{args.host}:{args.port} ({args.replicas} "
              f"replicas) until interrupted", file=sys.stderr)
        # blocking: a Ray cluster this command started ends with it
        deploy_on_ray(specs, num_replicas=args.replicas, host=args.host, port=args.port, hub_home=str(hub_home()),
                      blocking=True, **options)
        return 0
    from paddlejax.hub.module import Module
    from paddlejax.hub.serving import serve

    modules = {}
    for spec in specs:
        module = Module(name=spec, progress=not args.no_progress)  # installed first if missing
        modules[module.name] = module
        print(f"{module.label}: {module.predictor}", file=sys.stderr)  # compiled before traffic arrives
    serve(modules, host=args.host, port=args.port, **options)


def _config(args):
    from paddlejax.hub import home

    if args.key is None:
        print(json.dumps({"config_file": str(home.config_path()), "hub_home": str(home.hub_home()),
                          "registries": home.registries(), **home.settings()}, indent=2))
        return 0
    if args.unset:
        home.set_setting(args.key, None)
    elif not args.values:
        print(json.dumps(home.settings().get(args.key)))
        return 0
    elif args.key == "registries":
        home.set_setting("registries", list(args.values))
    else:
        if len(args.values) != 1:
            raise ValueError(f"hub config {args.key} takes one value")
        home.set_setting(args.key, args.values[0])
    print(f"{args.key}: {json.dumps(home.settings().get(args.key))} ({home.config_path()})")


def _clear(args):
    from paddlejax.hub import store

    for path in store.clear(modules=args.all):
        print(f"emptied {path}")


def _publish(args):
    from paddlejax.hub import manifest, registry

    m = manifest.read(args.directory)
    entry = registry.publish(args.directory, args.registry, format=args.format, force=args.force)
    print(f"published {m.label} to {args.registry}: {entry['archive']} ({entry['size']:,} bytes, "
          f"sha256 {entry['sha256']})")


def _numbers(text: str | None, option: str):
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{option} expects numbers separated by commas, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _convert(args):
    from pathlib import Path

    from paddlejax.hub.manifest import TASKS
    from paddlejax.hub.writer import write_module
    from paddlejax.io import load

    if args.task not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {args.task!r}")
    processor, files, program = {}, {}, None
    if args.task.startswith("text"):
        if not args.tokenizer:
            raise ValueError(f"--task {args.task} needs --tokenizer tokenizer.json")
        files["tokenizer.json"] = Path(args.tokenizer)
        program = load(args.program)
        names = [v.name for v in program.inputs]
        processor["text"] = {"tokenizer": "tokenizer.json", "max_length": args.max_length,
                             "inputs": [n for n in ("input_ids", "token_type_ids", "attention_mask") if n in names]
                             or ["input_ids", "token_type_ids", "attention_mask"][:len(names)]}
    else:
        if not args.image_size:
            raise ValueError(f"--task {args.task} needs --image-size H,W")
        size = [int(v) for v in args.image_size.split(",")]
        processor["image"] = {"size": size, "mode": args.mode, "layout": args.layout, "scale": args.scale,
                              **{k: v for k, v in (("mean", _numbers(args.mean, "--mean")),
                                                   ("std", _numbers(args.std, "--std"))) if v is not None}}
    if args.labels:
        if Path(args.labels).is_file():
            files["labels.txt"] = Path(args.labels)
            processor["labels"] = "labels.txt"
        else:
            processor["labels"] = [s.strip() for s in args.labels.split(",")]
    if args.task in ("text-embedding",):
        processor["postprocess"] = {"kind": "embedding", "normalize": args.normalize}
    else:
        post = {"kind": "classification", "activation": args.activation}
        if args.threshold is not None:
            post["threshold"] = args.threshold
        processor["postprocess"] = post
    m = write_module(args.output, programs={"model": program or load(args.program)}, files=files, name=args.name,
                     version=args.module_version, task=args.task, summary=args.summary, license=args.license,
                     processor=processor)
    from paddlejax.hub.module import Module

    Module(directory=args.output)  # the processor spec is checked against the program now, not at install
    print(f"wrote {m.label} ({m.task}) to {args.output}: {', '.join(sorted(m.files))}")
