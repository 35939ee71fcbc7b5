"""The experiment harness: trained runs and unlearning cells, resumable cell by cell.

A cell (:class:`~scaleflu.experiments.cells.Cell`) is one unlearning -- a method on a scenario
(a request) -- of one trained FL run (:class:`~scaleflu.experiments.cells.RunKey`: dataset x
model x alpha x seed). :func:`run_cells` trains each run once (or resumes it, or reuses it when
its training config matches, :func:`ensure_run`), builds one :class:`UnlearnContext` per
scenario of a run (:func:`make_context`) shared by that scenario's methods, and writes every
cell's ``result.json`` (the :class:`UnlearnResult` schema). Finished cells (valid
``result.json``) are never recomputed; a failing cell is recorded with its error
(``error.json``, ``traceback.txt``) and the others go on, retried on the next call.

A cell's method is a registered method or a :class:`Variant` (a method under a name of its own,
with its own settings: an ablation, an independent Retrain); where runs and cells live is the
caller's choice. Used by Table II (:mod:`scaleflu.experiments.table2`), the seeded sweep
(:mod:`scaleflu.experiments.sweep`) and the unlearning benchmark
(``benchmarks/unlearn_bench.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file
from tqdm import tqdm

from scaleflu.config import Config, ConfigError, as_config, merge, parse_override
from scaleflu.experiments.cells import Cell, RunKey, read_result
from scaleflu.fl.run import load_run, train
from scaleflu.unlearn.base import UnlearnContext, Unlearner, resolve_unlearn_config
from scaleflu.unlearn.baselines.aoi_trace import annotate, replay_scale_trace
from scaleflu.unlearn.registry import canonical_name, hyper_parameters, make_method, method_spec

log = logging.getLogger(__name__)

MethodFactory = Callable[..., Unlearner]  # (name, config, **hyper-parameters)
CellDir = Callable[[Cell], Path]  # where a cell's folder is
RUN_SECTIONS_DROPPED = ("experiment", "baselines", "testbed")


MODEL_SETTING_SECTIONS = ("data", "fl", "model", "scale")


def model_settings(cfg: Config, model: str) -> list[dict[str, Any]]:
    """``experiment.model_settings.<model>``, each item parsed (``data.*``, ``fl.*``, ``model.*``
    shape the model's runs; ``scale.*`` its SCALE cells, and is saved with its runs so that
    ``scaleflu unlearn`` on one of them uses it too)."""
    out = []
    for item in cfg.experiment.model_settings.get(model) or []:
        upd = parse_override(str(item))
        if set(upd) - set(MODEL_SETTING_SECTIONS):
            raise ConfigError(
                f"experiment.model_settings.{model}: {item!r} may set data.*, fl.*, model.*, "
                "scale.*"
            )
        out.append(upd)
    return out


def model_config(cfg: Mapping[str, Any], model: str) -> Config:
    """The experiment config of ``model``'s cells: ``cfg`` with the model's ``scale.*`` settings
    (:func:`model_settings`) on top."""
    cfg = as_config(cfg)
    out: Mapping[str, Any] = cfg
    for upd in model_settings(cfg, model):
        if "scale" in upd:
            out = merge(out, {"scale": upd["scale"]})
    return as_config(out)


def run_config(cfg: Mapping[str, Any], key: RunKey) -> Config:
    """The FL config of one run: the experiment config with the run's data set, model, alpha, seed.

    Sections that do not shape the trained model (experiment, baselines, testbed) are left out,
    so changing them never invalidates a trained run.
    """
    cfg = as_config(cfg)
    out = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in RUN_SECTIONS_DROPPED}
    # e.g. a smaller run for MobileNetV3 on the CPU
    for upd in model_settings(cfg, key.model):
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
    if isinstance(view.get("fl"), Mapping):  # where a run computed, and in what passes it was
        # evaluated, do not define it
        view["fl"] = {k: v for k, v in view["fl"].items() if k not in ("device", "eval_batch_size")}
    view["scale.groups_per_layer"] = (cfg.get("scale") or {}).get("groups_per_layer")
    # keys added later that are off by default: a run saved before they existed still matches
    if not view.get("plugins"):
        view.pop("plugins", None)
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
    run_dir = out / "runs" / key.slug
    rcfg = run_config(cfg, key)
    done_marker = run_dir / "model.safetensors"
    if done_marker.is_file():
        saved = run_dir / "config.yaml"
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


def default_factory(name: str, cfg: Config, **params: Any) -> Unlearner:
    """The registry's Unlearner for ``name`` (:func:`scaleflu.unlearn.registry.make_method`).

    Hyper-parameters come from the experiment's ``baselines.<name>``, then ``params``; SCALE
    runs in ``experiment.scale_mode`` unless ``params`` names its ``mode``.
    """
    if canonical_name(name) == "scale":
        params.setdefault("mode", str(cfg.experiment.scale_mode or "default"))
    return make_method(name, cfg, **params)


@dataclass(frozen=True)
class Variant:
    """A method under a name of its own (a cell's ``method``): a registered method, other settings.

    ``overrides`` (``KEY=VALUE`` over the experiment config: ``scale.*``, ``baselines.*``,
    ``experiment.scale_mode``) give the variant a context of its own; ``params`` are keyword
    hyper-parameters of the method (:func:`scaleflu.unlearn.registry.make_method`: SCALE's
    ``mode``, Retrain's ``seed``) and share the scenario's context.
    """

    method: str
    overrides: tuple[str, ...] = ()
    params: tuple[tuple[str, Any], ...] = ()

    def config(self, cfg: Config) -> Config:
        """The experiment config this variant runs under."""
        out: Mapping[str, Any] = cfg
        for item in self.overrides:
            out = merge(out, parse_override(item))
        return as_config(out)


def matched_budget(out: Path | CellDir, cell: Cell, unlearner: Any) -> float:
    """CPU seconds of the result that ``unlearner.match_cost_of`` produced on ``cell``'s request.

    ``out``: the experiment folder, or where cells' folders are (as :func:`run_cells` takes it).
    """
    ref = Cell(cell.run, cell.scenario, str(unlearner.match_cost_of))
    ref_dir = out(ref) if callable(out) else ref.dir(Path(out))
    data = read_result(ref_dir / "result.json")
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
    *,
    variants: Mapping[str, Variant] | None = None,
    cell_dir: CellDir | None = None,
    desc: str = "table2",
) -> dict[str, dict[str, Any]]:
    """Run every unfinished cell (grouped by run); returns a status per cell folder.

    Runs live in ``out/runs``; a cell's folder is :meth:`Cell.dir` under ``out`` unless
    ``cell_dir`` places it. A cell's ``method`` names a registered method or one of
    ``variants``. ``desc`` labels the progress bar.
    """
    cfg = as_config(cfg)
    out = Path(out)
    where = cell_dir if cell_dir is not None else (lambda c: c.dir(out))
    variants = dict(variants or {})
    cells = list(dict.fromkeys(cells))  # main table first, then the sweep
    status: dict[str, dict[str, Any]] = {}
    todo: dict[RunKey, list[Cell]] = {}
    stale: list[tuple[str, list[str]]] = []  # reused cells computed with other settings
    for c in cells:
        cdir = where(c)
        done = read_result(cdir / "result.json")
        if done is not None:
            status[_rel(cdir, out)] = {"status": "done", "reused": True}
            diff = settings_changed(cfg, c, variants.get(c.method), done)
            if diff:
                stale.append((_rel(cdir, out), diff))
        else:
            todo.setdefault(c.run, []).append(c)
    if stale:
        keys = sorted({d.split(":")[0] for _, ds in stale for d in ds})
        log.warning(
            "%d finished cell(s) are reused although they were computed with other settings "
            "than the config's now (%s; e.g. %s: %s); remove their folders or write to "
            "another --out to recompute them",
            len(stale),
            ", ".join(keys),
            stale[0][0],
            "; ".join(stale[0][1]),
        )
    n_todo = sum(len(v) for v in todo.values())
    log.info("%d cells: %d finished, %d to run", len(cells), len(cells) - n_todo, n_todo)
    threads = int(cfg.fl.threads or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    bar = tqdm(total=n_todo, desc=desc, unit="cell", disable=not progress)
    scenarios = dict(cfg.experiment.scenarios)
    try:
        for key, group in todo.items():
            try:
                run = load_run(ensure_run(cfg, key, out, progress))
            except Exception as exc:  # noqa: BLE001 - recorded per cell, the others go on
                log.error("run %s failed: %s", key.slug, exc)
                for c in group:
                    st = _record_error(where(c), exc, "train")
                    status[_rel(where(c), out)] = {"status": "failed", **st}
                    bar.update(1)
                continue
            by_scenario: dict[str, list[Cell]] = {}
            for c in group:
                by_scenario.setdefault(c.scenario, []).append(c)
            mcfg = model_config(cfg, key.model)  # the model's own scale.* settings
            for sc, sc_cells in by_scenario.items():
                contexts: dict[tuple[str, ...], Any] = {}  # one per variant config
                # cost-matched controls after the method whose time they match
                sc_cells.sort(key=lambda c: c.method.endswith("_matched"))
                for c in sc_cells:
                    bar.set_postfix_str(f"{key.model} s{key.seed} {sc} {c.method}", refresh=True)
                    variant = variants.get(c.method, Variant(c.method))
                    status[_rel(where(c), out)] = _run_cell(
                        c, variant, run, scenarios[sc], mcfg, contexts, factory, where, progress
                    )
                    bar.update(1)
            run.history.close()
    finally:
        bar.close()
    return status


def method_settings(variant: Variant, cfg: Config) -> dict[str, Any]:
    """What a cell of ``variant`` runs with by its config (``cfg``, the variant's overrides
    applied): ``baselines.<section>`` merged with the variant's params, as
    :func:`scaleflu.unlearn.registry.hyper_parameters` gives it to the method. Saved with each
    cell (its result's ``config.method``); a setting the harness fills in per cell at run time
    (the cost-matched control's ``budget_cpu_s``) keeps the config's value here."""
    spec = method_spec(variant.method)
    return {
        "name": spec.name,
        "section": spec.section or spec.name,
        "settings": hyper_parameters(spec.name, cfg, dict(variant.params)),
    }


def settings_changed(
    cfg: Mapping[str, Any], c: Cell, variant: Variant | None, result: Mapping[str, Any]
) -> list[str]:
    """For a finished cell: each setting whose value in ``result``'s saved config differs from
    what ``cfg`` would give the cell now, as ``"key: saved -> now"``: its method's settings
    (``baselines.<section>.<key>``, saved as :func:`method_settings` gives them) and, for SCALE
    and its variants, every top-level ``scale.*`` setting. A setting the saved config lacks (an
    older version's: cells before the method's settings were saved) is left out."""
    variant = variant or Variant(c.method)
    saved_cfg = result.get("config") or {}
    mcfg = model_config(cfg, c.run.model)
    vcfg = variant.config(mcfg) if variant.overrides else mcfg
    out: list[str] = []
    saved_m = saved_cfg.get("method")
    now_m = None
    if isinstance(saved_m, Mapping) and isinstance(saved_m.get("settings"), Mapping):
        try:
            now_m = method_settings(variant, vcfg)
        except (ConfigError, ValueError):
            now_m = None  # a setting the method refuses: its cells say so when they run
    if now_m is not None:
        old = saved_m["settings"]
        out += [
            f"baselines.{now_m['section']}.{k}: {old[k]!r} -> {v!r}"
            for k, v in sorted(now_m["settings"].items())
            if k in old and old[k] != v
        ]
    saved = saved_cfg.get("scale")
    if canonical_name(variant.method) == "scale" and isinstance(saved, Mapping):
        now = vcfg.scale.to_dict()
        out += [
            f"scale.{k}: {saved[k]!r} -> {now[k]!r}"
            for k in sorted(now)
            if k in saved and k != "eval" and saved[k] != now[k]
        ]
    return out


def _rel(path: Path, out: Path) -> str:
    """A cell folder's name in the status: relative to ``out`` where it lies below it."""
    try:
        return str(path.relative_to(out))
    except ValueError:
        return str(path)


def _run_cell(
    c: Cell,
    variant: Variant,
    run: Any,
    request: str,
    cfg: Config,
    contexts: dict[tuple[str, ...], Any],
    factory: MethodFactory,
    where: CellDir,
    progress: bool,
) -> dict[str, Any]:
    """Unlearn one cell and write its ``result.json`` (or its error); returns its status."""
    cdir = where(c)
    rel = c.dir(Path()).as_posix()
    vcfg = variant.config(cfg) if variant.overrides else cfg
    if variant.overrides not in contexts:
        try:
            contexts[variant.overrides] = make_context(run, request, vcfg, progress)
        except Exception as exc:  # noqa: BLE001 - recorded for each of its cells
            contexts[variant.overrides] = exc
    ctx = contexts[variant.overrides]
    if isinstance(ctx, BaseException):
        return {"status": "failed", **_record_error(cdir, ctx, "context")}
    t0 = time.perf_counter()
    try:
        params = dict(variant.params)
        unlearner = (
            factory(variant.method, vcfg, **params) if params else factory(variant.method, vcfg)
        )
        if getattr(unlearner, "match_cost_of", None):  # cost-matched control
            unlearner.overrides["budget_cpu_s"] = matched_budget(where, c, unlearner)
        result = unlearner.run(ctx)
        if result.details.get("aoi_time_avg_s") is None:
            if "rollout" in result.details:
                annotate(result, replay_scale_trace(ctx, result.details))
        cdir.mkdir(parents=True, exist_ok=True)
        if bool(cfg.experiment.save_models) and getattr(unlearner, "state", None) is not None:
            mp = cdir / "model.safetensors"
            save_file({k: v.contiguous() for k, v in unlearner.state.items()}, mp)
            result.model_path = str(mp)
        result.details.setdefault("cell", rel)
        result.config["method"] = method_settings(variant, vcfg)
        tmp = cdir / "result.json.tmp"
        result.save(tmp)
        tmp.replace(cdir / "result.json")
        for stale in ("error.json", "traceback.txt"):
            (cdir / stale).unlink(missing_ok=True)
        log.info(
            "%s: RA %.3f FA %s in %.1fs",
            rel,
            result.metrics["ra"],
            result.metrics.get("fa_protocol"),
            time.perf_counter() - t0,
        )
        return {"status": "done", "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001
        log.error("cell %s failed: %s", rel, exc)
        return {
            "status": "failed",
            "wall_s": time.perf_counter() - t0,
            **_record_error(cdir, exc, "unlearn"),
        }
