"""Hub modules: install, run, serve, publish and convert (``paddlejax hub COMMAND``).

    paddlejax hub install digits_cnn                 # built from shipped data the first time
    paddlejax hub install ./module.tar.gz --sha256 HEX
    paddlejax hub install all_minilm_l6_v2 --registry https://example.org/hub
    paddlejax hub run all_minilm_l6_v2 --input "A man is eating food."
    paddlejax hub serve -m all_minilm_l6_v2,digits_cnn --port 8866
    paddlejax hub publish ./my_module --registry ./registry
    paddlejax hub convert out/model --task image-classification --name my_cnn --image-size 32,32 -o my_cnn/
    paddlejax hub convert resnet.onnx --task image-classification --labels labels.txt -o resnet/
    paddlejax hub convert rec.onnx --task text-recognition --input-shape x=?,3,48,320 -o my_rec/
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
    "convert": "make a module from an ONNX, Paddle (.pdmodel) or Keras (.h5) model or a saved program, with "
               "the task's processor",
}


CPU_DISPATCH = "sync"  # each call is waited for: run it on the calling thread (paddlejax.dispatch)


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
    v.add_argument("model", help="an ONNX file (.onnx), a Paddle model (.pdmodel beside its .pdiparams), a Keras "
                                 "file (.h5, .hdf5), or a saved program (PATH for "
                                 "PATH.json + PATH.safetensors)")
    v.add_argument("--task", required=True, help=", ".join(CONVERT_TASKS))
    v.add_argument("--name", help="module name (default: the model file's name)")
    v.add_argument("--module-version", default="1.0.0")
    v.add_argument("--summary", default="")
    v.add_argument("--license", default="")
    v.add_argument("--input-shape", action="append", metavar="[NAME=]DIMS",
                   help="fix an input's shape (ONNX and Keras models; '?' leaves a size open; the first, the batch, "
                        "always is); repeatable, one per input")
    v.add_argument("--labels", help="class names: a text file (one a line) or NAME,NAME,...")
    v.add_argument("--tokenizer", help="tokenizer.json (text modules)")
    v.add_argument("--max-length", type=int, default=512, help="tokens per text (default 512)")
    v.add_argument("--image-size", help="H,W of the program's images (default: its input's)")
    v.add_argument("--mode", choices=("L", "RGB", "BGR"),
                   help="colours the program takes (default: from its channels; BGR for text tasks)")
    v.add_argument("--layout", choices=("NCHW", "NHWC"), help="default: from the program's input")
    v.add_argument("--scale", type=float, default=1 / 255)
    v.add_argument("--mean", help="per-channel means, e.g. 0.485,0.456,0.406 (text tasks: 0.5)")
    v.add_argument("--std", help="per-channel standard deviations (text tasks: 0.5)")
    v.add_argument("--activation", choices=("softmax", "sigmoid", "none"),
                   help="on the outputs (default: none when the program ends in a softmax, else softmax)")
    v.add_argument("--threshold", type=float, help="multi-label: classes scoring at least this")
    v.add_argument("--normalize", action="store_true", help="embeddings: scale to unit length")
    v.add_argument("--dictionary", help="text-recognition: the characters, one a line (default: the ONNX model's "
                                        "'character' metadata, as PaddleOCR's exports carry it)")
    v.add_argument("-o", "--output", required=True, help="the new module directory")


# What `hub convert` makes: the manifest's tasks, and one-stage OCR modules.
CONVERT_TASKS = ("text-embedding", "text-classification", "text-multilabel", "image-classification",
                 "image-multilabel", "text-detection", "text-recognition")


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
    elif module.task == "ocr":
        results = module.recognize_text(args.input)
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
        module = Module(name=spec, progress=not args.no_progress).prepare()  # installed first if missing
        modules[module.name] = module
        print(f"{module.label}: {', '.join(f'{role} {p}' for role, p in module.predictors.items())}",
              file=sys.stderr)  # compiled before traffic arrives
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


def _shapes(specs: list[str] | None) -> dict:
    """``--input-shape`` values as ``{name or None: (None, d, ...)}``: the batch left open."""
    from paddlejax.cli.common import parse_input_shape

    shapes = {}
    for spec in specs or ():
        name, sizes = parse_input_shape(spec, name_required=False)
        if name in shapes:
            raise ValueError(f"--input-shape {spec!r}: each input given once")
        shapes[name] = (None, *sizes[1:])
    return shapes


IMPORTERS = {".onnx": "from_onnx", ".pdmodel": "from_paddle", ".h5": "from_keras", ".hdf5": "from_keras",
             ".keras": "from_keras"}


def _input_names(path: str, importer) -> list[str]:
    if path.lower().endswith(".onnx"):  # read without converting: ONNX graphs can be large
        import onnx

        graph = onnx.load(path, load_external_data=False).graph
        constants = {t.name for t in graph.initializer}
        return [i.name for i in graph.input if i.name not in constants]
    return [v.name for v in importer(path).inputs]


def _import_model(path: str, shapes: dict, name: str):
    """The program of an ONNX, Paddle (.pdmodel) or Keras file, or of a saved program."""
    from pathlib import Path

    import paddlejax as pj

    suffix = Path(path).suffix.lower()
    if suffix not in IMPORTERS:
        if shapes:
            raise ValueError("--input-shape is for imported models; a saved program's shapes are fixed")
        return pj.load(path)
    importer = getattr(pj.convert, IMPORTERS[suffix])
    if None in shapes:
        inputs = _input_names(path, importer)
        if len(inputs) != 1:
            raise ValueError(f"{path} has inputs {inputs}: name the one --input-shape is for (NAME=DIMS)")
        shapes = {inputs[0]: shapes.pop(None), **shapes}
    return importer(path, input_shapes=shapes or None, name=name)


def _image_layout(program, args) -> tuple[str, list[int], int]:
    """The layout, (height, width) and channels of an image program, from its input's shape
    where the options leave them out."""
    shape = program.inputs[0].type.shape if len(program.inputs) == 1 else ()
    if len(shape) != 4:
        raise ValueError(f"an image module's program takes one batch of images [b, C, H, W] or [b, H, W, C], "
                         f"got {', '.join(str(v.type) for v in program.inputs)}")
    layout = args.layout or ("NHWC" if shape[3] in (1, 3) and shape[1] not in (1, 3) else "NCHW")
    channels, *size = (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    if args.image_size:
        size = [int(v) for v in args.image_size.split(",")]
    if len(size) != 2 or not all(isinstance(d, int) for d in size):
        raise ValueError(f"the program's image size is open ({program.inputs[0].type}): give --image-size H,W "
                         f"or fix it with --input-shape")
    return layout, size, channels


def _convert(args):
    import re
    import shutil
    from pathlib import Path

    from paddlejax.hub.module import Module
    from paddlejax.hub.writer import write_module

    if args.task not in CONVERT_TASKS:
        raise ValueError(f"--task must be one of {', '.join(CONVERT_TASKS)}, got {args.task!r}"
                         + (" (an OCR module of several models is built in: ppocr_v4)" if args.task == "ocr" else ""))
    source = Path(args.model)
    if not (source.is_file() or Path(f"{source}.json").is_file()):
        raise ValueError(f"{args.model}: no such model file")
    name = args.name or re.sub(r"[^a-z0-9_.-]+", "_", source.stem.lower()).strip("_.-") or "model"
    program = _import_model(args.model, _shapes(args.input_shape), name)
    processor, files = {}, {}
    stage = {"text-detection": "det", "text-recognition": "rec"}.get(args.task)
    task = "ocr" if stage else args.task
    if task.startswith("text"):
        processor.update(_text_processor(args, program, files))
    elif task == "ocr":
        processor.update(_ocr_processor(args, program, files))
    else:
        processor.update(_image_processor(args, program, files))
    m = write_module(args.output, programs={stage or "model": program},
                     files=files, name=name, version=args.module_version, task=task, summary=args.summary,
                     license=args.license, processor=processor)
    try:
        Module(directory=args.output).check_programs()  # a mismatch is refused now, not on the first request
    except Exception:
        shutil.rmtree(args.output, ignore_errors=True)
        raise
    print(f"wrote {m.label} ({m.task}) to {args.output}: {', '.join(sorted(m.files))}")


def _text_processor(args, program, files) -> dict:
    from pathlib import Path

    if not args.tokenizer:
        raise ValueError(f"--task {args.task} needs --tokenizer tokenizer.json")
    files["tokenizer.json"] = Path(args.tokenizer)
    names = [v.name for v in program.inputs]
    text = {"tokenizer": "tokenizer.json", "max_length": args.max_length,
            "inputs": [n for n in ("input_ids", "token_type_ids", "attention_mask") if n in names]
            or ["input_ids", "token_type_ids", "attention_mask"][:len(names)]}
    post = {"kind": "embedding", "normalize": args.normalize} if args.task == "text-embedding" else \
        _classification(args, program)
    return {"text": text, **_labels(args, files), "postprocess": post}


def _image_processor(args, program, files) -> dict:
    layout, size, channels = _image_layout(program, args)
    image = {"size": size, "mode": args.mode or ("L" if channels == 1 else "RGB"), "layout": layout,
             "scale": args.scale, **{k: v for k, v in (("mean", _numbers(args.mean, "--mean")),
                                                       ("std", _numbers(args.std, "--std"))) if v is not None}}
    return {"image": image, **_labels(args, files), "postprocess": _classification(args, program)}


def _classification(args, program) -> dict:
    ends_in_softmax = bool(program.outputs) and getattr(program.outputs[0].producer, "type", None) == "softmax"
    post = {"kind": "classification", "activation": args.activation or ("none" if ends_in_softmax else "softmax")}
    if args.threshold is not None:
        post["threshold"] = args.threshold
    return post


def _labels(args, files) -> dict:
    from pathlib import Path

    if not args.labels:
        return {}
    if Path(args.labels).is_file():
        files["labels.txt"] = Path(args.labels)
        return {"labels": "labels.txt"}
    return {"labels": [s.strip() for s in args.labels.split(",")]}


def _ocr_processor(args, program, files) -> dict:
    """A one-stage OCR module: a text detector (DB) or a text line recogniser (CTC), with
    PaddleOCR's normalisation and RapidOCR's settings."""
    layout, (height, width), channels = _image_layout(program, args)
    if layout != "NCHW" or channels != 3:
        raise ValueError(f"--task {args.task} takes PaddleOCR's programs: 3-channel NCHW images, got "
                         f"{program.inputs[0].type}")
    image = {"mode": args.mode or "BGR", "scale": args.scale, "layout": "NCHW",
             "mean": _numbers(args.mean, "--mean") or [0.5] * 3, "std": _numbers(args.std, "--std") or [0.5] * 3}
    if args.task == "text-detection":
        # as PaddleOCR's own default: larger images shrunk to the program's size, smaller ones kept
        return {"image": image, "postprocess": {"kind": "ocr", "det": {
            "kind": "db_text_boxes", "programs": ["det"], "limit_type": "max", "limit_side_len": max(height, width)}}}
    characters = _dictionary(args)
    classes = program.outputs[0].type.shape[-1]
    if classes not in (len(characters) + 1, len(characters) + 2):
        raise ValueError(f"the dictionary has {len(characters)} characters but the recogniser gives {classes} classes "
                         f"(expected the characters, the CTC blank and maybe a space)")
    files["dictionary.txt"] = "\n".join(characters) + "\n"
    return {"image": image, "postprocess": {"kind": "ocr", "rec": {
        "kind": "ctc_decode", "programs": ["rec"], "dictionary": "dictionary.txt",
        "use_space_char": classes == len(characters) + 2, "blank": 0}}}


def _dictionary(args) -> list[str]:
    from pathlib import Path

    if args.dictionary:
        text = Path(args.dictionary).read_text(encoding="utf-8")
        return [line.rstrip("\r") for line in text.rstrip("\n").split("\n")]
    if Path(args.model).suffix.lower() == ".onnx":
        import onnx

        metadata = {p.key: p.value for p in onnx.load(args.model, load_external_data=False).metadata_props}
        if "character" in metadata:
            return metadata["character"].splitlines()
    raise ValueError("--task text-recognition needs --dictionary FILE (one character a line): the model carries none")
