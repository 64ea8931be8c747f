"""Fine-tune all_minilm_l6_v2 on BBC News through the hub API, then install and serve the result.

PaddleHub's three lines: ``Module(name="all_minilm_l6_v2", task="seq-cls", ...)``,
``hub.Trainer(model, optimizer, checkpoint_dir)``, ``trainer.train(...)``. The script reports
the held-out accuracy the trainer measured, installs ``best_model/`` into a fresh hub home,
checks that the installed module classifies the held-out articles the same way, and that a
server started on 127.0.0.1 answers ``POST /predict/<module>`` with the same labels.

    python benchmarks/hub_finetune.py                   # the full run (minutes): prints accuracy
    python benchmarks/hub_finetune.py --quick           # a few articles, for smoke tests
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import machine  # noqa: E402


def serve_once(module, texts: list[str]) -> list:
    """The labels a real server on 127.0.0.1 gives for ``texts``."""
    import socket

    import uvicorn

    from paddlejax.hub.serving import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app({module.name: module}), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict/{module.name}",
                                         data=json.dumps({"texts": texts}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            body = json.loads(response.read())
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert body["status"] == "000", body
    return [r["label"] for r in body["results"]]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="default: the minilm_bbc_news recipe's")
    p.add_argument("--max-seq-len", type=int, default=None, help="default: the recipe's")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=None, help="first N train and test articles")
    p.add_argument("--quick", action="store_true", help="32 articles, 1 epoch, 16 tokens")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.limit, args.epochs, args.max_seq_len = 32, 1, 16
    home = tempfile.mkdtemp(prefix="hub-finetune-")  # a fresh hub, removed at the end (its modules are ~90 MB)
    os.environ["HUB_HOME"] = home
    try:
        return run(args)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(args) -> dict:

    import inspect

    import paddlejax as pj
    from paddlejax.data import BBCNews
    from paddlejax.hub import builtin

    defaults = {k: v.default for k, v in inspect.signature(builtin.build_minilm_bbc_news).parameters.items()}
    epochs = args.epochs or defaults["epochs"]
    max_seq_len = args.max_seq_len or defaults["max_seq_len"]
    print(machine())
    start = time.perf_counter()
    manifest = pj.hub.install("all_minilm_l6_v2", progress=not args.no_progress)
    out = Path(os.environ["HUB_HOME"]) / "built"
    built = builtin.build_minilm_bbc_news(out, progress=not args.no_progress, epochs=epochs, max_seq_len=max_seq_len,
                                          batch_size=args.batch_size, limit=args.limit)
    minutes = (time.perf_counter() - start) / 60
    installed = pj.hub.install(str(out))
    module = pj.hub.Module(name=f"{installed.name}=={installed.version}", install=False)
    test = BBCNews("test")
    n = min(args.limit or len(test), len(test))
    texts, labels = zip(*(test[i] for i in range(n)))
    predicted = [r["label"] for r in module.predict(list(texts))]
    accuracy = float(np.mean([p == test.class_names[y] for p, y in zip(predicted, labels)]))
    served = serve_once(module, list(texts[:8]))
    print(f"{manifest.name} -> {built.label}: {epochs} epoch(s), {max_seq_len} word pieces, batch {args.batch_size}; "
          f"{minutes:.1f} min to fine-tune")
    print(f"summary written at build: {built.summary}")
    print(f"installed module on {n} held-out articles: accuracy {accuracy:.2%}; "
          f"served labels {'match' if served == predicted[:8] else 'DIFFER'}")
    return {"accuracy": accuracy, "served_match": served == predicted[:8], "minutes": minutes}


if __name__ == "__main__":
    main()
