"""Sizing the membership canaries: canary MIA of the trained model and of Retrain, per K x r.

Run by hand (about 3 CPU minutes per grid point and seed on a quiet core; resumable; one
process per job with ``--jobs``):

    PYTHONPATH=python .venv/bin/python benchmarks/canary_sizing.py [--config table2_cpu]
        [--grid 50x4 50x8] [--seeds 0 1 2] [--requests client:0 sample:1:poisoned]
        [--set fl.lr_schedule=cosine ...] [--tag NAME] [--jobs 2] [--out benchmarks/results]

For every grid point ``KxR`` (``data.poison.canaries=K``, ``canary_copies=R`` on the config's
``canary_clients``, [0, 1] when it lists none) and seed: trains the config's LeNet run (reused
when present), then per request measures the trained model and Retrain (its own FedAvg on D_r)
with every metric, the calibrated canary MIA included (the config's ``mia_shadows`` reference
models). Only training-side and MIA numbers choose K and R: no unlearning method is run.
Writes ``<out>/canary_sizing[_TAG]/<K>x<R>-s<seed>.json`` per job and ``canary_sizing[_TAG].json``
(all jobs) beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KEYS = (
    "test_acc",
    "ra",
    "ra_clean",
    "fa",
    "fa_clean",
    "fa_protocol",
    "mia_ref_auc",
    "mia_canary_n",
    "mia_canary_loss_auc",
    "mia_canary_auc",
    "mia_canary_tpr_1fpr",
)


def one_job(args: argparse.Namespace, k: int, r: int, seed: int, path: Path) -> dict:
    """Train (or reuse) the run of grid point ``k x r`` and seed; measure Original and Retrain."""
    import torch

    from scaleflu.config import load_config
    from scaleflu.experiments.cells import RunKey
    from scaleflu.experiments.harness import ensure_run, make_context
    from scaleflu.fl.run import load_run
    from scaleflu.unlearn.registry import make_method

    torch.set_num_threads(1)
    cfg = load_config(args.config, ["scale.eval.relearn_max_rounds=0", *args.set])
    poison = cfg.data.poison
    poison.canaries, poison.canary_copies = k, r
    poison.canary_clients = poison.canary_clients or [0, 1]
    t0, c0 = time.perf_counter(), time.process_time()
    key = RunKey("fashion_mnist", str(cfg.model.name), float(cfg.data.alpha), seed)
    runs = path.parent / "runs" / f"{k}x{r}"
    run = load_run(ensure_run(cfg, key, runs, False))
    out: dict = {"K": k, "R": r, "seed": seed, "set": list(args.set), "requests": {}}
    out["train_curve"] = [m.get("test_acc") for m in run.metrics]
    for req in args.requests:
        ctx = make_context(run, req, cfg, progress=False)
        orig = ctx.original_metrics()
        res = make_method("retrain", cfg).run(ctx)
        out["requests"][req] = {
            "forget_size": len(ctx.forget_idx),
            "original": {kk: orig.get(kk) for kk in KEYS},
            "retrain": {kk: res.metrics.get(kk) for kk in KEYS},
        }
        logging.info("%dx%d s%d %s: %s", k, r, seed, req, out["requests"][req])
    out["wall_s"], out["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    run.history.close()
    return out


def main() -> None:
    """Parse the arguments; run the jobs (in ``--jobs`` processes); collect the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="table2_cpu")
    ap.add_argument("--grid", nargs="+", default=["50x4", "50x8"], help="KxR points")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--requests", nargs="+", default=["client:0", "sample:1:poisoned"])
    ap.add_argument(
        "--set", nargs="*", action="extend", default=[], help="config overrides (key=value)"
    )
    ap.add_argument("--tag", default="")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # KxR:seed, one worker
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    name = "canary_sizing" + (f"_{args.tag}" if args.tag else "")
    folder = Path(args.out) / name
    folder.mkdir(parents=True, exist_ok=True)
    if args.job:
        point, seed = args.job.split(":")
        k, r = (int(x) for x in point.split("x"))
        path = folder / f"{k}x{r}-s{seed}.json"
        res = one_job(args, k, r, int(seed), path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=2))
        tmp.replace(path)
        return
    jobs = [f"{p}:{s}" for p in args.grid for s in args.seeds]
    todo = [j for j in jobs if not (folder / f"{j.replace(':', '-s')}.json").is_file()]
    logging.info("%d jobs, %d to run, %d at a time", len(jobs), len(todo), args.jobs)
    base = [sys.executable, __file__, "--config", args.config, "--out", args.out]
    base += ["--tag", args.tag, "--requests", *args.requests]
    base += ["--set", *args.set] if args.set else []
    running: list[subprocess.Popen] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for j in todo:
        while len(running) >= max(args.jobs, 1):
            running = [p for p in running if p.poll() is None]
            time.sleep(1)
        running.append(subprocess.Popen([*base, "--job", j], env=env))
    for p in running:
        p.wait()
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*x*-s*.json"))]
    (Path(args.out) / f"{name}.json").write_text(json.dumps(rows, indent=2))
    for row in rows:
        for req, v in row["requests"].items():
            o, t = v["original"], v["retrain"]
            logging.info(
                "%dx%d s%d %-18s canary AUC orig %s retrain %s | TPR orig %s retrain %s | "
                "RA orig %.3f retrain %.3f",
                row["K"],
                row["R"],
                row["seed"],
                req,
                o["mia_canary_auc"],
                t["mia_canary_auc"],
                o["mia_canary_tpr_1fpr"],
                t["mia_canary_tpr_1fpr"],
                o["ra"],
                t["ra"],
            )


if __name__ == "__main__":
    main()
