"""``pj.hub.Module``: an installed module, ready to run, serve or fine-tune.

Loading reads ``module.json``, checks every file's sha256, and builds the declarative
processor; it runs no code the module ships (``trust_code=True`` allows a module's own
``code`` file: a module is data someone else wrote, and importing its Python would run it
with your rights, which is why PaddleHub's habit of executing ``module.py`` on load is not
followed here). A module not installed yet is installed first: from the configured registries,
else built from the built-in recipes (:mod:`paddlejax.hub.builtin`).

>>> import paddlejax as pj
>>> digits = pj.hub.Module(name="digits_cnn", progress=False)    # doctest: +SKIP
>>> digits.classification([image])                                # doctest: +SKIP
[{'label': '7', 'score': 0.9981}]

Task methods follow PaddleHub's names: :meth:`embedding` (text embedding),
:meth:`predict` (whatever the task gives), :meth:`classification` (images) and
:meth:`recognize_text` (OCR); ``.program`` is the saved program and ``.predictor`` its
compiled :class:`~paddlejax.inference.Predictor`. With ``task=`` and ``num_classes=``
(``"seq-cls"``, ``"img-cls"``, ...) the module also gives ``.model``, a trainable layer —
its program under a fresh head — for :class:`paddlejax.hub.Trainer`.
"""
from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from paddlejax.hub import manifest, processor, store
from paddlejax.hub.errors import HubError, ModuleFormatError, ModuleNotFound, RequestError

# PaddleHub's fine-tuning task names, and ours, for the task a fine-tuned module has.
FINETUNE_TASKS = {"seq-cls": "text-classification", "text-classification": "text-classification",
                  "seq-multilabel": "text-multilabel", "text-multilabel": "text-multilabel",
                  "img-cls": "image-classification", "image-classification": "image-classification",
                  "img-multilabel": "image-multilabel", "image-multilabel": "image-multilabel"}
TEXT_TASKS = ("text-embedding", "text-classification", "text-multilabel")
IMAGE_TASKS = ("image-classification", "image-multilabel", "detection", "ocr")
# The largest batch size or sequence length a module may ask to compile.
MAX_SIZE = 1 << 16


def _default_lengths(max_length: int) -> tuple[int, ...]:
    return tuple(sorted({*(n for n in (16, 64) if n < max_length), max_length}))


class Module:
    """A hub module: ``Module(name="all_minilm_l6_v2")``, ``Module(name="digits_cnn",
    version=">=1,<2")``, or ``Module(directory=PATH)`` for one not installed.

    Args:
        name, version: the module and a version or range (``"1.2"``, ``">=1,<2"``; also written
            into the name, ``"digits_cnn==1.0"``); the newest match is loaded.
        directory: load this module directory instead (verified the same way).
        task, num_classes, label_list: fine-tuning (``"seq-cls"``, ``"seq-multilabel"``,
            ``"img-cls"``, ``"img-multilabel"``): ``.model`` is then the module's program
            under a fresh head of ``num_classes`` (or ``len(label_list)``) outputs.
        trust_code: allow the module's own Python file to run (see the module docstring).
        install: install a missing module (registries, then built-in recipes).
        progress: progress bars while installing or building.
        max_batch_size: the largest batch compiled for serving (default the module's).
    """

    def __init__(self, name: str | None = None, version: str | None = None, *, directory=None,
                 task: str | None = None, num_classes: int | None = None, label_list: Sequence[str] | None = None,
                 trust_code: bool = False, install: bool = True, progress: bool = True,
                 max_batch_size: int | None = None):
        if (name is None) == (directory is None):
            raise HubError("Module: give a name (an installed, registered or built-in module) or a directory")
        if directory is not None:
            self.directory = Path(directory)
            self.manifest = manifest.read(self.directory)
        else:
            module_name, spec = store.split_requirement(name, version)
            try:
                self.directory, self.manifest = store.find(module_name, spec)
            except ModuleNotFound:
                if not install:
                    raise
                from paddlejax.hub.installer import install as install_module

                install_module(module_name + spec, progress=progress)
                self.directory, self.manifest = store.find(module_name, spec)
            manifest.verify_files(self.directory, self.manifest)
        self._code = self._load_code(trust_code)
        spec = self.manifest.processor
        known = {"text", "image", "labels", "postprocess"}
        if not isinstance(spec, dict) or set(spec) - known:
            raise ModuleFormatError(f"{self.label}: processor keys {sorted(set(spec) - known)} are unknown; "
                                    f"known: {sorted(known)}")
        self.text = processor.TextProcessor(spec["text"], self.directory) if "text" in spec else None
        self.image = processor.ImageProcessor(spec["image"], require_size=self.task != "ocr") \
            if "image" in spec else None
        self.labels = processor.labels(spec.get("labels"), self.directory)
        self.postprocess = processor.check_postprocess(spec.get("postprocess", {"kind": "embedding"}))
        needs = "text" if self.task in TEXT_TASKS else "image"
        if getattr(self, needs) is None:
            raise ModuleFormatError(f"{self.label}: task {self.task} needs a processor.{needs} spec")
        if (self.task == "ocr") != (self.postprocess["kind"] == "ocr"):
            raise ModuleFormatError(f"{self.label}: task {self.task} cannot have {self.postprocess['kind']} "
                                    f"post-processing")
        if self.task == "ocr":
            self._check_ocr_roles()
        self._max_batch_size = max_batch_size
        self._loaded: dict = {}  # role -> program
        self._stage_predictors: dict = {}  # role -> Predictor, for modules that run several programs
        self.finetune = self._finetune_spec(task, num_classes, label_list)

    # -- what the module is ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def task(self) -> str:
        return self.manifest.task

    @property
    def label(self) -> str:
        return self.manifest.label

    def __repr__(self) -> str:
        return f"<Module {self.label} ({self.task}) at {self.directory}>"

    def info(self) -> dict:
        """A JSON-able description: name, version, task, summary, license, labels and schemas."""
        m = self.manifest
        return {"name": m.name, "version": m.version, "task": m.task, "summary": m.summary, "license": m.license,
                "author": m.author, "keywords": m.keywords, "labels": self.labels, "inputs": m.inputs,
                "outputs": m.outputs}

    def _load_code(self, trust_code: bool):
        if self.manifest.code is None:
            return None
        if not trust_code:
            raise HubError(f"{self.label} ships Python code ({self.manifest.code}), which would run with your rights; "
                           f"read it, then load the module with trust_code=True")
        spec = importlib.util.spec_from_file_location(f"paddlejax_hub_code_{self.name}",
                                                      self.directory / self.manifest.code)
        code = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(code)
        return code

    def _finetune_spec(self, task, num_classes, label_list):
        from paddlejax.hub.finetune import finetune_spec

        return finetune_spec(self, task, num_classes, label_list)

    @functools.cached_property
    def model(self):
        """The trainable layer for fine-tuning (``task=`` and ``num_classes=`` given): the
        module's program under a fresh classifier head (:mod:`paddlejax.hub.finetune`)."""
        if self.finetune is None:
            raise HubError(f"{self.label}: .model is for fine-tuning; load the module with task= and num_classes=")
        from paddlejax.hub.finetune import build_model

        return build_model(self, self.finetune)

    # -- programs and the predictor ----------------------------------------------------------------
    @functools.cached_property
    def programs(self) -> dict:
        """Every program of the module by role (``model``, ``features``, ...), loaded."""
        return {role: self.load_program(role) for role in self.manifest.programs}

    def load_program(self, role: str):
        """The program of ``role``, loaded (once)."""
        from paddlejax.io import load

        if role not in self.manifest.programs:
            raise ModuleFormatError(f"{self.label}: no program with the role {role!r}; its programs: "
                                    f"{', '.join(self.manifest.programs) or 'none'}")
        if role not in self._loaded:
            self._loaded[role] = load(self.directory / self.manifest.programs[role])
        return self._loaded[role]

    @property
    def program(self):
        """The program the task methods run (role ``model``)."""
        if "model" not in self.manifest.programs:
            raise ModuleFormatError(f"{self.label}: no program with the role 'model'"
                                    + ("; an OCR module runs its stages' programs (recognize_text)"
                                       if self.task == "ocr" else ""))
        return self.load_program("model")

    @functools.cached_property
    def predictor(self):
        """The program compiled for batches (and, for text, sequence lengths) up to the
        module's ``max_batch_size``; built on first use, then nothing compiles again."""
        from paddlejax.inference import Config, Predictor

        if self.task == "ocr":
            raise HubError(f"{self.label}: an OCR module runs one predictor per program; prepare() compiles them "
                           f"and recognize_text() runs them")
        options = self._check_against_program()
        max_batch = self._max_batch_size or options.get("max_batch_size", 32)
        buckets = options.get("batch_buckets")
        sizes = None
        if self.text is not None:
            lengths = {min(n, self.text.max_length) for n in options.get("length_buckets") or ()} \
                or _default_lengths(self.text.max_length)
            seq = [d for v in self.program.inputs for d in v.type.shape[1:] if isinstance(d, str)]
            sizes = {seq[0]: tuple(sorted(lengths))} if seq else None
        return Predictor(self.program, Config(max_batch_size=max_batch,
                                              batch_buckets=tuple(b for b in buckets if b <= max_batch)
                                              if buckets else None,
                                              size_buckets=sizes, progress=False))

    def _check_against_program(self) -> dict:
        """The manifest's predictor options, once the processor and the options are checked
        against the program: a module is data from elsewhere, and a mismatch would otherwise
        surface as a crash on the first request (or a huge compilation)."""
        options = dict(self.manifest.predictor)
        unknown = sorted(set(options) - {"max_batch_size", "batch_buckets", "length_buckets"})
        if unknown:
            raise ModuleFormatError(f"{self.label}: predictor keys {unknown} are unknown")
        sizes = [options.get("max_batch_size", 1), *(options.get("batch_buckets") or ()),
                 *(options.get("length_buckets") or ()), self.text.max_length if self.text else 1]
        if any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SIZE for n in sizes):
            raise ModuleFormatError(f"{self.label}: batch sizes and lengths must be ints in 1..{MAX_SIZE}")
        inputs = self.text.inputs if self.text is not None else ["image"]
        if len(inputs) != len(self.program.inputs):
            raise ModuleFormatError(f"{self.label}: the processor gives {len(inputs)} input(s) ({', '.join(inputs)}) "
                                    f"but the program takes {len(self.program.inputs)}")
        out = self.program.outputs[0].type.shape if self.program.outputs else ()
        if self.postprocess["kind"] == "classification" and self.labels is not None and \
                (len(out) != 2 or out[1] != len(self.labels)):
            raise ModuleFormatError(f"{self.label}: {len(self.labels)} labels but the program's output is "
                                    f"{self.program.outputs[0].type}")
        return options

    @property
    def max_batch_size(self) -> int:
        """The largest batch the predictor runs at once (bigger ones run in chunks)."""
        return self._max_batch_size or self.manifest.predictor.get("max_batch_size", 32)

    # -- running --------------------------------------------------------------------------------
    def _inputs(self, items: Sequence, allow_paths: bool = True, max_pixels: int = processor.MAX_IMAGE_PIXELS):
        if self._code is not None and hasattr(self._code, "preprocess"):
            return self._code.preprocess(self, items)
        if self.text is not None:
            arrays = self.text(items)
            return [arrays[name] for name in self.text.inputs]
        return [self.image(items, max_pixels=max_pixels, allow_paths=allow_paths)]

    def _outputs(self, outputs, top_k: int | None = None) -> list:
        if self._code is not None and hasattr(self._code, "postprocess"):
            return self._code.postprocess(self, outputs)
        first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        kind = self.postprocess["kind"]
        if kind == "embedding":
            return list(processor.embed(first, self.postprocess))
        if kind == "classification":
            return processor.classify(first, self.postprocess, self.labels, top_k)
        raise HubError(f"{self.label}: {kind} post-processing runs only in the task's own method")

    def _run(self, items: Sequence, top_k: int | None = None, **decode) -> list:
        if len(items) == 0:
            return []
        return self._outputs(self.predictor(*self._inputs(items, **decode)), top_k)

    def _texts(self, texts, method: str) -> list[str]:
        if self.text is None:
            raise HubError(f"{self.label} ({self.task}) takes images, not texts; {method} needs a text module")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
            raise RequestError(f"{method}: texts must be a string or a list of strings")
        return list(texts)

    def _images(self, images, method: str) -> list:
        if self.image is None:
            raise HubError(f"{self.label} ({self.task}) takes texts, not images; {method} needs an image module")
        if isinstance(images, (str, bytes, np.ndarray)) and not (isinstance(images, np.ndarray) and images.ndim == 4):
            images = [images]
        return list(images)

    def embedding(self, texts: str | Sequence[str]) -> np.ndarray:
        """float32 vectors ``[len(texts), dim]`` of a text-embedding module.

        >>> m = pj.hub.Module(name="all_minilm_l6_v2")                  # doctest: +SKIP
        >>> m.embedding(["A man is eating food."]).shape               # doctest: +SKIP
        (1, 384)
        """
        if self.task != "text-embedding":
            raise HubError(f"{self.label} is a {self.task} module; embedding() needs a text-embedding one")
        texts = self._texts(texts, "embedding")
        return np.stack(self._run(texts)) if texts else np.zeros((0, 0), np.float32)

    def predict(self, data, top_k: int | None = None) -> list:
        """What the task gives, one result per text or image: vectors (embedding), or
        ``{"label", "score"}`` (classification; a list of them for ``top_k`` > 1 or
        multi-label)."""
        if self.task in ("detection", "ocr"):
            raise HubError(f"{self.label}: use {'recognize_text' if self.task == 'ocr' else 'detect'}() "
                           f"for a {self.task} module")
        if self.text is not None:
            return self._run(self._texts(data, "predict"), top_k)
        return self._run(self._images(data, "predict"), top_k)

    def classification(self, images, top_k: int | None = None) -> list:
        """Classes of images (arrays ``[H, W(, C)]`` of uint8 or [0, 1] floats, encoded
        bytes, base64 text or file paths), as :meth:`predict` gives them."""
        if self.task not in ("image-classification", "image-multilabel"):
            raise HubError(f"{self.label} is a {self.task} module; classification() needs an image classifier")
        return self._run(self._images(images, "classification"), top_k)

    def recognize_text(self, images) -> list:
        """Per image, its lines of text in reading order: ``{"box": 4 x 2 corners (clockwise
        from the top left, in the image's pixels), "text": str, "score": float}`` (OCR
        modules). A module without a recogniser gives boxes and scores; one without a detector
        reads each image as one line.

        >>> ocr = pj.hub.Module(name="ppocr_v4")                        # doctest: +SKIP
        >>> ocr.recognize_text(["receipt.png"])[0][0]["text"]          # doctest: +SKIP
        'TOTAL 12.50'
        """
        if self.task != "ocr":
            raise HubError(f"{self.label} is a {self.task} module; recognize_text() needs an OCR module")
        return self._recognize(self._images(images, "recognize_text"))

    def _recognize(self, images: list, allow_paths: bool = True, max_pixels: int = processor.MAX_IMAGE_PIXELS):
        pixels = self.image.pixels(images, max_pixels=max_pixels, allow_paths=allow_paths)
        return [self.ocr(p) for p in pixels]

    def _ocr_roles(self) -> dict[str, list[str]]:
        """The programs of each OCR stage (``det``, ``cls``, ``rec``) by role."""
        spec = self.postprocess
        return {stage: [spec[stage]["program"]] if stage == "cls" else list(spec[stage]["programs"])
                for stage in ("det", "cls", "rec") if stage in spec}

    def _check_ocr_roles(self) -> None:
        missing = [r for roles in self._ocr_roles().values() for r in roles if r not in self.manifest.programs]
        if missing:
            raise ModuleFormatError(f"{self.label}: postprocess names programs {missing} that the module lacks "
                                    f"(it has {', '.join(self.manifest.programs) or 'none'})")
        if self.image.size is not None:
            raise ModuleFormatError(f"{self.label}: an OCR module's stages size its images; leave image.size out")

    @functools.cached_property
    def ocr(self):
        """The OCR pipeline (:class:`paddlejax.hub.ocr.OCRPipeline`) over this module's
        programs, checked against its spec; each program is compiled the first time an image
        needs it (or by :meth:`prepare`)."""
        from paddlejax.hub.ocr import OCRPipeline

        spec, roles = self.postprocess, self._ocr_roles()
        stages = {}
        if "det" in roles:
            for role in roles["det"]:
                out = self.load_program(role).outputs[0].type.shape
                if tuple(out[1:]) != (1, *self._image_size(role)):
                    raise ModuleFormatError(f"{self.label}: detector program {role!r} must give a text probability "
                                            f"map [b, 1, {', '.join(map(str, self._image_size(role)))}], gives "
                                            f"{self.load_program(role).outputs[0].type}")
            stages["det"] = {self._image_size(role): self._runner(role) for role in roles["det"]}
        if "cls" in roles:
            (role,) = roles["cls"]
            labels = spec["cls"].get("labels", ["0", "180"])
            if self._classes(role) != len(labels):
                raise ModuleFormatError(f"{self.label}: postprocess.cls has {len(labels)} labels but program "
                                        f"{role!r} gives {self._classes(role)} classes")
            stages["cls"] = (self._image_size(role), self._runner(role))
        characters, height = [], 0
        if "rec" in roles:
            characters = processor.ocr_classes(spec["rec"], self.directory)
            for role in roles["rec"]:
                if self._classes(role) != len(characters):
                    raise ModuleFormatError(f"{self.label}: the dictionary, the space and the blank make "
                                            f"{len(characters)} classes but program {role!r} gives "
                                            f"{self._classes(role)}")
            heights = {self._image_size(role)[0] for role in roles["rec"]}
            if len(heights) > 1:
                raise ModuleFormatError(f"{self.label}: the recogniser's programs take lines of different heights "
                                        f"{sorted(heights)}")
            (height,) = heights
            stages["rec"] = {self._image_size(role)[1]: self._runner(role) for role in roles["rec"]}
        return OCRPipeline(spec, self.image.normalize, characters=characters, rec_height=height, **stages)

    def _image_size(self, role: str) -> tuple[int, int]:
        """The fixed (height, width) of an OCR program's image batch ``[b, 3, H, W]``."""
        program = self.load_program(role)
        shape = program.inputs[0].type.shape if len(program.inputs) == 1 else ()
        if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]) or shape[1] != 3:
            raise ModuleFormatError(f"{self.label}: OCR program {role!r} must take one image batch [b, 3, H, W] of "
                                    f"fixed H and W, got {', '.join(str(v.type) for v in program.inputs) or 'none'}")
        return shape[2], shape[3]

    def _classes(self, role: str) -> int:
        """The classes a classifier (``[b, classes]``) or recogniser (``[b, steps, classes]``) gives."""
        out = self.load_program(role).outputs[0].type.shape
        stage = "cls" if role in self._ocr_roles().get("cls", ()) else "rec"
        if len(out) != (2 if stage == "cls" else 3) or not isinstance(out[-1], int):
            raise ModuleFormatError(f"{self.label}: {'classifier' if stage == 'cls' else 'recogniser'} program "
                                    f"{role!r} must give {'[b, classes]' if stage == 'cls' else '[b, steps, classes]'}"
                                    f", gives {self.load_program(role).outputs[0].type}")
        return out[-1]

    def _runner(self, role: str):
        def run(batch):
            return self._stage_predictor(role)(batch)

        return run

    def _stage_predictor(self, role: str):
        from paddlejax.inference import Config, Predictor

        if role not in self._stage_predictors:
            stage = next(stage for stage, roles in self._ocr_roles().items() if role in roles)
            # the detector takes one image at a time (each has its own size); lines come in
            # batches of batch_size and a last, smaller one: padding that one costs less than
            # compiling every power of two up to batch_size
            size = 1 if stage == "det" else self.postprocess[stage].get("batch_size", 6)
            self._stage_predictors[role] = Predictor(self.load_program(role), Config(
                max_batch_size=size, batch_buckets=(1, size), progress=False))
        return self._stage_predictors[role]

    @property
    def predictors(self) -> dict:
        """The compiled predictors by program role: ``{"model": predictor}``, or those of an
        OCR module's programs compiled so far."""
        return dict(self._stage_predictors) if self.task == "ocr" else {"model": self.predictor}

    def check_programs(self) -> "Module":
        """Check the processor against the programs (inputs, sizes, classes, the dictionary)
        without compiling anything; a :class:`ModuleFormatError` names a mismatch. Returns the
        module."""
        if self.task == "ocr":
            self.ocr  # noqa: B018 - built from the programs, checking them
        else:
            self._check_against_program()
        return self

    def prepare(self) -> "Module":
        """Compile what the task methods run, so that no request waits for a compilation: the
        predictor, or each program of an OCR module. Returns the module.

        >>> pj.hub.Module(name="ppocr_v4").prepare()                    # doctest: +SKIP
        <Module ppocr_v4 1.0.0 (ocr) at ...>
        """
        if self.task != "ocr":
            self.predictor  # noqa: B018 - built on first use
            return self
        self.ocr  # noqa: B018 - checks the programs against the spec
        for roles in self._ocr_roles().values():
            for role in roles:
                self._stage_predictor(role)
        return self

    # -- serving (paddlejax.hub.serving) ------------------------------------------------------------
    def parse_request(self, payload: dict, limits) -> list:
        """The items of a request body (``{"texts": [...]}`` or ``{"images": [base64, ...]}``,
        PaddleHub Serving's shapes), checked against the server's ``limits``."""
        key = "texts" if self.text is not None else "images"
        if not isinstance(payload, dict) or key not in payload:
            raise RequestError(f"{self.name} expects a JSON object with \"{key}\": a list of "
                               f"{'strings' if key == 'texts' else 'base64-encoded images'}")
        items = payload[key]
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise RequestError(f"\"{key}\" must be a list of strings")
        if not items:
            raise RequestError(f"\"{key}\" is empty")
        if len(items) > limits.max_items:
            raise RequestError(f"{len(items)} {key} in one request; the limit is {limits.max_items}", 413)
        if key == "texts":
            long = next((i for i, t in enumerate(items) if len(t) > limits.max_text_chars), None)
            if long is not None:
                raise RequestError(f"text {long} has {len(items[long]):,} characters; the limit is "
                                   f"{limits.max_text_chars:,}", 413)
            return items
        max_b64 = 4 * (limits.max_image_bytes // 3 + 1) + 64
        big = next((i for i, t in enumerate(items) if len(t) > max_b64), None)
        if big is not None:
            raise RequestError(f"image {big} is over the limit of {limits.max_image_bytes:,} bytes", 413)
        decoded = []
        for i, item in enumerate(items):
            try:
                decoded.append(processor.decode_image(item, limits.max_image_pixels))
            except RequestError as e:
                raise RequestError(f"image {i}: {e}", e.status) from None
        return decoded

    def run_batch(self, items: list) -> list:
        """JSON-able results of the items of several requests run as one batch."""
        if self.task == "ocr":
            return self._recognize(items, allow_paths=False)
        results = self._run(items, allow_paths=False) if self.image is not None else self._run(items)
        return [r.tolist() if isinstance(r, np.ndarray) else r for r in results]


def load_servable(spec: str) -> Module:
    """The installed module ``spec`` (``"name"`` or ``"name>=1,<2"``), its predictor built:
    what each server replica loads.

    >>> load_servable("digits_cnn").max_batch_size                  # doctest: +SKIP
    32
    """
    return Module(name=spec, install=False).prepare()  # compile every bucket before traffic arrives
