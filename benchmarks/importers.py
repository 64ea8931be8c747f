"""Imported models beside the runtime they came from: PP-OCRv4 det and rec (the ONNX files
rapidocr-onnxruntime ships) through ``pj.convert.from_onnx`` and the Predictor (tuned, frozen),
against onnxruntime at the same thread count, and the PTQ int8 rec model's text.

Each configuration runs in a process of its own, pinned to the thread count's cores, and the
processes take turns block by block (as ``cpu_latency.py`` does): ``onnxruntime`` (all graph
optimisations, ``intra_op_num_threads`` = threads), ``Predictor`` (the imported program,
default pipeline, oneDNN kernels among the tuner's candidates) and, for rec, ``Predictor int8``
(``pj.slim.quant_post``, mse calibration on rendered random strings, not the measured lines; the
``KEEP_FLOAT`` most sensitive layers float). Inputs: det one image of
``--det-size`` (rendered text); rec a batch of ``--rec-batch`` text lines at 48x320, as
rapidocr runs them. Ratios over 1 mean ours is faster.

    python benchmarks/importers.py              # 1 and 2 threads, det and rec
    python benchmarks/importers.py --quick      # a smoke test
    python benchmarks/importers.py --ocr-int8   # the OCR module's text, fp32 vs int8 recogniser
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx"}
LINES = ["Hello paddlejax 2026", "Invoice No. 48213", "Total: 1,024.50 EUR", "OCR on XLA", "PP-OCRv4 rec",
         "Deliver by 12 May"]
# how the int8 recogniser is made (pj.slim.quant_post's options), for the benchmark and the OCR check:
# the KEEP_FLOAT layers whose quantization alone moves the output most stay float (10 of the 51
# layers keep the text of the OCR check's images; 7 lose the low-scored boxes of skimage's photo)
QUANT_OPTIONS: dict = {"algo": "mse"}
KEEP_FLOAT = 10


def model_path(key: str) -> str:
    root = importlib.util.find_spec("rapidocr_onnxruntime").submodule_search_locations[0]
    return os.path.join(root, "models", MODELS[key])


def rendered(text: str, height: int, width: int):
    """``text`` in Pillow's scalable font, black on white, cropped to the ink as a detector's box
    would be, resized to ``height`` keeping its aspect ratio (squeezed only if wider than
    ``width``) and padded on the right, as PP-OCR's rec pre-processing does; normalised NCHW RGB."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=36)
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("L", (right - left + 16, bottom - top + 16), 255)
    ImageDraw.Draw(image).text((8 - left, 8 - top), text, fill=0, font=font)
    resized_w = min(width, int(np.ceil(height * image.width / image.height)))
    gray = np.asarray(image.resize((resized_w, height), Image.BILINEAR), np.float32)
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = (gray[None] / 255.0 - 0.5) / 0.5
    return out


def page(text: str, height: int, width: int):
    """``text`` on a white page of ``height`` x ``width``, normalised NCHW RGB, for the detector."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (448, 96), 255)
    ImageDraw.Draw(image).text((16, 24), text, fill=0, font=ImageFont.load_default(size=36))
    gray = np.asarray(image.resize((width, height), Image.BILINEAR), np.float32)
    return (np.repeat(gray[None] / 255.0, 3, axis=0) - 0.5) / 0.5


def inputs(key: str, args: dict):
    import numpy as np

    if key == "det":
        h, w = args["det_size"]
        return np.stack([page(LINES[0], h, w)])
    return np.stack([rendered(LINES[i % len(LINES)], 48, 320) for i in range(args["rec_batch"])])


def ctc_text(probs, characters) -> list[str]:
    """Greedy CTC decoding: the argmax path with repeats merged and blanks (index 0) dropped."""
    out = []
    for row in probs.argmax(-1):
        chars, previous = [], 0
        for i in row:
            if i != previous and i != 0:
                chars.append(characters[i])
            previous = i
        out.append("".join(chars))
    return out


def characters(path: str) -> list[str]:
    import onnx

    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    return ["<blank>", *meta["character"].splitlines(), " "]


def calibration_lines(batches: int = 4, batch: int = 8, width: int = 320):
    """Random strings rendered as text lines: calibration data that is not the lines measured."""
    import numpy as np

    rng = np.random.default_rng(0)
    alphabet = list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,:-/")
    texts = ["".join(rng.choice(alphabet, rng.integers(4, 20))) for _ in range(batches * batch)]
    return [np.stack([rendered(t, 48, width) for t in texts[i:i + batch]]) for i in range(0, len(texts), batch)]


def worker(args: dict) -> None:
    sys.path.insert(0, str(HERE))
    from cpu_latency import pin, serve

    pin(args["threads"])
    os.environ["PADDLEJAX_AUTOTUNE_CACHE"] = os.path.join(tempfile.mkdtemp(), "autotune.json")
    import numpy as np

    key, config = args["model"], args["config"]
    path = model_path(key)
    x = inputs(key, args)
    info = {"name": config}
    if config == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = args["threads"]
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        call = lambda: session.run(None, {"x": x})[0]  # noqa: E731
        info["version"] = ort.__version__
    else:
        import paddlejax as pj
        from paddlejax.inference import Config, Predictor
        from timing import machine

        start = time.perf_counter()
        program = pj.convert.from_onnx(path, input_shapes={"x": (None, *x.shape[1:])})
        info["convert_s"] = time.perf_counter() - start
        if config == "Predictor int8":
            program = pj.slim.quant_post(program, calibration_lines(), keep_float=KEEP_FLOAT, progress=False,
                                         **QUANT_OPTIONS)
        start = time.perf_counter()
        call_predictor = Predictor(program, Config(max_batch_size=len(x), batch_buckets=(len(x),), progress=False))
        info["create_s"] = time.perf_counter() - start
        info["machine"] = machine()
        call = lambda: call_predictor(x)  # noqa: E731
    out = np.asarray(call())
    if key == "rec":
        info["text"] = ctc_text(out, characters(path))
    else:
        info["text_pixels"] = float((out > 0.3).mean())
    serve(info, call, args["block_seconds"])


def measure(key: str, threads: int, args) -> dict:
    from timing import StepWorker

    job = {"model": key, "threads": threads, "block_seconds": args.block_seconds, "det_size": args.det_size,
           "rec_batch": args.rec_batch}
    configs = ["onnxruntime", "Predictor", *(["Predictor int8"] if key == "rec" else [])]
    workers = []
    try:
        for config in configs:
            workers.append(StepWorker(sys.executable, [__file__, "--worker"], {**job, "config": config}, threads))
        infos = [json.loads(w.name) for w in workers]
        seconds = {info["name"]: [] for info in infos}
        for _ in range(args.rounds):
            for worker_, info in zip(workers, infos):
                time.sleep(0.2)
                seconds[info["name"]].append(worker_.step()[0])
    finally:
        for worker_ in workers:
            worker_.__exit__()
    return {"model": key, "threads": threads, "infos": {i["name"]: i for i in infos},
            "ms": {k: 1e3 * statistics.median(v) for k, v in seconds.items()}}


def ocr_int8_check() -> None:
    """The ``ppocr_v4`` hub module's text with its recogniser in fp32 and in PTQ int8 (mse
    calibration on random strings, the ``KEEP_FLOAT`` most sensitive layers float), on the rendered line of the tests, ``skimage.data.text()``
    and a rendered three-line page: the issue's "text unchanged on the test images"."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont
    from skimage import data

    import paddlejax as pj
    from paddlejax.slim.quant.sensitivity import keep_float_pattern

    module = pj.hub.Module(name="ppocr_v4")
    pipeline = module.ocr
    line = Image.new("L", (448, 96), 255)
    ImageDraw.Draw(line).text((16, 24), "Hello paddlejax 2026", fill=0, font=ImageFont.load_default(size=36))
    page = Image.new("L", (640, 224), 255)
    for i, text in enumerate(LINES[:3]):
        ImageDraw.Draw(page).text((24, 20 + 66 * i), text, fill=0, font=ImageFont.load_default(size=36))
    images = {"rendered line": np.asarray(line), "skimage text": data.text(), "rendered page": np.asarray(page)}
    pixels = dict(zip(images, module.image.pixels(list(images.values()))))
    fp32 = {name: [r["text"] for r in pipeline(p)] for name, p in pixels.items()}
    roles = {module.load_program(role).inputs[0].type.shape[3]: role for role in module.postprocess["rec"]["programs"]}
    # the widths' programs share their layers: rank them once, at the narrowest (320, the timed width),
    # where the calibration lines fill the input; at 1280 they are mostly padding and rank otherwise
    narrowest = min(roles)
    ranked = pj.slim.quant.quant_sensitivity(module.load_program(roles[narrowest]),
                                             calibration_lines(width=narrowest), progress=False, **QUANT_OPTIONS)
    skip = keep_float_pattern("", [s.layer for s in ranked[:KEEP_FLOAT]])
    for width, role in roles.items():
        pipeline.rec[width] = pj.slim.quant_post(module.load_program(role), calibration_lines(width=width),
                                                 skip=skip, progress=False, **QUANT_OPTIONS)
    int8 = {name: [r["text"] for r in pipeline(p)] for name, p in pixels.items()}
    print(f"\nppocr_v4 text, recogniser fp32 vs PTQ int8 ({QUANT_OPTIONS}, the {KEEP_FLOAT} most sensitive layers "
          f"float: {', '.join(s.layer for s in ranked[:KEEP_FLOAT])}):")
    for name in images:
        print(f"  {name}: fp32 {fp32[name]}; int8 {compare_text(int8[name], fp32[name])}")


def compare_text(got: list[str], want: list[str]) -> str:
    """How ``got`` reads against ``want``: the same, the same but for spaces at the ends of lines
    (CTC's space class at a line's edge), or ``got`` itself."""
    if got == want:
        return "the same"
    if [t.strip() for t in got] == [t.strip() for t in want]:
        return f"the same but for spaces at line ends: {got}"
    return str(got)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
        return 0
    sys.path.insert(0, str(HERE))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--models", default="det,rec")
    parser.add_argument("--det-size", default="320,448", help="det input height,width (multiples of 32)")
    parser.add_argument("--rec-batch", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="tiny: small det input, 2 rounds")
    parser.add_argument("--ocr-int8", action="store_true",
                        help="instead of timing: the ppocr_v4 module's text with an fp32 and an int8 recogniser")
    args = parser.parse_args(argv)
    if args.ocr_int8:
        ocr_int8_check()
        return 0
    args.det_size = [int(v) for v in args.det_size.split(",")]
    if args.quick:
        args.det_size, args.rec_batch, args.rounds, args.block_seconds = [64, 96], 2, 2, 0.05
    rows = [measure(key, int(t), args) for t in args.threads.split(",") for key in args.models.split(",")]
    print(f"\nPP-OCRv4 through pj.convert.from_onnx + Predictor vs onnxruntime "
          f"{rows[0]['infos']['onnxruntime']['version']}; det {args.det_size[0]}x{args.det_size[1]} batch 1, "
          f"rec 48x320 batch {args.rec_batch}; median ms of {args.rounds} rounds")
    machine = next(i["machine"] for r in rows for i in r["infos"].values() if "machine" in i)
    print(f"{machine}\n")
    print("| model | threads | onnxruntime | Predictor | ratio | Predictor int8 | ratio | convert s | create s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ms, ours = r["ms"], r["infos"]["Predictor"]
        int8 = ms.get("Predictor int8")
        int8_cells = f"{int8:.2f} | {ms['onnxruntime'] / int8:.2f}x" if int8 else "- | -"
        print(f"| {r['model']} | {r['threads']} | {ms['onnxruntime']:.2f} | {ms['Predictor']:.2f} | "
              f"{ms['onnxruntime'] / ms['Predictor']:.2f}x | {int8_cells} | "
              f"{ours['convert_s']:.1f} | {ours['create_s']:.1f} |")
    for r in rows:
        if r["model"] == "rec":
            texts = {name: info["text"] for name, info in r["infos"].items()}
            print(f"\nrec text ({r['threads']} threads): onnxruntime {texts['onnxruntime']}\n"
                  f"  Predictor {compare_text(texts['Predictor'], texts['onnxruntime'])}; "
                  f"Predictor int8 {compare_text(texts['Predictor int8'], texts['onnxruntime'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
