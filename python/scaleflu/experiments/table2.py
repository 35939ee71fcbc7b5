"""Table II harness: methods x (datasets x models) x scenarios x seeds, resumable cell by cell.

Layout of ``OUT`` (``--out``)::

    config.yaml                         the resolved experiment config
    runs/<dataset>-<model>-a<alpha>-s<seed>/    one trained FL run, shared by all its cells
    cells/<dataset>/<model>/a<alpha>/s<seed>/<scenario>/<method>/
        result.json                     UnlearnResult (schema 1) -- the cell is finished
        error.json, traceback.txt       the cell failed (retried on the next invocation)
    table2.md, table2.csv               RA, FA, Avg AoI per method: mean +- std, delta to Retrain
    figures/*.png                       PPO convergence, layer sensitivity, Sum AoI, RA/FA vs alpha
    summary.json                        status and wall time of every cell

A cell is one unlearning (method x scenario) on one trained run (dataset x model x alpha x
seed). Finished cells (valid ``result.json``) are never recomputed; a failing cell is recorded
with its error and traceback and the others go on. The main table uses ``data.alpha``; the
``experiment.alpha_sweep`` adds cells for other Dirichlet alphas (same methods/scenarios
machinery, shared runs and cells where they coincide).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from scaleflu.config import Config, ConfigError, as_config, save_config
from scaleflu.experiments.cells import Cell, RunKey, plan_cells, read_result
from scaleflu.unlearn.base import UnlearnContext, Unlearner, resolve_unlearn_config

log = logging.getLogger(__name__)

MethodFactory = Callable[[str, Config], Unlearner]
RUN_SECTIONS_DROPPED = ("experiment", "baselines", "testbed")


def _check_methods(names: Iterable[str]) -> None:
    """Every method name is registered (before any run is trained)."""
    from scaleflu.unlearn.registry import canonical_name

    for name in names:
        try:
            canonical_name(str(name))
        except ValueError as exc:
            raise ConfigError(f"experiment.methods: {exc}") from None


def run_config(cfg: Mapping[str, Any], key: RunKey) -> Config:
    """The FL config of one run: the experiment config with the run's data set, model, alpha, seed.

    Sections that do not shape the trained model (experiment, baselines, testbed) are left out,
    so changing them never invalidates a trained run.
    """
    cfg = as_config(cfg)
    out = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in RUN_SECTIONS_DROPPED}
    # e.g. a smaller run for MobileNetV3 on the CPU
    for item in cfg.experiment.model_settings.get(key.model) or []:
        from scaleflu.config import merge, parse_override

        upd = parse_override(str(item))
        if set(upd) - {"data", "fl", "model"}:
            raise ConfigError(
                f"experiment.model_settings.{key.model}: {item!r} may set data.*, fl.*, model.*"
            )
        out = merge(out, upd)
    out["seed"] = key.seed
    out["data"]["dataset"] = key.dataset
    out["data"]["alpha"] = key.alpha
    out["model"]["name"] = key.model
    return as_config(out)


def training_view(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a run config that shapes the trained model and its history.

    Unlearning settings (``scale.*`` but the AoI group count the history uses) may change after
    a run was trained without invalidating it.
    """
    view = {k: v for k, v in cfg.items() if k not in RUN_SECTIONS_DROPPED and k != "scale"}
    if isinstance(view.get("fl"), Mapping):  # where a run computed does not define it
        view["fl"] = {k: v for k, v in view["fl"].items() if k != "device"}
    view["scale.groups_per_layer"] = (cfg.get("scale") or {}).get("groups_per_layer")
    # keys added later that are off by default: a run saved before they existed still matches
    fl = view.get("fl")
    if isinstance(fl, Mapping) and str(fl.get("lr_schedule") or "constant") == "constant":
        view["fl"] = fl = {k: v for k, v in fl.items() if k not in _LR_KEYS}
    if isinstance(fl, Mapping) and not int(fl.get("bn_recalibration") or 0):
        view["fl"] = fl = {k: v for k, v in fl.items() if k != "bn_recalibration"}
    if isinstance(fl, Mapping) and fl.get("aggregation") is None:
        view["fl"] = {k: v for k, v in fl.items() if k != "aggregation"}
    data = view.get("data")
    poison = data.get("poison") if isinstance(data, Mapping) else None
    if isinstance(poison, Mapping) and not int(poison.get("canaries") or 0):
        view["data"] = {
            **data,
            "poison": {k: v for k, v in poison.items() if k not in _CANARY_KEYS},
        }
    return view


_LR_KEYS = ("lr_schedule", "lr_decay", "lr_min_ratio")
_CANARY_KEYS = ("canary_clients", "canaries", "canary_copies")


def ensure_run(cfg: Config, key: RunKey, out: Path, progress: bool) -> Path:
    """Train (or resume, or reuse) the run of ``key``; returns its directory."""
    from scaleflu.fl.run import train

    run_dir = out / "runs" / key.slug
    rcfg = run_config(cfg, key)
    done_marker = run_dir / "model.safetensors"
    if done_marker.is_file():
        saved = run_dir / "config.yaml"
        import yaml

        if saved.is_file() and training_view(yaml.safe_load(saved.read_text())) == training_view(
            rcfg
        ):
            return run_dir
        raise ConfigError(
            f"{run_dir} holds a run trained with another config; remove it or use another --out"
        )
    resume = (run_dir / "config.yaml").is_file() and (run_dir / "history").is_dir()
    log.info("%s run %s", "resuming" if resume else "training", key.slug)
    train(rcfg, run_dir, resume=resume, progress=progress)
    return run_dir


def make_context(run: Any, request: str, cfg: Mapping[str, Any], progress: bool) -> UnlearnContext:
    """An UnlearnContext for ``request`` with the experiment's scale and baselines settings."""
    cfg = as_config(cfg)
    ucfg = resolve_unlearn_config(run.cfg)
    ucfg.scale = copy.deepcopy(cfg.scale)
    ucfg.baselines = copy.deepcopy(cfg.baselines)
    mode = str(cfg.experiment.scale_mode or cfg.scale.mode)
    return UnlearnContext.for_request(run, request, ucfg, mode, progress)


def default_factory(name: str, cfg: Config) -> Unlearner:
    """The registry's Unlearner for ``name`` (:func:`scaleflu.unlearn.registry.make_method`).

    Hyper-parameters come from the experiment's ``baselines.<name>``; SCALE runs in
    ``experiment.scale_mode``.
    """
    from scaleflu.unlearn.registry import canonical_name, make_method

    if canonical_name(name) == "scale":
        return make_method("scale", cfg, mode=str(cfg.experiment.scale_mode or "default"))
    return make_method(name, cfg)


def matched_budget(out: Path, cell: Cell, unlearner: Any) -> float:
    """CPU seconds of the result that ``unlearner.match_cost_of`` produced on ``cell``'s request."""
    ref = Cell(cell.run, cell.scenario, str(unlearner.match_cost_of))
    data = read_result(ref.dir(out) / "result.json")
    cpu = None if data is None else data["cost"].get("cpu_s")
    if cpu is None:
        raise RuntimeError(
            f"{cell.method} matches the CPU time of {ref.method}, which has no result with cpu_s "
            f"for {cell.scenario} on {cell.run.slug}; put {ref.method} in experiment.methods"
        )
    return float(cpu)


def _record_error(cell_dir: Path, exc: BaseException, where: str) -> dict[str, Any]:
    cell_dir.mkdir(parents=True, exist_ok=True)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    (cell_dir / "traceback.txt").write_text(tb)
    err = {
        "error": f"{type(exc).__name__}: {exc}",
        "stage": where,
        "traceback": "traceback.txt",
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (cell_dir / "error.json").write_text(json.dumps(err, indent=2))
    return err


def run_cells(
    cfg: Mapping[str, Any],
    out: str | Path,
    cells: Iterable[Cell],
    factory: MethodFactory = default_factory,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Run every unfinished cell (grouped by run); returns a status per cell folder."""
    cfg = as_config(cfg)
    out = Path(out)
    cells = list(dict.fromkeys(cells))  # main table first, then the sweep
    status: dict[str, dict[str, Any]] = {}
    todo: dict[RunKey, list[Cell]] = {}
    for c in cells:
        cdir = c.dir(out)
        if read_result(cdir / "result.json") is not None:
            status[str(cdir.relative_to(out))] = {"status": "done", "reused": True}
        else:
            todo.setdefault(c.run, []).append(c)
    n_todo = sum(len(v) for v in todo.values())
    log.info("%d cells: %d finished, %d to run", len(cells), len(cells) - n_todo, n_todo)
    threads = int(cfg.fl.threads or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    bar = tqdm(total=n_todo, desc="table2", unit="cell", disable=not progress)
    scenarios = dict(cfg.experiment.scenarios)
    save_models = bool(cfg.experiment.save_models)
    try:
        for key, group in todo.items():
            try:
                from scaleflu.fl.run import load_run

                run = load_run(ensure_run(cfg, key, out, progress))
            except Exception as exc:  # noqa: BLE001 - recorded per cell, the others go on
                log.error("run %s failed: %s", key.slug, exc)
                for c in group:
                    st = _record_error(c.dir(out), exc, "train")
                    status[str(c.dir(out).relative_to(out))] = {"status": "failed", **st}
                    bar.update(1)
                continue
            by_scenario: dict[str, list[Cell]] = {}
            for c in group:
                by_scenario.setdefault(c.scenario, []).append(c)
            for sc, sc_cells in by_scenario.items():
                ctx_err: BaseException | None = None
                ctx = None
                try:
                    ctx = make_context(run, scenarios[sc], cfg, progress)
                except Exception as exc:  # noqa: BLE001
                    ctx_err = exc
                # cost-matched controls after the method whose time they match
                sc_cells.sort(key=lambda c: c.method.endswith("_matched"))
                for c in sc_cells:
                    cdir = c.dir(out)
                    rel = str(cdir.relative_to(out))
                    bar.set_postfix_str(f"{key.model} s{key.seed} {sc} {c.method}", refresh=True)
                    if ctx_err is not None or ctx is None:
                        st = _record_error(cdir, ctx_err or RuntimeError("no context"), "context")
                        status[rel] = {"status": "failed", **st}
                        bar.update(1)
                        continue
                    t0 = time.perf_counter()
                    try:
                        unlearner = factory(c.method, cfg)
                        if getattr(unlearner, "match_cost_of", None):  # cost-matched control
                            unlearner.overrides["budget_cpu_s"] = matched_budget(out, c, unlearner)
                        result = unlearner.run(ctx)
                        if result.details.get("aoi_time_avg_s") is None:
                            from scaleflu.unlearn.baselines.aoi_trace import (
                                annotate,
                                replay_scale_trace,
                            )

                            if "rollout" in result.details:
                                annotate(result, replay_scale_trace(ctx, result.details))
                        cdir.mkdir(parents=True, exist_ok=True)
                        if save_models and getattr(unlearner, "state", None) is not None:
                            from safetensors.torch import save_file

                            mp = cdir / "model.safetensors"
                            save_file({k: v.contiguous() for k, v in unlearner.state.items()}, mp)
                            result.model_path = str(mp)
                        result.details.setdefault("cell", rel)
                        tmp = cdir / "result.json.tmp"
                        result.save(tmp)
                        tmp.replace(cdir / "result.json")
                        for stale in ("error.json", "traceback.txt"):
                            (cdir / stale).unlink(missing_ok=True)
                        status[rel] = {"status": "done", "wall_s": time.perf_counter() - t0}
                        log.info(
                            "%s: RA %.3f FA %s in %.1fs",
                            rel,
                            result.metrics["ra"],
                            result.metrics.get("fa_protocol"),
                            time.perf_counter() - t0,
                        )
                    except Exception as exc:  # noqa: BLE001
                        log.error("cell %s failed: %s", rel, exc)
                        st = _record_error(cdir, exc, "unlearn")
                        status[rel] = {
                            "status": "failed",
                            "wall_s": time.perf_counter() - t0,
                            **st,
                        }
                    bar.update(1)
            run.history.close()
    finally:
        bar.close()
    return status


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
    status = run_cells(cfg, out, main + sweep, factory, progress)
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
        from scaleflu.experiments.report import write_report

        summary["report"] = {k: str(v) for k, v in write_report(cfg, out).items()}
    log.info(
        "table2: %d cells done, %d failed, %.1fs -> %s",
        summary["done"],
        len(summary["failed"]),
        wall,
        out,
    )
    return summary
