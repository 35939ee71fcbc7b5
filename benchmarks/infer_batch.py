"""Inference passes: milliseconds per image against the pass size, for the built-in models.

    PYTHONPATH=python .venv/bin/python benchmarks/infer_batch.py [--threads 1 2]
        [--sizes 1024 500 256 128 64 32 16] [--repeat 5] [--out benchmarks/results]

What ``fl.device.CPU_INFER_BATCH`` rests on (every evaluation, audit and SCALE measurement runs
a model without gradient over a set of images). Per model (LeNet-5 and MobileNetV3-Small on
28x28 grey images, ResNet18 on 32x32 colour ones, randomly initialised, eval mode), per torch
thread count and per pass size: the model over the same seeded set of images in passes of that
size (:func:`scaleflu.fl.device.infer`), ``--repeat`` times, the sizes in turn within each
repeat so that a change in the machine's speed hits them all; the median per image is
reported, with min and max. It also says whether each size gave the logits of the largest one
bit for bit (kernels may differ with the pass size; on the machine that wrote the first result
they did not from 16 images up). Writes ``<out>/infer_batch.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from scaleflu.fl.device import infer
from scaleflu.fl.models import build_model

MODELS = (("lenet", 1, 28, 1024), ("mobilenetv3", 1, 28, 1024), ("resnet18", 3, 32, 256))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 500, 256, 128, 64, 32, 16])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    if args.repeat < 1 or min(args.sizes) < 1 or min(args.threads) < 1:
        raise SystemExit("--repeat, --sizes and --threads must be positive")
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, channels, size, n in MODELS:
            torch.manual_seed(0)
            model = build_model(name, 10, channels, size).eval()
            x = torch.randn(n, channels, size, size)
            ref = infer(model, x, max(args.sizes))
            times: dict[int, list[float]] = {b: [] for b in args.sizes}
            same: dict[int, bool] = {}
            for _ in range(args.repeat):
                for b in args.sizes:
                    t0 = time.perf_counter()
                    out = infer(model, x, b)
                    times[b].append((time.perf_counter() - t0) / n * 1e3)
                    same[b] = bool(torch.equal(out, ref))
            for b in args.sizes:
                ms = times[b]
                rows.append(
                    {
                        "model": name,
                        "threads": threads,
                        "pass": b,
                        "images": n,
                        "ms_per_image": {
                            "min": min(ms),
                            "median": statistics.median(ms),
                            "max": max(ms),
                        },
                        "same_logits_as_largest": same[b],
                    }
                )
                print(
                    f"{name:12s} threads {threads} pass {b:5d}: "
                    f"{statistics.median(ms):7.3f} ms/image (min {min(ms):.3f}, max {max(ms):.3f})"
                    f"{'' if same[b] else '  logits differ from the largest pass'}"
                )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "infer_batch.json"
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__}
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
