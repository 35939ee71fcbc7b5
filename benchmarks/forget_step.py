"""SCALE's forgetting step: its gradients from ``step_gradients`` against autograd's, CPU seconds.

    PYTHONPATH=python .venv/bin/python benchmarks/forget_step.py --run runs/t2
        [--request client:0] [--repeat 5] [--out benchmarks/results]

On a trained run (``scaleflu train --config table2_cpu --out runs/t2``): SCALE is run once on
the request to get the state and the server's images its forgetting step receives; then the
step alone (``forget.calibrated_forget``) is timed ``--repeat`` times on each path, the two in
turn (fast, autograd, fast, ...) so that a change in the machine's speed hits both: the head's
gradients from :func:`scaleflu.unlearn.forget.step_gradients` (the default for a head given as
its linear layers) and from autograd (``head_layers`` patched to None). Process CPU seconds per
call, one torch thread. Both paths must return the same state bit for bit (else it stops).
Writes ``<out>/forget_step-<request>.json``: per path min / median / max, and the ratio pair by
pair.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a trained run (scaleflu train)")
    ap.add_argument("--request", default="client:0")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    import scaleflu.unlearn.scale as scale_mod
    from scaleflu.unlearn import forget
    from scaleflu.unlearn.run import run_unlearning

    torch.set_num_threads(1)
    got: dict[str, Any] = {}
    original = scale_mod.calibrated_forget

    def capture(ctx: Any, state: Any, select: Any, anchor: Any) -> Any:
        got["args"] = (ctx, {k: v.clone() for k, v in state.items()}, select, anchor)
        return original(ctx, state, select, anchor)

    scale_mod.calibrated_forget = capture
    try:
        run_unlearning(args.run, args.request, "scale", progress=False, audit=False, measure=False)
    finally:
        scale_mod.calibrated_forget = original
    if "args" not in got:
        raise SystemExit(f"SCALE ran no forgetting step on {args.request}")
    fast_layers = forget.head_layers

    def one(path: str) -> tuple[float, dict[str, torch.Tensor], dict[str, Any]]:
        forget.head_layers = fast_layers if path == "step_gradients" else (lambda model: None)
        try:
            t0 = time.process_time()
            state, info = forget.calibrated_forget(*got["args"])
            return time.process_time() - t0, state, info
        finally:
            forget.head_layers = fast_layers

    rows: dict[str, list[float]] = {"step_gradients": [], "autograd": []}
    info: dict[str, Any] = {}
    for i in range(args.repeat):
        states = {}
        for path in rows:
            cpu, states[path], info = one(path)
            rows[path].append(cpu)
            print(path, i, round(cpu, 3), flush=True)
        a, b = states["step_gradients"], states["autograd"]
        if any(not torch.equal(a[k], b[k]) for k in a):
            raise SystemExit("the two paths returned different states")
    ratio = [f / s for f, s in zip(rows["step_gradients"], rows["autograd"], strict=True)]

    def spread(v: list[float]) -> dict[str, float]:
        return {"min": min(v), "median": statistics.median(v), "max": max(v)}

    out = {
        "run": str(args.run),
        "request": args.request,
        "repeat": args.repeat,
        "cpu_s": {k: spread(v) for k, v in rows.items()},
        "ratio": spread(ratio),
        "epochs_run": info.get("epochs_run"),
        "selected": info.get("selected"),
        "same_state": True,
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__},
        "platform": platform.platform(),
    }
    path = Path(args.out) / f"forget_step-{args.request.replace(':', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(json.dumps({"cpu_s": out["cpu_s"], "ratio": out["ratio"]}), "->", path)


if __name__ == "__main__":
    main()
