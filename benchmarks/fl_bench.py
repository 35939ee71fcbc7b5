"""FedAvg throughput: scaleflu (vmap and sequential trainers) vs Flower simulation vs plain torch.

Setup (the same for every contender): LeNet-5 on FashionMNIST (60000 training images), 100
clients from a Dirichlet(alpha) split, 10 clients per round, E=1 local epoch, batch 64, SGD
lr 0.01, one torch intra-op thread per training process. Timed: training and aggregation
only (no per-round evaluation); each contender's final model is evaluated once afterwards as a
sanity check. "Steady" rounds/s excludes the first round (warm-up: Ray start, JIT, caches);
"total" includes start-up.

Flower runs its Simulation Runtime (Ray backend, ``run_simulation``) with the Message API
FedAvg strategy (``fraction_train=0.1``) and a ClientApp doing the same local SGD as the plain
loop, with two virtual-client actors (one per core).

Run by hand: ``PYTHONPATH=python .venv/bin/python benchmarks/fl_bench.py [--rounds 20]``;
writes ``benchmarks/results/fl_bench.json``.

**The same unlearning request, through Flower and through our runtime** (``--only unlearn
[--repeat 3] [--unlearn-rounds 5] [--engine ray|inprocess]``; writes
``benchmarks/results/fl_bench_unlearn.json``): FedAvg on FashionMNIST (10 clients, 5 per
round, Dirichlet 1.0, client 2 with a backdoor, LeNet-5), client 2 asks to be forgotten.
Flower: the app of ``examples/flower_unlearning`` (Flower's FedAvg wrapped by
``scaleflu.flower.UnlearningStrategy``) in Flower's simulation engine (Ray, two actors) or
through ``InProcessGrid``; the strategy serves the request with SCALE, Retrain and the
fine-tune control after the last round. Ours: ``scaleflu train`` then ``scaleflu unlearn``
once per method, each a process of its own, as a user runs them. Interleaved (the order
alternates per repetition); per method the results side by side and the times: training
(Flower: start to the last round's record; ours: the ``train`` process), serving (Flower:
the last round's record to the side-by-side file; ours: the ``unlearn`` processes) and each
method's own ``cost.wall_s``. On a GPU, the batched (vmap) trainer against the
sequential one, interleaved: ``fl_bench.py --device cuda --only vmap sequential --repeat 3
[--model mobilenetv3]`` (``speedup.vmap_vs_sequential``: per-repeat ratios and their range).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from scaleflu.config import load_config
from scaleflu.fl.data import load_fashion_mnist, partition_dirichlet
from scaleflu.fl.fedavg import derive_seed, evaluate, select_clients
from scaleflu.fl.models import build_model
from scaleflu.fl.run import train

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("fl_bench")

NUM_CLIENTS, PER_ROUND, EPOCHS, BATCH, LR, ALPHA, SEED = 100, 10, 1, 64, 0.01, 1.0, 0


def _summary(name: str, stamps: list[float], start: float, test_acc: float) -> dict[str, Any]:
    """Rounds/s from per-round completion timestamps (stamps[0] = start of round 1)."""
    per_round = np.diff(stamps).tolist()
    steady = per_round[1:] if len(per_round) > 1 else per_round
    return {
        "name": name,
        "rounds": len(per_round),
        "steady_s_per_round": statistics.mean(steady),
        "steady_rounds_per_s": 1.0 / statistics.mean(steady),
        "first_round_s": per_round[0],
        "total_s_incl_startup": stamps[-1] - start,
        "total_rounds_per_s": len(per_round) / (stamps[-1] - start),
        "test_acc": test_acc,
        "load_avg_1min_at_end": os.getloadavg()[0],  # the box is shared: context for the numbers
    }


# ----------------------------------------------------------------------------- scaleflu


def bench_scaleflu(
    trainer: str, rounds: int, workers: int = 1, device: str = "cpu", model: str = "lenet"
) -> dict[str, Any]:
    """Our runtime through the public ``train`` API (history store included) on ``device``."""
    cfg = load_config(
        None,
        [
            f"seed={SEED}",
            f"data.num_clients={NUM_CLIENTS}",
            f"data.alpha={ALPHA}",
            f"fl.clients_per_round={PER_ROUND}",
            f"fl.local_epochs={EPOCHS}",
            f"fl.batch_size={BATCH}",
            f"fl.lr={LR}",
            f"fl.rounds={rounds}",
            f"fl.eval_every={10**6}",
            f"fl.trainer={trainer}",
            "fl.threads=1",
            f"fl.workers={workers}",
            f"fl.device={device}",
            f"model.name={model}",
        ],
    )
    load_fashion_mnist()  # parse the files before timing (all contenders get data in memory)
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = train(
            cfg,
            Path(tmp) / "run",
            progress=False,
            callbacks=[lambda t, row: stamps.append(time.perf_counter())],
        )
    # Round 1 began wall_s (its own measured time) before its completion stamp.
    round1_start = stamps[0] - result.metrics[0]["wall_s"]
    name = f"scaleflu-{trainer}" + (f"-{workers}threads" if workers > 1 else "")
    if device != "cpu" or model != "lenet":
        name += f"-{model}-{device}"
    out = _summary(name, [round1_start, *stamps], start, result.final_acc)
    out.update(device=device, model=model)
    return out


# ----------------------------------------------------------------------------- plain torch


def _local_sgd(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
    """Textbook local training: DataLoader-free shuffled minibatch SGD over in-memory tensors."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), BATCH):
            b = perm[i : i + BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()


def bench_plain(rounds: int) -> dict[str, Any]:
    """A plain sequential PyTorch FedAvg loop (no history, no framework)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    train_set, test_set = load_fashion_mnist()
    parts = partition_dirichlet(train_set.labels.numpy(), NUM_CLIENTS, ALPHA, SEED)
    x_all, y_all = train_set.inputs(), train_set.labels
    torch.manual_seed(derive_seed(SEED, 0))  # the initial model scaleflu uses
    model = build_model("lenet", 10, 1, 28)
    glob = {k: v.clone() for k, v in model.state_dict().items()}
    stamps = [time.perf_counter()]
    for t in range(1, rounds + 1):
        clients = select_clients(SEED, t, NUM_CLIENTS, PER_ROUND)
        total = sum(len(parts[n]) for n in clients)
        acc = {k: torch.zeros_like(v) for k, v in glob.items()}
        for n in clients:
            model.load_state_dict(glob)
            idx = torch.as_tensor(parts[n])
            _local_sgd(model, x_all[idx], y_all[idx], seed=t * 1000 + n)
            w = len(parts[n]) / total
            for k, v in model.state_dict().items():
                acc[k] += w * v
        glob = acc
        stamps.append(time.perf_counter())
    model.load_state_dict(glob)
    return _summary("plain-torch", stamps, start, evaluate(model, test_set)["acc"])


# ----------------------------------------------------------------------------- Flower


def _flower_apps(rounds: int, stamps: list[float]) -> tuple[Any, Any, list[Any]]:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    client_app = ClientApp()
    cache: dict[str, Any] = {}

    @client_app.train()
    def client_train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        if "x" not in cache:  # once per actor process: data in memory like everyone else
            train_set, _ = load_fashion_mnist()
            cache["x"], cache["y"] = train_set.inputs(), train_set.labels
            cache["parts"] = partition_dirichlet(train_set.labels.numpy(), NUM_CLIENTS, ALPHA, SEED)
            cache["model"] = build_model("lenet", 10, 1, 28)
        pid = int(context.node_config["partition-id"])
        model = cache["model"]
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        idx = torch.as_tensor(cache["parts"][pid])
        _local_sgd(model, cache["x"][idx], cache["y"][idx], seed=pid)
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord({"num-examples": len(idx)}),
            }
        )
        return Message(content=content, reply_to=msg)

    server_app = ServerApp()
    final: list[Any] = []

    @server_app.main()
    def server_main(grid: Grid, context: Context) -> None:
        torch.manual_seed(derive_seed(SEED, 0))  # the initial model scaleflu uses
        model = build_model("lenet", 10, 1, 28)
        strategy = FedAvg(
            fraction_train=PER_ROUND / NUM_CLIENTS,
            fraction_evaluate=0.0,
            min_train_nodes=PER_ROUND,
            min_available_nodes=NUM_CLIENTS,
        )

        def timer(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            stamps.append(time.perf_counter())  # before round 1 and after every round
            return None

        result = strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=rounds,
            evaluate_fn=timer,
        )
        final.append(result.arrays.to_torch_state_dict())

    return server_app, client_app, final


def bench_flower(rounds: int) -> dict[str, Any]:
    """Flower's Simulation Runtime (Ray backend), 100 virtual SuperNodes."""
    from flwr.simulation import run_simulation

    paths = [str(ROOT / "python"), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    import fl_bench as me  # the apps must be importable by the Ray actors (not __main__)

    stamps: list[float] = []
    server_app, client_app, final = me._flower_apps(rounds, stamps)
    start = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=NUM_CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": os.cpu_count() or 2, "include_dashboard": False},
        },
    )
    _, test_set = load_fashion_mnist()
    model = build_model("lenet", 10, 1, 28)
    model.load_state_dict(final[0])
    return _summary("flower-simulation", stamps, start, evaluate(model, test_set)["acc"])


# ----------------------------------------------------------------------------- unlearning

UNLEARN_FED = (
    "seed=0 data.num_clients=10 data.train_subset=10000 data.test_subset=2000 "
    "data.partition=dirichlet data.alpha=1.0 data.poison.backdoor_clients=[2] "
    "data.poison.backdoor_fraction=0.3 fl.clients_per_round=5 fl.local_epochs=1 fl.lr=0.02 "
    "fl.momentum=0.5 fl.batch_size=32 fl.trainer=sequential fl.threads=1"
)
UNLEARN_SET = "scale.eval.relearn_max_rounds=0"
UNLEARN_CLIENT = 2
UNLEARN_METHODS = ("retrain", "finetune", "scale")
EXAMPLE = ROOT / "examples" / "flower_unlearning"


def _unlearn_run_config(rounds: int, run_dir: Path) -> dict[str, Any]:
    return {
        "num-server-rounds": rounds,
        "scaleflu-set": UNLEARN_FED,
        "unlearn-set": UNLEARN_SET,
        "forget-client": UNLEARN_CLIENT,
        "forget-request": "client",
        "forget-round": rounds,
        "method": "scale",
        "compare": "retrain,finetune",
        "run-dir": str(run_dir),
    }


def _example_apps(rc: dict[str, Any]) -> tuple[Any, Any]:
    """The example's ServerApp and ClientApp with ``rc`` as their run config (what ``flwr run
    --run-config`` gives them; ``run_simulation`` takes none)."""
    from flower_unlearning import client_app as example_client
    from flower_unlearning import server_app as example_server
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    from scaleflu.flower.wire import REGISTER_ACTION

    client = ClientApp()

    def with_config(msg: Any, context: Any) -> Any:
        # Flower forbids changing a Context's run config: the app gets a view with ``rc``
        # (the same node state, so its requests persist)
        view = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=context.node_config,
            state=context.state,
            run_config={**context.run_config, **rc},
        )
        return example_client.app(msg, view)

    client.train()(with_config)
    client.query(REGISTER_ACTION)(with_config)
    server = ServerApp()

    @server.main()
    def main(grid: Any, context: Any) -> None:
        view = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config=context.node_config,
            state=context.state,
            run_config={**context.run_config, **rc},
        )
        example_server.app(grid, view)

    return server, client


def _flower_unlearning(rounds: int, work: Path, engine: str) -> dict[str, Any]:
    """The example app under the UnlearningStrategy; the strategy serves client 2."""
    run_dir = work / "flower"
    rc = _unlearn_run_config(rounds, run_dir)
    start = time.perf_counter()
    t_wall0 = time.time()
    if engine == "ray":
        from flwr.simulation import run_simulation

        import fl_bench as me  # the apps must be importable by the Ray actors

        server, client = me._example_apps(rc)
        run_simulation(
            server_app=server,
            client_app=client,
            num_supernodes=10,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"num_cpus": os.cpu_count() or 2, "include_dashboard": False},
            },
        )
    else:
        from flwr.app import Context, RecordDict

        from scaleflu.flower.grid import InProcessGrid

        server, client = _example_apps(rc)
        grid = InProcessGrid(client, 10, rc)
        server(
            grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=rc)
        )
    total = time.perf_counter() - start
    trained = (run_dir / "metrics.csv").stat().st_mtime - t_wall0
    served = (run_dir / "unlearn" / "side_by_side.json").stat().st_mtime - t_wall0
    results = {
        m: json.loads(
            (run_dir / "unlearn" / f"client-{UNLEARN_CLIENT}-{m}" / "result.json").read_text()
        )
        for m in UNLEARN_METHODS
    }
    return {"total_s": total, "train_s": trained, "serve_s": served - trained, "results": results}


def _scaleflu_cli(*argv: str) -> float:
    """Run ``scaleflu ARGV`` as a process; its wall time."""
    cmd = [sys.executable, "-c", "import sys; from scaleflu.cli import main; sys.exit(main())"]
    t0 = time.perf_counter()
    subprocess.run([*cmd, *argv], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def _ours_unlearning(rounds: int, work: Path) -> dict[str, Any]:
    """``scaleflu train`` then ``scaleflu unlearn`` per method, as a user runs them."""
    import shlex

    run_dir = work / "ours"
    sets = [x for o in [*shlex.split(UNLEARN_FED), f"fl.rounds={rounds}"] for x in ("--set", o)]
    train_s = _scaleflu_cli("train", *sets, "--out", str(run_dir))
    serve: dict[str, float] = {}
    results = {}
    for m in UNLEARN_METHODS:
        out = work / "ours-unlearn" / m
        serve[m] = _scaleflu_cli(
            "unlearn",
            "--run",
            str(run_dir),
            "--request",
            f"client:{UNLEARN_CLIENT}",
            "--method",
            m,
            "--set",
            UNLEARN_SET,
            "--out",
            str(out),
            "--no-progress",
        )
        results[m] = json.loads((out / "result.json").read_text())
    return {
        "total_s": train_s + sum(serve.values()),
        "train_s": train_s,
        "serve_s": sum(serve.values()),
        "serve_process_s": serve,
        "results": results,
    }


UNLEARN_KEYS = ("test_acc", "ra", "fa", "fa_protocol", "backdoor_asr")


def bench_unlearning(rounds: int, repeat: int, engine: str, out: Path) -> dict[str, Any]:
    """Interleaved: the request through Flower and through ``scaleflu unlearn``."""
    paths = [str(ROOT / "python"), str(ROOT / "benchmarks"), str(EXAMPLE)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])
    sys.path[:0] = [p for p in paths if p not in sys.path]
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_fashion_mnist()
    runs = []
    for rep in range(repeat):
        order = ("flower", "ours") if rep % 2 == 0 else ("ours", "flower")
        row: dict[str, Any] = {"repeat": rep, "order": order}
        for who in order:
            with tempfile.TemporaryDirectory() as tmp:
                if who == "flower":
                    row[who] = _flower_unlearning(rounds, Path(tmp), engine)
                else:
                    row[who] = _ours_unlearning(rounds, Path(tmp))
            log.info(
                "rep %d %s: train %.1f s, serve %.1f s",
                rep,
                who,
                row[who]["train_s"],
                row[who]["serve_s"],
            )
        for m in UNLEARN_METHODS:
            f, o = row["flower"]["results"][m], row["ours"]["results"][m]
            row.setdefault("max_abs_metric_diff", {})[m] = max(
                abs((f["metrics"][k] or 0.0) - (o["metrics"][k] or 0.0)) for k in UNLEARN_KEYS
            )
        runs.append(row)

    def rng(xs: list[float]) -> dict[str, float]:
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}

    side = {}
    for m in UNLEARN_METHODS:
        side[m] = {
            who: {
                **{k: runs[0][who]["results"][m]["metrics"][k] for k in UNLEARN_KEYS},
                "aoi_mean_s": runs[0][who]["results"][m]["aoi"]["mean_s"],
                "method_wall_s": rng([r[who]["results"][m]["cost"]["wall_s"] for r in runs]),
                "method_cpu_s": rng([r[who]["results"][m]["cost"]["cpu_s"] or 0.0 for r in runs]),
            }
            for who in ("flower", "ours")
        }
        side[m]["max_abs_metric_diff"] = max(r["max_abs_metric_diff"][m] for r in runs)
    report = {
        "setup": {
            "federation": UNLEARN_FED,
            "unlearn": UNLEARN_SET,
            "rounds": rounds,
            "request": f"client:{UNLEARN_CLIENT}",
            "engine": engine,
            "repeat": repeat,
            "flwr": __import__("flwr").__version__,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_avg_at_end": os.getloadavg(),
        },
        "side_by_side": side,
        "times": {
            who: {k: rng([r[who][k] for r in runs]) for k in ("train_s", "serve_s", "total_s")}
            for who in ("flower", "ours")
        },
        "runs": [
            {
                k: (
                    {kk: vv for kk, vv in v.items() if kk != "results"}
                    if isinstance(v, dict) and "results" in v
                    else v
                )
                for k, v in r.items()
            }
            for r in runs
        ],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    log.info("wrote %s", out)
    return report


# ----------------------------------------------------------------------------- main


def main() -> int:
    """Run the contenders (interleaved when repeated) and write the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--only",
        nargs="*",
        default=["vmap", "sequential", "sequential2", "plain", "flower"],
        help="subset of: vmap sequential sequential2 plain flower | unlearn (alone)",
    )
    parser.add_argument("--unlearn-rounds", type=int, default=5)
    parser.add_argument("--engine", choices=("ray", "inprocess"), default="ray")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "fl_bench.json"
    )
    parser.add_argument(
        "--device", default="cpu", help="fl.device of the scaleflu contenders (cpu | cuda | auto)"
    )
    parser.add_argument("--model", default="lenet", help="model.name of the scaleflu contenders")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    if "unlearn" in args.only:
        out = args.out.with_name("fl_bench_unlearn.json")
        bench_unlearning(args.unlearn_rounds, args.repeat, args.engine, out)
        return 0
    runners = {
        "vmap": lambda: bench_scaleflu("vmap", args.rounds, 1, args.device, args.model),
        "sequential": lambda: bench_scaleflu("sequential", args.rounds, 1, args.device, args.model),
        "sequential2": lambda: bench_scaleflu(
            "sequential", args.rounds, 2, args.device, args.model
        ),
        "plain": lambda: bench_plain(args.rounds),
        "flower": lambda: bench_flower(args.rounds),
    }
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        for key in args.only:
            res = runners[key]()
            res["repeat"] = rep
            log.info("%s", json.dumps(res))
            runs.append(res)
    best: dict[str, dict[str, Any]] = {}
    for r in runs:  # per contender, the repetition with the best steady rate
        if (
            r["name"] not in best
            or r["steady_rounds_per_s"] > best[r["name"]]["steady_rounds_per_s"]
        ):
            best[r["name"]] = r
    flower = best.get("flower-simulation")
    speedups = {}
    if flower:
        for name, r in best.items():
            speedups[name] = {
                "steady_vs_flower": r["steady_rounds_per_s"] / flower["steady_rounds_per_s"],
                "total_vs_flower": r["total_rounds_per_s"] / flower["total_rounds_per_s"],
            }
    # batched (vmap) vs sequential trainer, per interleaved repetition: ratio and its range
    vs_seq = [
        v["steady_rounds_per_s"] / q["steady_rounds_per_s"]
        for v in runs
        if v["name"].startswith("scaleflu-vmap")
        for q in runs
        if q["name"].startswith("scaleflu-sequential")
        and "threads" not in q["name"]
        and q["repeat"] == v["repeat"]
    ]
    if vs_seq:
        speedups["vmap_vs_sequential"] = {
            "per_repeat": vs_seq,
            "min": min(vs_seq),
            "max": max(vs_seq),
            "median": statistics.median(vs_seq),
        }
    report = {
        "setup": {
            "model": "lenet",
            "dataset": "fashion_mnist",
            "num_clients": NUM_CLIENTS,
            "clients_per_round": PER_ROUND,
            "local_epochs": EPOCHS,
            "batch_size": BATCH,
            "lr": LR,
            "dirichlet_alpha": ALPHA,
            "rounds": args.rounds,
            "torch_threads_per_process": 1,
            "device": args.device,
            "scaleflu_model": args.model,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_avg_at_end": os.getloadavg(),
        },
        "runs": runs,
        "best": best,
        "speedup": speedups,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
