"""Smoke tests: the benchmarks run end to end at tiny sizes and print their tables (no timing assertions)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each runs a benchmark script end to end (20-90 s)

ROOT = Path(__file__).resolve().parents[1]
CASES = ["resnet/infer", "resnet/train", "transformer/infer", "transformer/train"]


def run_quick(script: str, *args: str, timeout: int) -> str:
    """``benchmarks/<script> --quick [args]``'s output, asserting it exits cleanly."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_overhead_quick():
    out = run_quick("overhead.py", timeout=240)
    for case in CASES:
        c = re.escape(case)
        assert re.search(rf"^{c}\s+step \(ms\)\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+", out, re.M), out
        assert re.search(rf"^{c}\s+compile \(s\)\s+\d+\.\d+\s+\d+\.\d+", out, re.M), out
        assert re.search(rf"^{c}\s+HLO instructions\s+\d+\s+\d+", out, re.M), out
    assert re.search(r"pj\.trace of a \d+-layer MLP", out), out
    assert re.search(r"^Predictor call on a NumPy batch \(SmallCNN, batch 32\): \d+\.\d{3} ms; its executable "
                     r"\d+\.\d{3} ms; ratio \d\.\d{3}$", out, re.M), out
    verdicts = re.findall(r"^(PASS|FAIL)  ", out, re.M)
    assert len(verdicts) == 4, out


def test_train_step_quick():
    out = run_quick("train_step.py", timeout=300)
    assert re.search(r"ratio Trainer / nnx\.jit = \d+\.\d+", out), out
    assert re.search(r"ratio paddlejax\.nn / flax\.nnx = \d+\.\d+", out), out
    for run in ("Trainer fp32", "Trainer bf16", "Flax \\+ jax\\.jit"):
        assert re.search(rf"^   {run}\s+\d+\s+\d+\s+\d+\.\d+\s+\d+\.\d+$", out, re.M), out


def test_models_quick():
    out = run_quick("models.py", timeout=400)
    assert re.search(r"^dense matmul rate measured here: \d+ GFLOP/s", out, re.M), out
    for model, unit in (("ResNet-18", "images/s"), ("MobileNetV2", "images/s"), ("BERT \\(tiny\\)", "tokens/s")):
        for phase, impl in (("forward", "jax.jit"), ("forward", "program"), ("train", "Trainer"), ("train", "jax.jit")):
            assert re.search(rf"^{model}\s+{phase}\s+{re.escape(impl)}\s+\d+\.\d\s+\d+\.\d\s+{unit}\s+\d+\.\d\d", out,
                             re.M), (model, phase, impl, out)
        assert re.search(rf"^{model}: ratio program / jax\.jit = \d\.\d+ \(forward\), Trainer / jax\.jit = \d\.\d+",
                         out, re.M), out


def test_passes_quick():
    out = run_quick("passes.py", "--models", "SmallCNN", timeout=300)  # the other models take minutes to tune
    for model in ("SmallCNN",):
        table = out.split(f"\n{model}\n")[1].split("\n\n")[0]
        rows = re.findall(r"^  (\S.*?)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)x\s+(\S+)$", table, re.M)
        assert [r[0] for r in rows] == ["as traced", "cleanup", "+ fold_conv_bn, fold_linear_bn",
                                        "+ fuse_bias_act, fuse_elementwise_act", "+ autotune, per-op kernels only",
                                        "+ autotune, whole-program plans", "fused, frozen params",
                                        "+ autotune for frozen params", "+ bf16 convs allowed (opt-in)",
                                        "the model built in NHWC, frozen, tuned"], table
        ops = [int(r[1]) for r in rows]
        assert ops[2] < ops[1] and ops[3] < ops[2], table          # folding and fusing remove ops
        errors = {r[0]: float(r[4]) for r in rows}
        assert errors.pop("+ bf16 convs allowed (opt-in)") < 5e-2, table
        assert all(e < 1e-4 for e in errors.values()), table       # every float32 variant computes the same
        assert len(re.findall(r"^  autotune ratio \(.*\): \d+\.\d\d$", table, re.M)) == 2, table


def test_conv_variants_quick():
    out = run_quick("conv_variants.py", timeout=120)
    rows = re.findall(r"^(\d+ch \d+x\d+)\s+(NHWC|NCHW)\s+(const|arg)\s+((?:\d+\.\d\d\s+){6})(\S+)\s+(\d+\.\d\d)x", out,
                      re.M)
    assert rows and {r[1] for r in rows} == {"NHWC", "NCHW"} and {r[2] for r in rows} == {"const", "arg"}, out


def test_memory_quick():
    out = run_quick("memory.py", timeout=120)
    for model in ("SmallCNN", "ResNet-18", "MobileNetV2"):
        assert re.search(rf"^  {model}\s+(\d+\.\d\d\s+){{6}}\d+\.\d\d$", out, re.M), out
    rows = re.findall(r"^  (without remat|remat, B = .*?)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+\d+\.\d\s+(\S+)$",
                      out, re.M)
    assert [r[0].split(" (")[0] for r in rows] == ["without remat", "remat, B = 50% of estimate",
                                                   "remat, B = 50% of XLA's"], out
    # half the planner's estimate lowers XLA's temp bytes (half of XLA's may already fit at quick sizes)
    assert float(rows[1][3]) < 1 and float(rows[2][3]) <= 1, out
    assert all(float(r[4]) == 0 for r in rows), out           # and changes neither loss nor gradients


def test_quant_quick():
    out = run_quick("quant.py", timeout=120)
    rows = re.findall(r"^  (Transformer encoder|SmallCNN|digits CNN)\s+(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+(\d+\.\d\d)x"
                      r"\s+(\d+\.\d\d)x\s+(\S+)$", out, re.M)
    assert [r[0] for r in rows] == ["Transformer encoder", "SmallCNN", "digits CNN"], out
    assert all(int(r[1]) > 0 and float(r[5]) > 2.5 and float(r[6]) < 0.1 for r in rows), out  # quantized, smaller, close


def test_distributed_scale_quick():
    out = run_quick("distributed_scale.py", timeout=180)
    rows = dict(re.findall(r"^(data parallel \(dp=8\)|tensor parallel 8)\s+\d+\.\d\d\s+(\d\.\d\d)x", out, re.M))
    assert rows.keys() == {"data parallel (dp=8)", "tensor parallel 8"}, out
    # tensor parallel splits the encoder's matrices over the 8 devices: each holds less
    assert float(rows["tensor parallel 8"]) < 1.0 == float(rows["data parallel (dp=8)"]), out
    ctr = dict((name, (float(table), auc)) for name, table, auc in re.findall(
        r"^(one device|split over 8 devices)\s+(\d+\.\d\d)\s+\d+\.\d\d\s+\S+(?: / \S+)?\s+\S+(?: / \S+)?\s+"
        r"(\d\.\d{4})", out, re.M))
    assert ctr.keys() == {"one device", "split over 8 devices"}, out
    # an eighth of the tables on each device, trained to the same held-out AUC
    assert ctr["split over 8 devices"][0] < ctr["one device"][0] / 7, out
    assert ctr["split over 8 devices"][1] == ctr["one device"][1], out
    streamed = re.search(r"^streamed, budget 1/2\s+(\d+)\s+\d+\.\d\d\s+(\d\.\d\d)x", out, re.M)
    assert streamed and int(streamed[1]) > 2 and float(streamed[2]) <= 0.5, out
    kept = {name: (float(device), float(host), loss) for name, device, host, loss in re.findall(
        r"^(no recompute|recompute|recompute, activations offloaded)\s+(\d+\.\d\d)\s+\d\.\d\dx\s+(\d+\.\d\d)\s+"
        r"\d+\.\d\d\s+(\d\.\d{4})$", out, re.M)}
    assert list(kept) == ["no recompute", "recompute", "recompute, activations offloaded"], out
    # offloading moves kept activations off the device, recompute changes no number
    assert kept["recompute, activations offloaded"][0] < kept["recompute"][0] < kept["no recompute"][0], out
    assert kept["recompute, activations offloaded"][1] > 0 == kept["recompute"][1], out
    assert len({k[2] for k in kept.values()}) == 1, out


def test_yolo_quick(tmp_path):
    out = run_quick("yolo.py", "--out", str(tmp_path), timeout=300)
    row = re.search(r"^tiny x0\.5\s+(\d+)\s+\d+\.\d min\s+(\d\.\d{3})\s+(\d\.\d{3})(\s+\d\.\d{3}){3}$", out, re.M)
    assert row and int(row[1]) == 2, out  # 64 images in batches of 32: two steps
    assert (tmp_path / "detections.png").stat().st_size > 10_000


def test_distributed_quick():
    out = run_quick("distributed.py", timeout=120)
    fusion = dict(re.findall(r"^  (one per gradient \(no fusion\)|fused, buckets of 32 MB)\s+(\d+)\s", out, re.M))
    # 16 gradients and the loss: 17 all-reduces in the program, 2 with one 32 MB bucket
    assert fusion == {"one per gradient (no fusion)": "17", "fused, buckets of 32 MB": "2"}, out
    bubbles = re.findall(r"^  (gpipe|1f1b)\s+4\s+14\s+0\.429  ((?:0\.429 ?){4})\s+\d+\.\d\d\s+\d+\.\d\d\s+\d+\.\d\d$",
                         out, re.M)
    assert [b[0] for b in bubbles] == ["gpipe", "1f1b"], out
    assert [int(n) for n in re.findall(r"^\s+(\d)\s+\d+\.\d\d\s+\d+\.\d\dx$", out, re.M)] == [1, 2, 4, 8], out
    zero = re.findall(r"^\s+(\d)\s+\d+\.\d\d\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+/\d+/\d+)$", out, re.M)
    assert [z[0] for z in zero] == ["0", "1", "2", "3"], out
    opt = [float(z[1]) for z in zero]
    assert opt[1] == opt[2] == opt[3] < opt[0] / 7, out          # ZeRO >= 1: an eighth of the state each
    assert float(zero[3][2]) < float(zero[2][2]) / 7, out        # ZeRO-3: an eighth of the parameters
    assert [z[3] for z in zero][2:] == ["1/16/1", "1/16/1"], out   # a reduce-scatter per parameter, one gather
    merge = dict(re.findall(r"^  (ZeRO-0, k_steps=\d)\s+\S+\s+\S+\s+(\d+\.\d+)\s", out, re.M))
    assert float(merge["ZeRO-0, k_steps=4"]) < float(merge["ZeRO-0, k_steps=1"]) / 3, out  # gradients once per k


def test_serving_quick():
    out = run_quick("serving.py", "--fake", timeout=120)
    rows = re.findall(r"^(batching|no batching)\s+(\d+)\s+\d+\.\d\s+\d+\.\d\s+\d+\.\d\s+(\d+)\s+\d+\.\d\d", out, re.M)
    assert [r[0] for r in rows] == ["batching", "no batching"] and all(r[2] == "0" for r in rows), out
    assert re.search(r"^ratio batching / no batching = \d+\.\d\d", out, re.M), out
    assert re.search(r"^answered 4xx: (\d+) of \1; not 4xx: 0$", out, re.M), out
    assert "then a correct request: 200" in out


def test_hub_finetune_quick():
    out = run_quick("hub_finetune.py", "--no-progress", timeout=300)
    assert re.search(r"minilm_bbc_news 1\.0\.0: 1 epoch\(s\), 16 word pieces", out), out
    assert re.search(r"installed module on 32 held-out articles: accuracy \d+\.\d\d%; served labels match", out), out


def test_slim_quick():
    out = run_quick("slim.py", timeout=300)
    rows = re.findall(r"^(unpruned|l1_norm|bn_scale|l1_norm/8|by hand|auto-pruner|auto-pruner/1\.1x)\s+([\d,]+)\s+"
                      r"([\d,]+)\s+(\d+\.\d\d)%\s+(\d+\.\d+)\s+(\d+\.\d\d)x\s+(\d+\.\d)  (\d+/\d+/\d+)$", out, re.M)
    assert [r[0] for r in rows] == ["unpruned", "l1_norm", "bn_scale", "l1_norm/8", "by hand", "auto-pruner",
                                    "auto-pruner/1.1x"], out
    assert all(int(w) % 8 == 0 for w in rows[3][7].split("/") + rows[6][7].split("/")), out  # round_to=8
    assert rows[4][7] == "32/32/120", out
    assert re.search(r"^auto-pruner/1\.1x ratios: .*measured speed-up in the search \d+\.\d\dx\)$", out, re.M), out
    base_flops = int(rows[0][1].replace(",", ""))
    assert all(int(r[1].replace(",", "")) <= 0.5 * base_flops for r in rows[1:]), out  # the FLOPs target holds
    assert all(float(r[6]) < float(rows[0][6]) for r in rows[1:]), out  # and the saved weights are smaller
    assert re.search(r"^ResNet-18 \(32x32\), -50% FLOPs by l1_norm: FLOPs 74,386,432 -> \d", out, re.M), out
    mobile = re.findall(r"^(unpruned|uniform|sensitive)\s+([\d,]+)\s+(\d+\.\d\d)%\s+(\d+\.\d\d)$", out, re.M)
    assert [(m[0], m[3]) for m in mobile] == [("unpruned", "70.91"), ("uniform", "69.83"), ("sensitive", "69.31")], out
    flops = [int(m[1].replace(",", "")) for m in mobile]
    assert all(0.4 * flops[0] <= f <= 0.5 * flops[0] for f in flops[1:]), out  # -50 %, not overshot


def test_sparsity_quick():
    out = run_quick("sparsity.py", timeout=300)
    threads = [float(r) for r in re.findall(r"^threads: .*CPU time / wall time of a jitted matmul loop: (\d+\.\d\d)$",
                                            out, re.M)]
    assert len(threads) == 2 and threads[1] <= 1.05, out  # the single-thread run really ran on one CPU
    rows = re.findall(r"^(linear 1024x1024, batch (?:1|32)|MLP 784-1024-1024-10, batch 32|DigitsCNN, batch 32)\s+"
                      r"(Predictor \(frozen\)|jax\.jit|outside XLA)\s+(\S+(?: \S+)?)\s+\d+\.\d{3}\s+(\d+\.\d\d)x$",
                      out, re.M)
    variants = {(r[0], r[1], r[2]) for r in rows}
    assert len(rows) == 2 * len(variants) == 2 * 27, out  # every case at both thread counts
    assert ("DigitsCNN, batch 32", "Predictor (frozen)", "2:4") in variants, out
    assert ("MLP 784-1024-1024-10, batch 32", "jax.jit", "75% BCOO") in variants, out
    assert all(float(r[3]) == 1.0 for r in rows if r[2] in ("dense", "dense BLAS")), out
    sizes = re.findall(r"^(DigitsCNN|MLP)\s+(75%|2:4)\s+\d+\.\d\s+\d+\.\d\s+(\d\.\d\d)$", out, re.M)
    assert [(m, w) for m, w, _ in sizes] == [("DigitsCNN", "75%"), ("DigitsCNN", "2:4"), ("MLP", "75%"), ("MLP", "2:4")]
    assert all(float(r) < (0.30 if w == "75%" else 0.55) for _, w, r in sizes), out
    accuracy = re.findall(r"^(dense|75%|2:4)\s+(\d\.\d{3})\s+(\d+\.\d\d)%(?:\s+(\d+\.\d\d)%\s+(yes|NO))?$", out, re.M)
    assert [a[0] for a in accuracy] == ["dense", "75%", "2:4"] and all(a[4] == "yes" for a in accuracy[1:]), out


def test_nas_quick(tmp_path):
    out = run_quick("nas.py", "--latency-cache", str(tmp_path / "latency.json"), "--out", str(tmp_path),
                    timeout=300)
    for limit in ("flops", "latency"):
        search = out.split(f"SANAS under {limit} <= ")[1].split("reward plot:")[0]
        bound = float(search.split(" ")[0].replace(",", ""))
        steps = re.findall(r"^\s+(\d+)  (\[[\d, ]+\])\s+([\d,]+)\s+(\d+\.\d+)\s+(\d\.\d{4})  (yes|no)\s+(\d\.\d{4})$",
                           search, re.M)
        assert [int(s[0]) for s in steps] == [1, 2], out
        column = 2 if limit == "flops" else 3
        assert all(float(s[column].replace(",", "")) <= bound for s in steps), out  # every candidate within the limit
        assert (tmp_path / f"nas_{limit}_rewards.png").stat().st_size > 1000
    best = re.findall(r"^(flops|latency)\s+\[[\d, ]+\]\s+[\d,]+\s+\S+\s+\d+\.\d+\s+\S+\s+(\d+\.\d\d)%$", out, re.M)
    assert [b[0] for b in best] == ["flops", "latency"], out
    errors = re.findall(r"^\[[\d, ]+\]\s+(\d+\.\d+)\s+(\d+\.\d+)\s+[+-]\d+\.\d%$", out, re.M)
    assert len(errors) == 3 and all(float(p) > 0 and float(m) > 0 for p, m in errors), out
    assert re.search(r"^mean absolute error of the prediction: \d+\.\d%$", out, re.M), out


def test_auto_compress_quick(tmp_path):
    out = run_quick("auto_compress.py", "--plot", str(tmp_path / "act.png"), timeout=300)
    rows = re.findall(r"^(original|ptq|prune_distill)\s+(\d+\.\d{3})\s+(\d+\.\d\d)x\s+(\d+\.\d{4})\s+(\d+\.\d\d)%\s+"
                      r"(\d+\.\d)(  <- chosen)?$", out, re.M)
    assert [r[0] for r in rows] == ["original", "ptq", "prune_distill"], out
    assert float(rows[0][2]) == 1.0 and float(rows[0][3]) == 0.0 and float(rows[1][3]) < 0.1, out
    assert sum(bool(r[6]) for r in rows) == 1, out  # one candidate chosen
    assert re.search(r"^target: 1\.50x speed-up, (met|not met by any candidate: the original is kept)$", out, re.M), out
    accuracy = re.findall(r"^  (original|ptq|prune_distill)\s+(\d+\.\d\d)%  \(([+-]\d+\.\d\d) points\)", out, re.M)
    assert [a[0] for a in accuracy] == ["original", "ptq", "prune_distill"] and accuracy[0][2] == "+0.00", out
    assert (tmp_path / "act.png").read_bytes()[:4] == b"\x89PNG"


def test_distill_quick():
    out = run_quick("distill.py", "--labels", "16", timeout=300)
    assert "16 labelled articles: the student alone trains 4 epochs on them; the distilled one 1 epochs on all 64" \
        in out, out
    results = dict(re.findall(r"^  (teacher|student alone|student distilled)\s+(\d+\.\d\d)%$", out, re.M))
    assert list(results) == ["teacher", "student alone", "student distilled"] and float(results["teacher"]) == 100.0
    assert re.search(r"^distillation: [+-]\d+\.\d\d points over the student alone \(T=2\)$", out, re.M), out


def test_gpu_campaign_quick_prints_every_section_and_marks_what_needs_a_gpu():
    out = run_quick("gpu_campaign.py", timeout=300)
    table = out[out.index("| section | run |"):]
    number = r"\d[\d,]*\.?\d*(e[-+]\d+)?"
    for run in ("bf16 x bf16 -> bf16", "int8 x int8 -> int32 \\(lax\\.dot\\)", "quantized_linear op \\(int8\\)",
                "fp8_linear op \\(bf16 in and out\\)"):
        assert re.search(rf"^\| GEMM 256\^3 \| {run} \| {number} \| T(FL)?OP/s \| \d\.\d\dx bf16 \| .*rel\. error", table,
                         re.M), (run, table)
    for impl in ("None", "xla", "None, padding mask"):
        assert re.search(rf"^\| attention fwd\+bwd \S+ bf16 \| implementation={impl} \| {number} \| ms \|", table,
                         re.M), (impl, table)
    if "cpu" in out.split("\n")[0]:  # cuDNN needs an NVIDIA GPU: named as such, not hidden
        assert re.search(r"^\| attention .* \| implementation=cudnn \|  \|  \|  \| n/a: ValueError: .*needs an NVIDIA "
                         r"GPU", table, re.M), table
    for section, run, unit in (("ResNet-18 train", "Trainer", "images/s"), ("BERT-tiny train", "Trainer", "tokens/s"),
                               ("BERT-tiny train", "jax\\.jit by hand", "tokens/s"),
                               ("remat BERT-tiny", "recompute=True", "MiB temp"),
                               ("remat BERT-tiny", "recompute, offloaded", "MiB temp")):
        assert re.search(rf"^\| {section}[^|]* \| {run} \| {number} \| {unit} \|", table, re.M), (section, run, table)
    assert re.search(r"^\| BERT-tiny train [^|]* \| Trainer \| .*model \S+ TFLOP/s", table, re.M), table
    assert "| failed |" not in table


def test_autotune_cold_quick():
    out = run_quick("autotune_cold.py", timeout=300)
    rows = re.findall(r"^DigitsCNN\s+(default|exhaustive)\s+\d+\.\d s\s+\d+\.\d\d\s+(\d+\.\d{3})x  \S", out, re.M)
    assert [r[0] for r in rows] == ["default", "exhaustive"] and rows[1][1] == "1.000", out


def test_cpu_latency_quick():
    # also the regression test of the oneDNN kernels under a Predictor at 2 threads: before each
    # primitive had a scratchpad of its own, this run crashed in oneDNN's im2col
    out = run_quick("cpu_latency.py", timeout=300)
    assert "\n2 threads, batch 4, float32" in out and "1 thread," not in out, out
    rows = re.findall(r"^(SmallCNN|DigitsCNN)(?:\s+\d+\.\d{3} ms){5}\s+(\d+\.\d\d)x\s+(\d+\.\d\d)x\s+-"
                      r"\s+\d+\.\d s / \d+\.\d s  (\S.*)$", out, re.M)
    assert [r[0] for r in rows] == ["SmallCNN", "DigitsCNN"], out
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)


def test_tsm_quick():
    out = run_quick("tsm.py", timeout=240)
    rows = dict(re.findall(r"^(TSM \(shift 0\.125 each way\)|TSN \(no shift\))\s+\d+\.\d\d%\s+(\d+\.\d)%$", out, re.M))
    assert list(rows) == ["TSM (shift 0.125 each way)", "TSN (no shift)"], out
    assert rows["TSN (no shift)"] == "100.0"  # blind to the frames' order, trained or not
    assert re.search(r"^held-out clip 0: digit \d moving (right|left|down|up), centre per frame( \(\d+,\d+\)){4}$",
                     out, re.M), out
    assert len(re.findall(r"^  (TSM|TSN) .* says \w+ \(\d\.\d\d\); for the clip played backwards \w+", out,
                          re.M)) == 2, out


def test_gan_quick(tmp_path):
    out = run_quick("gan.py", "--out", str(tmp_path), timeout=400)
    assert re.search(r"^DigitsCNN \(on 8x8 block means\): held-out accuracy on real digits \d+\.\d\d%$", out, re.M), out
    rows = re.findall(r"^ +(\d) +(\d+\.\d)%$", out, re.M)
    assert [c for c, _ in rows] == [str(c) for c in range(10)], out
    assert re.search(r"^ +all +\d+\.\d%   bar 80%: (PASS|FAIL)$", out, re.M), out
    errors = re.findall(r"^  (the edge map itself|the edge map blurred 3x3|the mean training digit|CycleGAN \(unpaired\)"
                        r"|Pix2Pix) +(\d\.\d{4})$", out, re.M)
    assert [name for name, _ in errors] == ["the edge map itself", "the edge map blurred 3x3", "the mean training digit",
                                            "CycleGAN (unpaired)", "Pix2Pix"], out
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["cyclegan_losses.png", "dcgan_losses.png",
                                                              "dcgan_samples.png", "pix2pix_losses.png",
                                                              "translation_samples.png"]


@pytest.mark.parametrize("crash", [False, True])
def test_a_step_worker_steps_on_request_and_a_dead_one_is_named(tmp_path, crash):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from timing import StepWorker

    script = tmp_path / "worker.py"
    script.write_text("import json, sys\nargs = json.loads(sys.argv[1])\n"
                      + ("sys.exit(3)\n" if crash else "")
                      + "print('READY', 'counter from', args['start'], flush=True)\n"
                        "for n, _ in enumerate(sys.stdin, args['start']):\n"
                        "    print('STEP', 0.25, n, flush=True)\n")
    if crash:
        with pytest.raises(RuntimeError, match="exit code 3"):
            StepWorker(sys.executable, [str(script)], {"start": 5})
        return
    with StepWorker(sys.executable, [str(script)], {"start": 5}) as worker:
        assert worker.name == "counter from 5"
        assert [worker.step() for _ in range(3)] == [(0.25, 5.0), (0.25, 6.0), (0.25, 7.0)]
    assert worker.process.returncode == 0
