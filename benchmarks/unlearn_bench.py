"""SCALE vs Retrain on LeNet / FashionMNIST at a CPU-sized config, with default-mode ablations.

Run by hand (minutes on 2 CPU cores):

    .venv/bin/python benchmarks/unlearn_bench.py [--out benchmarks/results] [--quick]

Trains one poisoned federation (backdoor client, label-flip client), then for the client,
class and sample scenarios runs Retrain, SCALE default, SCALE paper and the default mode with
each addition removed (no budget, no utility term, no recovery rounds). Writes
``unlearn_bench.json`` (every UnlearnResult) and ``unlearn_bench.md`` (the table).
``--size paper`` trains at the paper's training size instead and runs Retrain and SCALE default
for the client and class scenarios (``unlearn_bench_paper.*``; about half an hour on 2 cores).

``--sweep`` runs the seeded sweep instead (:mod:`scaleflu.experiments.sweep`): for every seed
and Dirichlet alpha (``--seeds``, ``--alphas``; default 10 x 0.1/0.3/0.5) a fresh CPU-sized
federation whose backdoor client, label-flip client and forgotten class are drawn from the seed
(not chosen by hand), each request kind unlearned by Retrain, SCALE default and the fine-tune
control; plus ``--demo-seeds`` federations of the demo's scenario (``make demo``'s settings: 3
robots, 3 rounds, the largest robot backdoored and forgotten). Every federation is written to
``unlearn_sweep/<setting>-s<seed>.json`` and the sweep is summarised as min / median / max per
setting in ``unlearn_sweep.md`` (and ``.json``).

Both run their unlearnings as cells of the experiment harness
(:mod:`scaleflu.experiments.harness`, as ``scaleflu experiment table2`` does): trained runs and
finished cells under ``--work`` are reused by the next call, which resumes where one stopped;
remove ``--work`` (or its ``cpu``, ``paper`` or ``sweep`` folder) to measure afresh.

Targets: |RA - RA_retrain| <= 0.02, FA <= FA_retrain + 0.02 and SCALE's wall time <= 5 % of
Retrain's. The config is far smaller than the paper's (N=100, T=100, E=10, 800 PPO episodes);
the output says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from scaleflu.config import as_config, default_config, load_config, merge
from scaleflu.experiments.cells import Cell, RunKey, read_result
from scaleflu.experiments.harness import Variant, run_cells
from scaleflu.experiments.sweep import (
    Federation,
    collect,
    cpu_federation,
    federation_config,
    federation_path,
    fmt_value,
    run_federation,
    sweep_table,
)

log = logging.getLogger("unlearn_bench")

RUN = [
    "seed=0",
    "data.num_clients=10",
    "data.train_subset=12000",
    "data.test_subset=3000",
    "data.partition=dirichlet",
    "data.alpha=1.0",
    "data.poison.backdoor_clients=[3]",
    "data.poison.backdoor_fraction=0.3",
    "data.poison.label_flip_clients=[5]",
    "data.poison.label_flip_fraction=0.2",
    "fl.rounds=20",
    "fl.local_epochs=2",
    "fl.lr=0.02",
    "fl.momentum=0.9",
    "fl.batch_size=32",
    "fl.clients_per_round=10",
    "fl.trainer=sequential",
]
SCALE = ["scale.ppo.episodes=50", "scale.ppo.n_steps=64", "scale.ppo.batch_size=32"]
# sample: client 3's triggered samples (30 % of its data); client 3 stays with its clean rest.
SCENARIOS = [("client", "client:3"), ("class", "class:7"), ("sample", "sample:3:0.3")]
VARIANTS: list[tuple[str, str, list[str]]] = [
    ("retrain", "default", []),
    ("scale-default", "default", []),
    ("scale-paper", "paper", []),
    ("no-budget", "default", ["scale.budget=null"]),
    ("no-utility", "default", ["scale.w_u=0"]),
    ("no-recovery", "default", ["scale.recovery_rounds=0"]),
    ("no-keep-best", "default", ["scale.keep_best=false"]),
    ("exact-utility", "default", ["scale.utility_samples=null"]),
    ("recovery-1-epoch", "default", ["scale.recovery_local_epochs=1"]),  # cheaper, not an ablation
    (
        "plain-attribution",
        "default",
        ["scale.client_attribution=contribution", "scale.class_attribution=contribution"],
    ),
]
# --size paper: the paper's training size (N=100, T=100, E=10, B=64, Table I's 800 PPO
# episodes) on the whole FashionMNIST, for the time ratio where Retrain costs what it costs
# there. Deviations: Dirichlet alpha 0.3 (the paper's experiments), lr 0.01 with momentum 0.9
# (Table I's 0.001 plain SGD learns too little in 100 rounds of LeNet), 2 trainer threads.
PAPER_RUN = [
    "seed=0",
    "data.num_clients=100",
    "data.partition=dirichlet",
    "data.alpha=0.3",
    "data.poison.backdoor_clients=[0]",
    "data.poison.backdoor_fraction=1.0",
    "data.poison.trigger_size=5",
    "fl.rounds=100",
    "fl.local_epochs=10",
    "fl.lr=0.01",
    "fl.momentum=0.9",
    "fl.batch_size=64",
    "fl.clients_per_round=10",
    "fl.trainer=sequential",
    "fl.workers=2",
]
PAPER_SCALE = ["scale.val_size=500", "scale.eval.max_samples=4000", "scale.eval.mia_samples=1000"]
PAPER_SCENARIOS = [("client", "client:0"), ("class", "class:1")]
PAPER_VARIANTS = [("retrain", "default", []), ("scale-default", "default", [])]
KEYS = ("test_acc", "ra", "fa", "fa_protocol", "fr", "mia_loss_auc", "backdoor_asr")


def _variant(mode: str, extra: list[str], name: str) -> Variant:
    if name == "retrain":
        return Variant("retrain")
    return Variant("scale", tuple(extra), (("mode", mode),))


def run_variants(
    args: argparse.Namespace,
    run_over: list[str],
    scale_over: list[str],
    scenarios: list[tuple[str, str]],
    variants: list[tuple[str, str, list[str]]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every (scenario, variant) as a cell of the harness: the results in that order, and the
    error of each failed cell (recorded in its folder; the others go on)."""
    cfg = as_config(load_config(None, [*run_over, *scale_over, f"fl.threads={args.threads}"]))
    cfg["experiment"]["scenarios"] = dict(scenarios)  # these scenarios only
    key = RunKey(str(cfg.data.dataset), str(cfg.model.name), float(cfg.data.alpha), int(cfg.seed))
    cells = [Cell(key, scen, name) for scen, _ in scenarios for name, _, _ in variants]
    work = Path(args.work) / args.size
    status = run_cells(
        cfg,
        work,
        cells,
        progress=True,
        variants={name: _variant(mode, extra, name) for name, mode, extra in variants},
        desc="unlearn_bench",
    )
    failed = {k: st.get("error", "?") for k, st in status.items() if st["status"] != "done"}
    results = []
    for c in cells:
        res = read_result(c.dir(work) / "result.json")
        if res is None:  # failed: its error is in failed
            continue
        res["variant"], res["scenario"] = c.method, c.scenario
        res.pop("config", None)
        for k in ("episode_infos", "rollout"):
            res.get("details", {}).pop(k, None)
        results.append(res)
        m = res["metrics"]
        log.info(
            "%s %s: acc %.3f RA %.3f FA %.3f FA_protocol %s wall %.1fs",
            c.scenario,
            c.method,
            m["test_acc"],
            m["ra"],
            m["fa"],
            fmt_value(m["fa_protocol"]),
            res["cost"]["wall_s"],
        )
    for cell, err in failed.items():
        log.error("%s failed: %s", cell, err)
    return results, failed


# --------------------------------------------------------------------------- --sweep


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def demo_federation(seed: int, scale_set: list[str]) -> Federation:
    """``make demo``'s federation (launcher.DEMO_SETTINGS, 3 robots, 3 rounds) for a seed."""
    from scaleflu.testbed.launcher import DEMO_SETTINGS, largest_robot

    demo = json.loads(json.dumps(DEMO_SETTINGS))
    demo["seed"] = seed
    demo["data"]["num_clients"] = 3
    demo["fl"]["clients_per_round"] = 3
    demo["fl"]["rounds"] = 3
    demo["fl"]["trainer"] = "sequential"
    cfg = as_config(merge(default_config(), demo))  # checked, with attribute access
    robot = largest_robot(cfg)
    cfg["data"]["poison"]["backdoor_clients"] = [robot - 1]
    demo_scale = [f"scale.{k}={json.dumps(v)}" for k, v in _flat(DEMO_SETTINGS["scale"]).items()]
    requests = [("client", f"client:{robot - 1}")]
    fed_cfg = federation_config(cfg, [], requests, [*demo_scale, *scale_set])
    return Federation("demo", seed, fed_cfg, {"backdoor_client": robot - 1})


def sweep_federations(args: argparse.Namespace) -> list[Federation]:
    """Every federation of the sweep: the CPU-sized ones per alpha and seed, then the demo's."""
    out = [
        cpu_federation(seed, alpha, args.threads, args.scale_set, args.quick)
        for alpha in [float(a) for a in args.alphas.split(",") if a]
        for seed in range(args.seeds)
    ]
    return out + [demo_federation(seed, args.scale_set) for seed in range(args.demo_seeds)]


def _child_argv(args: argparse.Namespace, fed: Federation) -> list[str]:
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--sweep",
        *(["--quick"] if args.quick else []),
        "--one",
        f"{fed.setting}:{fed.seed}",
        "--seeds",
        str(args.seeds),
        "--alphas",
        args.alphas,
        "--demo-seeds",
        str(args.demo_seeds),
        "--out",
        str(args.out),
        "--work",
        str(args.work),
        "--threads",
        str(args.threads),
        *(["--noise-floor"] if args.noise_floor else []),
        *(["--methods", args.methods] if args.methods else []),
    ]
    for item in args.scale_set:
        argv += ["--scale-set", item]
    return argv


def _extra_methods(args: argparse.Namespace) -> list[str]:
    """``--methods``: registered methods run besides Retrain, SCALE and the control."""
    from scaleflu.unlearn.registry import canonical_name

    return [canonical_name(m) for m in (args.methods or "").split(",") if m.strip()]


def sweep(args: argparse.Namespace) -> int:
    """The seeded sweep (see the module docstring): resumable, ``--jobs`` processes."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    feds = sweep_federations(args)
    if args.one:
        setting, seed = args.one.rsplit(":", 1)
        fed = next((f for f in feds if f.setting == setting and f.seed == int(seed)), None)
        if fed is None:
            raise SystemExit(f"--one {args.one}: no such federation in this sweep")
        data = run_federation(
            fed, out, Path(args.work), args.noise_floor, extra=_extra_methods(args)
        )
        return 0 if data["complete"] else 1

    def finished(fed: Federation) -> bool:
        p = federation_path(out, fed)
        return p.is_file() and bool(json.loads(p.read_text()).get("complete"))

    todo = [f for f in feds if not finished(f)]
    if args.limit is not None:
        todo = todo[: args.limit]
    log.info("%d federations, %d to run, %d processes", len(feds), len(todo), args.jobs)
    logs = Path(args.work) / "sweep_logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": "1"}

    def child(fed: Federation) -> tuple[str, int]:
        with open(logs / f"{fed.name}.log", "a") as fh:
            rc = subprocess.call(
                _child_argv(args, fed), stdout=fh, stderr=subprocess.STDOUT, env=env
            )
        log.info("%s finished (exit %d; log %s)", fed.name, rc, logs / f"{fed.name}.log")
        return fed.name, rc

    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for name, rc in pool.map(child, todo):
            if rc:
                failed.append(name)
    command = " ".join([sys.executable, *sys.argv])
    data = collect(out, feds, command, args.threads, args.scale_set)
    (out / "unlearn_sweep.json").write_text(json.dumps(data, indent=1))
    (out / "unlearn_sweep.md").write_text(sweep_table(data))
    log.info("wrote %s (%d rows); failed: %s", out / "unlearn_sweep.md", len(data["rows"]), failed)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Train, unlearn every scenario with every variant, write JSON and markdown."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--work", default="/tmp/scaleflu_unlearn_bench")
    ap.add_argument("--quick", action="store_true", help="fewer rounds/episodes (smoke run)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--size",
        choices=("cpu", "paper"),
        default="cpu",
        help="cpu: the CPU-sized federation with every ablation (default); paper: the paper's "
        "training size, Retrain and SCALE default only (about half an hour on 2 cores)",
    )
    ap.add_argument("--sweep", action="store_true", help="the seeded sweep (module docstring)")
    ap.add_argument("--seeds", type=int, default=10, help="--sweep: seeds per alpha")
    ap.add_argument("--alphas", default="0.1,0.3,0.5", help="--sweep: Dirichlet alphas")
    ap.add_argument("--demo-seeds", type=int, default=10, help="--sweep: demo scenario seeds")
    ap.add_argument(
        "--limit", type=int, default=None, help="--sweep: run at most this many new federations"
    )
    ap.add_argument(
        "--jobs", type=int, default=1, help="--sweep: federations run in parallel (processes)"
    )
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # SETTING:SEED (a child)
    ap.add_argument(
        "--scale-set",
        action="append",
        default=[],
        help="--sweep: a scale.* override for SCALE and the control (repeatable)",
    )
    ap.add_argument(
        "--methods",
        default="",
        help="--sweep: more registered methods per request, comma-separated (e.g. pga,not), "
        "scored against Retrain and the control as SCALE is",
    )
    ap.add_argument(
        "--noise-floor",
        action="store_true",
        help="--sweep: also an independent Retrain (another seed) per request, scored against "
        "the reference Retrain: the spread of Retrain itself (row retrain-b; ra_floor: within "
        "max(0.02, that spread))",
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    if args.sweep:
        return sweep(args)
    paper = args.size == "paper"
    scenarios = PAPER_SCENARIOS if paper else SCENARIOS
    variants = PAPER_VARIANTS if paper else VARIANTS
    run_over = list(PAPER_RUN if paper else RUN)
    scale_over = list(PAPER_SCALE if paper else SCALE)
    if args.quick:
        run_over += ["fl.rounds=6", "data.train_subset=4000"]
        scale_over += ["scale.ppo.episodes=10"]
        if paper:
            run_over += ["fl.local_epochs=1"]
    results, failed = run_variants(args, run_over, scale_over, scenarios, variants)
    header = (
        (
            "The paper's training size (N=100, T=100, E=10, B=64, 10 clients per round, 800 PPO "
            "episodes x 8 steps) on LeNet/whole FashionMNIST, Dirichlet(0.3), lr 0.01 with "
            "momentum 0.9, 2 trainer threads (Retrain too), 1 torch thread each, on "
            f"{platform.processor() or platform.machine()}. Client 0 fully backdoored (5 px "
            "trigger, label 0). "
        )
        if paper
        else (
            "CPU-sized config (NOT the paper's scale): LeNet/FashionMNIST, N=10 Dirichlet(1.0) "
            "clients over 12000 training images, T=20 rounds, E=2, all clients every round, "
            f"PPO {scale_over[0].split('=')[1]} episodes x 8 steps; 1 torch thread on "
            f"{platform.processor() or platform.machine()}. Backdoor client 3 (30 % triggered, "
            "label 0); client 5 has 20 % flipped labels (not used by a scenario: the model "
            "never memorised them, FA on them was 0.03 before unlearning). "
        )
    ) + ("QUICK SMOKE RUN. " if args.quick else "")
    lines = [
        "# SCALE vs Retrain (unlearning benchmark)",
        "",
        header,
        "",
        "| scenario | method | test acc | RA | FA | FA (protocol) | FR | MIA AUC | ASR | "
        "wall s | time/Retrain | CPU/Retrain | bytes/Retrain | dRA | dFA | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict[str, Any] = {}
    for scen, _ in scenarios:
        ref = next(
            (r for r in results if r["scenario"] == scen and r["variant"] == "retrain"), None
        )
        if ref is None:  # no reference: nothing to compare with
            continue
        for r in (r for r in results if r["scenario"] == scen):
            m, rm = r["metrics"], ref["metrics"]
            tr = r["cost"]["wall_s"] / max(ref["cost"]["wall_s"], 1e-9)
            # None where either CPU time was not recorded: no pass (as criteria.sweep_row)
            c_s, ref_s = r["cost"].get("cpu_s"), ref["cost"].get("cpu_s")
            cr = c_s / max(ref_s, 1e-9) if c_s and ref_s else None
            br = r["cost"]["bytes"] / max(ref["cost"]["bytes"], 1)
            d_ra = m["ra"] - rm["ra"]
            fa_key = "fa_protocol" if m.get("fa_protocol") is not None else "fa"
            d_fa = m[fa_key] - rm[fa_key]
            ok = {
                "ra": abs(d_ra) <= 0.02,
                "fa": d_fa <= 0.02,
                "time": tr <= 0.05,
                "cpu": cr is not None and cr <= 0.05,
            }
            r["vs_retrain"] = {
                "time_ratio": tr,
                "cpu_ratio": cr,
                "bytes_ratio": br,
                "d_ra": d_ra,
                "d_fa": d_fa,
            }
            r["targets_met"] = ok
            summary[f"{scen}/{r['variant']}"] = {**r["vs_retrain"], **ok}
            tick = " ".join(f"{k}:{'y' if v else 'n'}" for k, v in ok.items())
            cells = [scen, r["variant"]] + [fmt_value(m[k]) for k in KEYS[:4]]
            cells += [fmt_value(m[k]) for k in ("fr", "mia_loss_auc", "backdoor_asr")]
            cells += [f"{r['cost']['wall_s']:.1f}", f"{tr:.3f}", fmt_value(cr), f"{br:.4f}"]
            cells += [f"{d_ra:+.3f}", f"{d_fa:+.3f}", tick if r["variant"] != "retrain" else ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "FA (protocol): backdoor requests (client, sample) = attack success on the triggered "
        "test set; class = test accuracy on the forgotten class; label-flip samples = accuracy "
        "on the flipped labels. dFA "
        "uses FA (protocol). time/Retrain, CPU/Retrain and bytes/Retrain: wall time, process "
        "CPU time (robust to other jobs on a shared machine) and bytes on the link. The sample "
        "scenario forgets client 3's triggered samples (client 3 stays with its clean rest).",
    ]
    if failed:
        lines += ["", "Failed cells (error.json and traceback.txt in each, under --work):", ""]
        lines += [f"* `{cell}`: {err}" for cell, err in sorted(failed.items())]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "unlearn_bench_paper" if paper else "unlearn_bench"
    (out / f"{stem}.json").write_text(
        json.dumps(
            {
                "note": header,
                "command": " ".join([sys.executable, *sys.argv]),
                "run_overrides": run_over,
                "scale_overrides": scale_over,
                "summary": summary,
                "results": results,
                "failed": failed,
            },
            indent=1,
        )
    )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    log.info("wrote %s", out / f"{stem}.md")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
