#!/usr/bin/env python3
"""Robot footprint: peak RSS and time per round of the robot client with LeNet-5 and ResNet18.

Runs the real ``apps/robot_client.py`` as a child process against an in-process edge server
stand-in over the frames link (ZeroMQ hub, no channel impairments) for a few rounds, and reads
the child's peak RSS from ``resource.getrusage(RUSAGE_CHILDREN)`` (one child at a time, so the
maximum is that robot's). Time per round is the robot's own (receive model, train, upload).
Targets (MentorPi): LeNet <= 400 MB, ResNet18 <= 1.5 GB. By hand::

    .venv/bin/python benchmarks/robot_footprint.py            # writes results/robot_footprint.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaleflu.config import load_config, save_config
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub, FrameHubLink
from scaleflu.testbed.keys import save_keys
from scaleflu.testbed.protocol import generate_keys
from scaleflu.testbed.server import EdgeServer

ROOT = Path(__file__).resolve().parents[1]

TARGET_MB = {"lenet": 400, "resnet18": 1536}


def no_unlearn(*_a, **_k):  # the benchmark stops after the rounds
    """Unused: no robot asks to be forgotten here."""
    raise RuntimeError("not used")


def measure(model: str, rounds: int, train_subset: int, robots: int, workdir: Path) -> dict:
    """One robot process (plus ``robots - 1`` in-process peers' worth of data) for a model."""
    overrides = [
        f"model.name={model}",
        "data.num_clients=3",
        "fl.clients_per_round=3",
        f"data.train_subset={train_subset}",
        "data.test_subset=1000",
        "fl.local_epochs=1",
        "fl.batch_size=32",
        "fl.threads=1",
        f"testbed.rounds={rounds}",
        "testbed.min_robots=1",
        "testbed.round_deadline_s=600",
        "testbed.unlearn.wait_s=0",
        "testbed.eval_test_samples=500",
        "testbed.send_timeout_s=300",
    ]
    cfg = load_config(None, overrides)
    cfg_path = save_config(cfg, workdir / f"{model}.yaml")
    keys = generate_keys([1, 2, 3])
    keys_path = save_keys(keys, workdir / "keys.json")
    hub = FrameHub("tcp://127.0.0.1:0", ChannelModel(), seed=0)
    link = FrameHubLink(0, hub.address)
    server = EdgeServer(link, {1: keys[1]}, cfg, workdir / f"run-{model}", False, no_unlearn)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cmd = [
        sys.executable, str(ROOT / "apps" / "robot_client.py"), "--config", str(cfg_path),
        "--keys", str(keys_path), "--robot-id", "1", "--link", "frames", "--hub", hub.address,
        "--summary", str(workdir / f"robot-{model}.json"), "--max-runtime", "1800",
        "--log-level", "WARNING",
    ]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        report = server.run()  # in this thread: the history store's SQLite belongs to it
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    wall = time.perf_counter() - t0
    link.close()
    hub.close()
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    summary = json.loads((workdir / f"robot-{model}.json").read_text())
    per_round = [r["train_s"] for r in summary["rounds"]]
    round_wall = [r["wall_s"] for r in report["rounds"]]
    peak_mb = peak_kb / 1024
    if peak_kb <= before:
        peak_mb = float("nan")  # an earlier, larger child masks this one
    return {
        "model": model,
        "rounds": rounds,
        "train_samples_robot": report["robots"][1]["num_samples"],
        "peak_rss_mb": peak_mb,
        "target_mb": TARGET_MB[model],
        "within_target": bool(peak_mb <= TARGET_MB[model]),
        "train_s_per_round": per_round,
        "round_wall_s": round_wall,
        "load_s": summary["load_s"],
        "total_wall_s": wall,
        "upload_bytes": [r["upload_bytes"] for r in summary["rounds"]],
    }


def main() -> int:
    """Measure LeNet first, then ResNet18 (increasing peaks, so RUSAGE_CHILDREN separates them)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--train-subset", type=int, default=12000)
    p.add_argument("--models", default="lenet,resnet18")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "robot_footprint.json"))
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.models.split(","):
            r = measure(m, args.rounds, args.train_subset, 3, Path(tmp))
            print(json.dumps(r), flush=True)
            results.append(r)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "robot_footprint",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "cpus": __import__("os").cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "note": "peak RSS of the robot_client process (resource.getrusage RUSAGE_CHILDREN); "
        "torch 1 thread; FashionMNIST subset as given; time per round = local training",
        "results": results,
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
