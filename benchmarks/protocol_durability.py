"""Does the protocol with power have power? Backdoor durability and learned flips, measured.

Run by hand (about 10 minutes on a quiet 2-core machine, longer when it is shared):

    .venv/bin/python benchmarks/protocol_durability.py [--config table2_cpu] [--rounds 5]
        [--run RUN_DIR] [--out benchmarks/results]

Trains (or reuses ``--run``) the config's federation for seed 0, then from the trained model
runs up to ``--rounds`` plain FedAvg rounds of the remaining clients (the fine-tune control)
for the client request (``client:0``) and the sample request (``sample:1:0.5``), and records
after each round the attack success rate, FA on the forgotten samples (held and true labels),
RA and test accuracy. Writes ``protocol_durability.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from scaleflu.config import load_config, resolve_config_path
from scaleflu.experiments.cells import RunKey
from scaleflu.experiments.harness import ensure_run, make_context
from scaleflu.fl.run import load_run

KEYS = ("test_acc", "ra", "ra_clean", "fa", "fa_clean", "backdoor_asr")


def main() -> None:
    """Parse the arguments, measure, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="table2_cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--run", default=None, help="an already trained run of this config")
    ap.add_argument("--requests", nargs="+", default=["client:0", "sample:1:0.5"])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    cfg = load_config(resolve_config_path(args.config), ["scale.eval.relearn_max_rounds=0"])
    cfg.scale.eval.mia_shadows = 0  # durability only: no reference models
    t0 = time.perf_counter()
    if args.run:
        run_dir = Path(args.run)
    else:
        key = RunKey("fashion_mnist", "lenet", float(cfg.data.alpha), 0)
        run_dir = ensure_run(cfg, key, Path(args.out) / "protocol_durability_runs", False)
    run = load_run(run_dir)
    out: dict = {"config": args.config, "run": str(run_dir), "train_s": time.perf_counter() - t0}
    T = run.history.last_completed_round()
    for req in args.requests:
        ctx = make_context(run, req, cfg, progress=False)
        rows = [{"rounds": 0, **{k: ctx.original_metrics()[k] for k in KEYS}}]
        state = ctx.original_state()
        for k in range(1, args.rounds + 1):
            state, _ = ctx.fedavg_rounds(state, 1, T + k)
            m = ctx.evaluate(state, relearn=False)
            rows.append({"rounds": k, **{kk: m[kk] for kk in KEYS}})
            logging.info("%s after %d plain rounds: %s", req, k, rows[-1])
        out[req] = rows
    path = Path(args.out) / "protocol_durability.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    logging.info("wrote %s", path)


if __name__ == "__main__":
    main()
