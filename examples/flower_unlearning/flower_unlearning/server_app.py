"""ServerApp: Flower's FedAvg wrapped by SCALE's UnlearningStrategy; the requests served at
the end with SCALE beside Retrain and the fine-tune control."""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flower_unlearning.task import federation_config
from scaleflu.flower import UnlearningStrategy
from scaleflu.log import fmt

log = logging.getLogger("flower_unlearning")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg for ``num-server-rounds`` rounds, recorded; serve the clients' requests."""
    rc = context.run_config
    cfg = federation_config(rc)
    clients, per_round = int(cfg.data.num_clients), int(cfg.fl.clients_per_round)
    inner = FedAvg(
        fraction_train=per_round / clients,
        fraction_evaluate=0.0,
        min_train_nodes=per_round,
        min_available_nodes=clients,
    )
    run_dir = str(rc.get("run-dir", "")) or str(
        Path("flower-unlearning-runs") / time.strftime("%Y%m%d-%H%M%S")
    )
    strategy = UnlearningStrategy(
        inner,
        run_dir,
        cfg,
        method=str(rc.get("method", "scale")),
        compare=[m for m in str(rc.get("compare", "")).split(",") if m],
        unlearn_overrides=shlex.split(str(rc.get("unlearn-set", ""))),
    )
    strategy.start(
        grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=int(rc["num-server-rounds"])
    )
    for served in strategy.served:
        print(f"\nrequest {served.text}: deployed {served.deployed}")
        for row in served.audit:
            print(
                f"  {row['label']:<10} RA {fmt(row['RA'])}  FA {fmt(row['FA'])}  "
                f"AoI {fmt(row['AoI_s'])} s  test {fmt(row['test_acc'])}  "
                f"wall {fmt(row['wall_s'])} s  link {fmt(row['link_s'])} s"
            )
    print(f"run recorded in {Path(run_dir).resolve()}")
