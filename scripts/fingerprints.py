#!/usr/bin/env python3
"""Fingerprints of the models a fixed set of seeds produces: the check that a refactoring
changed no behaviour.

    .venv/bin/python scripts/fingerprints.py --out fp.json             # Table II cells, toy size
    .venv/bin/python scripts/fingerprints.py --out fp.json --demo      # and the testbed's model
    .venv/bin/python scripts/fingerprints.py --compare a.json b.json   # identical? (exit 0/1)

The Table II part trains the tiny run of the test suite (5 clients, 3000 images, 6 rounds) and
runs every registered method on the three scenarios with ``experiment.save_models``; the SHA-256
of every tensor (name, dtype, shape, bytes) of the trained model and of each cell's unlearned
model goes into the JSON. ``--demo`` adds the local testbed on the ideal frame link (the same
FL rounds and unlearning as ``make demo``; the link kind changes only how bytes travel, every
model is checked bit-exact on arrival): its global model per round and its unlearned model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "tests"))  # the tests' tiny run: the same cells they check
from tiny_run_helpers import TINY_OVERRIDES  # noqa: E402

TOY = [
    *TINY_OVERRIDES,
    "experiment.save_models=true",
    "experiment.methods=[retrain,fedraser,pga,fused,finetune,scale]",
]


def tensor_digest(path: Path) -> str:
    """SHA-256 over every tensor of a safetensors file (name, dtype, shape, raw bytes)."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    state = load_file(str(path))
    for name in sorted(state):
        t = state[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


def table2_fingerprints(work: Path) -> dict[str, str]:
    out = work / "table2"
    cmd = [sys.executable, "-m", "scaleflu", "experiment", "table2", "--out", str(out)]
    cmd += ["--no-progress", "--no-report"]
    for o in TOY:
        cmd += ["--set", o]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, cwd=ROOT, env=env)
    fps: dict[str, str] = {}
    for p in sorted(out.rglob("model.safetensors")):
        fps[str(p.relative_to(out).parent)] = tensor_digest(p)
    return fps


def demo_fingerprints(work: Path) -> dict[str, str]:
    out = work / "demo"
    cmd = [sys.executable, str(ROOT / "apps" / "testbed.py"), "--link", "frames", "--quiet"]
    cmd += ["--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    fps: dict[str, str] = {}
    for p in sorted(out.rglob("*.safetensors")):
        fps[str(p.relative_to(out))] = tensor_digest(p)
    return fps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the fingerprints here (JSON)")
    ap.add_argument("--demo", action="store_true", help="also the local testbed (frames link)")
    ap.add_argument("--no-table2", action="store_true", help="skip the Table II cells")
    ap.add_argument("--work", help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--compare", nargs=2, metavar="JSON", help="compare two fingerprint files")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        bad = 0
        for part in sorted(set(a) | set(b)):
            pa, pb = a.get(part, {}), b.get(part, {})
            for k in sorted(set(pa) | set(pb)):
                same = pa.get(k) == pb.get(k)
                bad += not same
                print(f"{'same ' if same else 'DIFF '} {part}: {k}")
        print(f"{bad} differ" if bad else "all identical")
        return 1 if bad else 0
    if not args.out:
        ap.error("--out is required (or --compare)")
    with tempfile.TemporaryDirectory(prefix="scaleflu-fp-") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        res: dict[str, Any] = {}
        if not args.no_table2:
            res["table2"] = table2_fingerprints(work)
        if args.demo:
            res["demo"] = demo_fingerprints(work)
    Path(args.out).write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(f"{sum(len(v) for v in res.values())} fingerprints written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
