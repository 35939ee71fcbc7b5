"""The Table II grid's cells and their results on disk (shared by the harness and the report).

:mod:`scaleflu.experiments.harness` runs cells, :mod:`scaleflu.experiments.report` reads them;
both import this module, neither imports the other at module level.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaleflu.config import ConfigError, as_config
from scaleflu.unlearn.base import SCHEMA_VERSION

__all__ = ["Cell", "RunKey", "plan_cells", "read_result"]


@dataclass(frozen=True, order=True)
class RunKey:
    """One trained FL run: data set, model, Dirichlet alpha, seed."""

    dataset: str
    model: str
    alpha: float
    seed: int

    @property
    def slug(self) -> str:
        """Folder name of the run."""
        return f"{self.dataset}-{self.model}-a{self.alpha:g}-s{self.seed}"


@dataclass(frozen=True, order=True)
class Cell:
    """One unlearning: a method on a scenario of a run."""

    run: RunKey
    scenario: str
    method: str

    def dir(self, out: Path) -> Path:
        """The cell's folder under ``out``."""
        r = self.run
        return (
            out / "cells" / r.dataset / r.model / f"a{r.alpha:g}" / f"s{r.seed}" / self.scenario
        ) / self.method


def plan_cells(cfg: Mapping[str, Any]) -> tuple[list[Cell], list[Cell]]:
    """The main table's cells and the alpha sweep's extra cells (no duplicates)."""
    cfg = as_config(cfg)
    exp = cfg.experiment
    scenarios = dict(exp.scenarios)
    alpha = float(cfg.data.alpha)
    main: list[Cell] = []
    for ds in exp.datasets:
        for model in exp.models:
            for seed in exp.seeds:
                for sc in scenarios:
                    for m in exp.methods:
                        main.append(Cell(RunKey(str(ds), str(model), alpha, int(seed)), sc, m))
    sweep_cfg = exp.alpha_sweep
    seen = set(main)
    sweep: list[Cell] = []
    for a in sweep_cfg.alphas:
        for ds in exp.datasets:
            for model in sweep_cfg.models or exp.models:
                for seed in exp.seeds:
                    for sc in sweep_cfg.scenarios or list(scenarios):
                        if sc not in scenarios:
                            raise ConfigError(f"alpha_sweep scenario {sc!r} not in scenarios")
                        for m in sweep_cfg.methods or exp.methods:
                            c = Cell(RunKey(str(ds), str(model), float(a), int(seed)), sc, m)
                            if c not in seen:
                                seen.add(c)
                                sweep.append(c)
    return main, sweep


def read_result(path: Path) -> dict[str, Any] | None:
    """A cell's result.json when present and valid (schema, method, metrics), else None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_VERSION:
        return None
    metrics = data.get("metrics")
    if not isinstance(metrics, dict) or metrics.get("ra") is None:
        return None
    if not isinstance(data.get("cost"), dict) or not isinstance(data.get("aoi"), dict):
        return None
    return data
