"""Why MobileNetV3-Small does not learn in the CPU-sized Table II run: small measured experiments.

Every experiment uses the data of the reduced MobileNetV3 run of ``table2_cpu`` (its
``experiment.model_settings.mobilenetv3``; ``--set`` adds overrides) and scores on the
server's validation set (the seeded 500-image slice of the test set the unlearning methods
tune on, ``unlearn.base``): never on the test set.

* ``split``: the clients' sizes and SGD steps per round (the Dirichlet split).
* ``central``: centralised training on the same training samples (``--epochs``), validation
  accuracy after each epoch in eval mode (running statistics), in train mode (batch
  statistics) and after recalibrating the running statistics on the validation images.
* ``fl``: the product's FedAvg rounds (``--rounds``); after each round the global model's
  validation accuracy in eval mode, in train mode and after recalibration, and how far the
  averaged running statistics are from the global model's own statistics on validation data.

One torch thread; prints one JSON line per measurement and writes them to ``--out``
(benchmarks/results/, not committed; the numbers are in docs/results/table2.md):
    PYTHONPATH=python .venv/bin/python benchmarks/mnv3_diagnose.py split
    PYTHONPATH=python .venv/bin/python benchmarks/mnv3_diagnose.py central --epochs 3
    PYTHONPATH=python .venv/bin/python benchmarks/mnv3_diagnose.py fl --rounds 10 \
        --set data.train_subset=12000
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaleflu.config import load_config
from scaleflu.experiments.cells import RunKey
from scaleflu.experiments.harness import run_config
from scaleflu.fl.aggregation import aggregate
from scaleflu.fl.data import ImageData
from scaleflu.fl.fedavg import (
    LocalConfig,
    client_batches,
    evaluate,
    make_trainer,
    select_clients,
)
from scaleflu.fl.run import build_setup

ROOT = Path(__file__).resolve().parents[1]

BN = nn.modules.batchnorm._BatchNorm


def val_split(test: ImageData, seed: int, n: int) -> ImageData:
    """The server's validation slice, as ``unlearn.base.UnlearnEvaluation`` draws it."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 41]))
    perm = rng.permutation(len(test))
    return test.subset(np.sort(perm[: min(n, len(test) // 2)]))


@torch.no_grad()
def train_mode_acc(model: nn.Module, data: ImageData, batch: int = 250) -> float:
    """Accuracy with BatchNorm using each batch's own statistics (no state change)."""
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, BN):
            mod.train()
            mod.track_running_stats = False  # batch statistics, running buffers untouched
            mod.running_mean = None
            mod.running_var = None
        elif isinstance(mod, nn.Dropout):
            mod.eval()
    correct = 0
    for s in range(0, len(data), batch):
        out = m(data.inputs(slice(s, s + batch)))
        correct += int((out.argmax(1) == data.labels[s : s + batch]).sum())
    return correct / len(data)


@torch.no_grad()
def recalibrated(model: nn.Module, data: ImageData, batch: int = 250) -> nn.Module:
    """A copy whose running statistics are the cumulative average over ``data``."""
    m = copy.deepcopy(model)
    for mod in m.modules():
        if isinstance(mod, BN):
            mod.reset_running_stats()
            mod.momentum = None  # cumulative average
    m.train()
    for s in range(0, len(data), batch):
        m(data.inputs(slice(s, s + batch)))
    m.eval()
    return m


@torch.no_grad()
def bn_gap(model: nn.Module, data: ImageData) -> dict[str, float]:
    """Median over BN layers of |log(running_var / batch var)| and of the mean gap in stds."""
    ref = recalibrated(model, data)
    lv, mg = [], []
    for (_n, a), (_m, b) in zip(model.named_modules(), ref.named_modules(), strict=True):
        if isinstance(a, BN):
            lv.append(float((a.running_var / b.running_var).log().abs().median()))
            mg.append(
                float(((a.running_mean - b.running_mean).abs() / b.running_var.sqrt()).median())
            )
    return {"logvar_gap_med": float(np.median(lv)), "mean_gap_std_med": float(np.median(mg))}


@torch.no_grad()
def top_class(model: nn.Module, data: ImageData) -> list[float]:
    """The most predicted class (eval mode) and the share of predictions it takes."""
    model.eval()
    pred = model(data.inputs()).argmax(1)
    counts = torch.bincount(pred, minlength=10)
    return [int(counts.argmax()), round(float(counts.max()) / len(data), 3)]


def scores(model: nn.Module, val: ImageData) -> dict[str, Any]:
    """Validation accuracy three ways, and the most predicted class with its share."""
    return {
        "top_pred": top_class(model, val),
        "val_eval": evaluate(model, val)["acc"],
        "val_trainmode": train_mode_acc(model, val),
        "val_recal": evaluate(recalibrated(model, val), val)["acc"],
    }


def emit(rows: list[dict[str, Any]], row: dict[str, Any], out: Path) -> None:
    print(json.dumps(row), flush=True)
    rows.append(row)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=["split", "central", "fl"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="config override")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lr", type=float, default=None, help="central: learning rate (fl.lr)")
    ap.add_argument("--batch", type=int, default=None, help="central: batch (fl.batch_size)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        choices=["linear_default", "no_dropout"],
        help="torch's default Linear init instead of N(0, 0.01); dropout 0 (central only)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = load_config(ROOT / "python/scaleflu/configs/table2_cpu.yaml")
    cfg = run_config(
        base, RunKey("fashion_mnist", "mobilenetv3", float(base.data.alpha), args.seed)
    )
    if args.set:
        from scaleflu.config import as_config, merge, parse_override

        d = dict(cfg)
        for item in args.set:
            d = merge(d, parse_override(item))
        cfg = as_config(d)
    setup = build_setup(cfg)
    val = val_split(setup.test, args.seed, int(cfg.scale.val_size))
    out = args.out or ROOT / "benchmarks/results" / f"mnv3_diagnose_{args.stage}_s{args.seed}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    fl = cfg.fl
    head = {"stage": args.stage, "seed": args.seed, "set": args.set, "train": len(setup.train)}
    emit(rows, {**head, "lr": fl.lr, "batch": fl.batch_size, "rounds": fl.rounds}, out)

    if args.stage == "split":
        sizes = [len(p) for p in setup.parts]
        bs = int(fl.batch_size)
        steps = [len(client_batches(s, int(fl.local_epochs), bs, 0, 1, 0)) for s in sizes]
        per_round = []
        for t in range(1, int(fl.rounds) + 1):
            cl = select_clients(args.seed, t, len(sizes), int(fl.clients_per_round))
            per_round.append([steps[n] for n in cl])
        labels = setup.train.labels.numpy()
        classes = [np.bincount(labels[p], minlength=10).tolist() for p in setup.parts]
        emit(rows, {"sizes": sizes, "steps": steps, "per_round_steps": per_round}, out)
        emit(rows, {"classes_per_client": classes}, out)
        return 0

    model = setup.new_model()
    torch.manual_seed(args.seed)
    for mod in model.modules():
        if "linear_default" in args.variant and isinstance(mod, nn.Linear):
            mod.reset_parameters()
        if "no_dropout" in args.variant and isinstance(mod, nn.Dropout):
            mod.p = 0.0
    head["variant"] = args.variant
    if args.stage == "central":
        lr = args.lr if args.lr is not None else float(fl.lr)
        bs = args.batch or int(fl.batch_size)
        emit(rows, {**head, "lr": lr, "batch": bs, "epoch": 0, **scores(model, val)}, out)
        opt: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=lr, momentum=float(fl.momentum)
        )
        g = torch.Generator().manual_seed(args.seed)
        n = len(setup.train)
        for ep in range(1, args.epochs + 1):
            model.train()
            c0, w0 = time.process_time(), time.perf_counter()
            perm = torch.randperm(n, generator=g)
            for s in range(0, n, bs):
                idx = perm[s : s + bs]
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(setup.train.inputs(idx)), setup.train.labels[idx])
                loss.backward()
                opt.step()
            emit(
                rows,
                {
                    "epoch": ep,
                    "steps": ep * ((n + bs - 1) // bs),
                    "loss_last": float(loss.detach()),
                    **scores(model, val),
                    "cpu_s": round(time.process_time() - c0, 1),
                    "wall_s": round(time.perf_counter() - w0, 1),
                },
                out,
            )
        return 0

    # fl: the product's trainer and aggregation, scored three ways per round
    local = LocalConfig.from_config(fl)
    trainer = make_trainer(
        "sequential", setup.new_model(), setup.train, setup.parts, local, args.seed
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    sizes = setup.data_sizes
    emit(rows, {"round": 0, **scores(model, val)}, out)
    for t in range(1, args.rounds + 1):
        c0, w0 = time.process_time(), time.perf_counter()
        cl = select_clients(args.seed, t, len(setup.parts), int(fl.clients_per_round))
        states = trainer.train(state, cl, t)
        state = aggregate(states, {n: sizes[n] for n in cl})
        model.load_state_dict(state)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        emit(
            rows,
            {
                "round": t,
                **scores(model, val),
                **bn_gap(model, val),
                "train_cpu_s": round(cpu, 1),
                "train_wall_s": round(wall, 1),
            },
            out,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
