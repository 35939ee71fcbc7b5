"""Table II: methods x (datasets x models) x scenarios x seeds, on the experiment harness.

Layout of ``OUT`` (``--out``)::

    config.yaml                         the resolved experiment config
    runs/<dataset>-<model>-a<alpha>-s<seed>/    one trained FL run, shared by all its cells
    cells/<dataset>/<model>/a<alpha>/s<seed>/<scenario>/<method>/
        result.json                     UnlearnResult (schema 1) -- the cell is finished
        error.json, traceback.txt       the cell failed (retried on the next invocation)
    table2.md, table2.csv               RA, FA, Avg AoI per method: mean +- std, delta to Retrain
    figures/*.png                       PPO convergence, layer sensitivity, Sum AoI, RA/FA vs alpha
    summary.json                        status and wall time of every cell

The cells run on :mod:`scaleflu.experiments.harness` (resumable cell by cell). The main table
uses ``data.alpha``; the ``experiment.alpha_sweep`` adds cells for other Dirichlet alphas (same
methods/scenarios machinery, shared runs and cells where they coincide).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from scaleflu.config import ConfigError, as_config, merge, save_config
from scaleflu.experiments.cells import plan_cells
from scaleflu.experiments.harness import MethodFactory, default_factory, run_cells
from scaleflu.experiments.report import write_report
from scaleflu.unlearn.registry import canonical_name

log = logging.getLogger(__name__)


def _check_methods(names: Iterable[str]) -> None:
    """Every method name is registered (before any run is trained)."""
    for name in names:
        try:
            canonical_name(str(name))
        except ValueError as exc:
            raise ConfigError(f"experiment.methods: {exc}") from None


def run_table2(
    cfg: Mapping[str, Any],
    out: str | Path,
    factory: MethodFactory = default_factory,
    progress: bool = True,
    report: bool = True,
) -> dict[str, Any]:
    """Plan, run the unfinished cells, then write the table, CSV, figures and summary."""
    cfg = as_config(cfg)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    main, sweep = plan_cells(cfg)
    if factory is default_factory:
        _check_methods(sorted({c.method for c in main + sweep}))
    t0 = time.perf_counter()
    status = run_cells(cfg, out, main, factory, progress)
    if sweep:
        # the alpha sweep's cells (the RA/FA-vs-alpha figure) audit membership only when asked
        scfg = cfg
        if not bool(cfg.experiment.alpha_sweep.get("audit", False)):
            scfg = as_config(merge(cfg, {"scale": {"eval": {"audit": {"shadows": 0}}}}))
        status.update(run_cells(scfg, out, sweep, factory, progress, desc="alpha sweep"))
    wall = time.perf_counter() - t0
    summary: dict[str, Any] = {
        "cells": len(status),
        "done": sum(1 for s in status.values() if s["status"] == "done"),
        "failed": sorted(k for k, s in status.items() if s["status"] == "failed"),
        "wall_s": wall,
        "status": status,
    }
    prev = out / "summary.json"
    if prev.is_file():
        try:
            summary["previous_wall_s"] = json.loads(prev.read_text()).get("total_wall_s")
        except ValueError:
            pass
    summary["total_wall_s"] = wall + float(summary.get("previous_wall_s") or 0.0)
    tmp = out / f"summary.json.{os.getpid()}.tmp"  # processes sharing --out: never a torn file
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(prev)
    if report:
        summary["report"] = {k: str(v) for k, v in write_report(cfg, out).items()}
    log.info(
        "table2: %d cells done, %d failed, %.1fs -> %s",
        summary["done"],
        len(summary["failed"]),
        wall,
        out,
    )
    return summary
