"""The example app with the real ``flwr run`` in Flower's simulation engine, beside our runtime.

Starts a SuperLink in simulation mode (Flower's own ``flower-superlink --simulation``, as
``flwr run`` starts one for a local connection; here with its runtime dependency installation
off, since the app's dependencies are the environment's), runs ``flwr run
examples/flower_unlearning`` against it with the run config given, then ``scaleflu train`` and
``scaleflu unlearn`` (library calls) on the same federation, and writes both side by side with
the tail of ``flwr run``'s output to ``benchmarks/results/flower_run.json``.

    PYTHONPATH=python .venv/bin/python benchmarks/flower_run.py [--rounds 3] [--clients 10]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("flower_run")

FED = (
    "seed=0 data.num_clients={n} data.train_subset=6000 data.test_subset=1000 "
    "data.partition=iid data.poison.backdoor_clients=[2] data.poison.backdoor_fraction=0.3 "
    "fl.clients_per_round={k} fl.local_epochs=1 fl.lr=0.02 fl.momentum=0.5 fl.batch_size=32 "
    "fl.trainer=sequential fl.threads=1"
)
UNLEARN = "scale.eval.relearn_max_rounds=0"
METHODS = ("retrain", "finetune", "scale")
KEYS = ("test_acc", "ra", "fa", "fa_protocol", "backdoor_asr")


def _bin(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        raise SystemExit(f"{name} not found: install Flower (pip install 'gr-scaleflu[flower]')")
    return path


def flwr_run(args: argparse.Namespace, work: Path, fed: str) -> dict[str, Any]:
    """``flwr run`` of the example in the simulation engine; its output and the run folder."""
    home = work / "flwr-home"
    home.mkdir()
    port = 39191
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "sim"\n\n[superlink.sim]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]),
        # Flower's processes start others (flower-superexec) by name: this environment's first
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    link_log = open(work / "superlink.log", "w")  # noqa: SIM115
    superlink = subprocess.Popen(
        [
            _bin("flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database",
            str(work / "state.db"),
        ],
        stdout=link_log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    run_dir = work / "flower-run"
    rc = (
        f"num-server-rounds={args.rounds} run-dir='{run_dir}' scaleflu-set='{fed}' "
        f"forget-client=2 forget-round={args.rounds} unlearn-set='{UNLEARN}'"
    )
    try:
        time.sleep(5.0)
        t0 = time.perf_counter()
        out = subprocess.run(
            [
                _bin("flwr"),
                "run",
                str(ROOT / "examples" / "flower_unlearning"),
                "sim",
                "--stream",
                "--run-config",
                rc,
                "--federation-config",
                f"num-supernodes={args.clients}",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(work),
            timeout=args.timeout,
        )
        wall = time.perf_counter() - t0
    finally:
        os.killpg(superlink.pid, 15)
        try:
            superlink.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(superlink.pid, 9)
        link_log.close()
    results = {}
    for m in METHODS:
        path = run_dir / "unlearn" / f"client-2-{m}" / "result.json"
        results[m] = json.loads(path.read_text()) if path.is_file() else None
    command = f'flwr run examples/flower_unlearning sim --stream --run-config "{rc}"'
    return {
        "command": command,
        "rc": out.returncode,
        "wall_s": wall,
        "output_tail": (out.stdout + out.stderr)[-8000:],
        "results": results,
        "run_dir": str(run_dir),
    }


def ours(args: argparse.Namespace, work: Path, fed: str) -> dict[str, Any]:
    """``scaleflu train`` + ``scaleflu unlearn`` on the same federation (library calls)."""
    from scaleflu.cli.unlearn import run_unlearn
    from scaleflu.config import load_config
    from scaleflu.fl.run import train

    t0 = time.perf_counter()
    run_dir = work / "ours"
    train(
        load_config(None, [*shlex.split(fed), f"fl.rounds={args.rounds}"]), run_dir, progress=False
    )
    results = {}
    for m in METHODS:
        out = run_unlearn(
            run_dir, "client:2", method=m, overrides=[UNLEARN], progress=False, evaluate=True
        )
        results[m] = json.loads((out / "result.json").read_text())
    return {"wall_s": time.perf_counter() - t0, "results": results}


def main() -> int:
    """Both paths; ``benchmarks/results/flower_run.json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--per-round", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "flower_run.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    fed = FED.format(n=args.clients, k=args.per_round)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        f = flwr_run(args, work, fed)
        log.info("flwr run: rc %d in %.1f s", f["rc"], f["wall_s"])
        o = ours(args, work, fed)
        log.info("scaleflu train + unlearn: %.1f s", o["wall_s"])
    side = {}
    for m in METHODS:
        fr, orr = f["results"][m], o["results"][m]
        side[m] = {
            "flower": {k: fr["metrics"][k] for k in KEYS} if fr else None,
            "ours": {k: orr["metrics"][k] for k in KEYS},
            "max_abs_diff": max(
                abs((fr["metrics"][k] or 0) - (orr["metrics"][k] or 0)) for k in KEYS
            )
            if fr
            else None,
        }
    import flwr
    import torch

    report = {
        "setup": {
            "federation": fed,
            "unlearn": UNLEARN,
            "rounds": args.rounds,
            "request": "client:2",
        },
        "flwr": flwr.__version__,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "load_avg_at_end": os.getloadavg(),
        },
        "flwr_run": {k: v for k, v in f.items() if k != "results"},
        "ours_wall_s": o["wall_s"],
        "side_by_side": side,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    log.info("side by side: %s", json.dumps(side))
    return 0 if f["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
