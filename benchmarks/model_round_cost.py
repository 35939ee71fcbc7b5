"""CPU cost of local training per model: the number that sizes the Table II configs.

For each model, one client's local training (``--images`` FashionMNIST images, batch
``--batch``, one epoch, SGD with momentum, one torch thread) is timed ``--repeat`` times,
interleaved across models. Reported per model: CPU seconds (``time.process_time``, robust to
other jobs on a shared machine) and wall seconds per 1000 training images, min and max over
the repeats, plus images/s. Inference (evaluation) is timed the same way.

Run by hand: ``PYTHONPATH=python .venv/bin/python benchmarks/model_round_cost.py``; writes
``benchmarks/results/model_round_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaleflu.fl.data import load_fashion_mnist
from scaleflu.fl.fedavg import LocalConfig, evaluate, train_client
from scaleflu.fl.models import build_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Time local training and evaluation per model; write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["lenet", "mobilenetv3", "resnet18"])
    ap.add_argument("--images", type=int, default=320)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "model_round_cost.json"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    train, test = load_fashion_mnist()
    idx = np.arange(args.images)
    test = test.subset(np.arange(min(1000, len(test))))
    local = LocalConfig(1, 0.01, args.batch, 0.9)
    runs: dict[str, dict[str, list[float]]] = {
        m: {"train_cpu": [], "train_wall": [], "eval_cpu": [], "eval_wall": []} for m in args.models
    }
    models = {m: build_model(m, 10, 1, 28) for m in args.models}
    for rep in range(args.repeat):
        for m, model in models.items():
            state = {k: v.clone() for k, v in model.state_dict().items()}
            c0, w0 = time.process_time(), time.perf_counter()
            train_client(model, state, idx, train, local, 0, rep + 1, 0)
            runs[m]["train_cpu"].append((time.process_time() - c0) * 1000 / args.images)
            runs[m]["train_wall"].append((time.perf_counter() - w0) * 1000 / args.images)
            c0, w0 = time.process_time(), time.perf_counter()
            evaluate(model, test, 250)
            runs[m]["eval_cpu"].append((time.process_time() - c0) * 1000 / len(test))
            runs[m]["eval_wall"].append((time.perf_counter() - w0) * 1000 / len(test))
    summary: dict[str, Any] = {}
    for m, r in runs.items():
        summary[m] = {
            key: {"min": min(v), "max": max(v), "median": float(np.median(v))}
            for key, v in r.items()
        }
        summary[m]["train_images_per_cpu_s"] = 1000 / summary[m]["train_cpu"]["median"]
    report = {
        "unit": "seconds per 1000 images (train: 1 epoch of local SGD; eval: inference)",
        "setup": vars(args) | {"out": str(args.out), "torch_threads": 1},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_avg_at_end": os.getloadavg(),
        },
        "runs": runs,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=2))  # noqa: T201 - a script's result
    return 0


if __name__ == "__main__":
    sys.exit(main())
