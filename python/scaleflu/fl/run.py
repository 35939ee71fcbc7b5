"""Run API: validate a config, train FedAvg into a run directory, resume it, load it back.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON line
per round: round, test_acc, test_loss, asr when a backdoor is configured, participants, wall_s,
link_s, cum_link_s, bytes), ``model.safetensors`` (the final global model), ``poison.json``
(which training samples were poisoned) and ``history/`` (:class:`HistoryStore`).

Everything random derives from ``seed``: the initial model from ``(seed, 0)``, partitions and
poisoning from ``seed``, client selection and local shuffling from ``(seed, round[, client])``.
Hence :func:`load_run` rebuilds data sets and partitions from the saved config alone, and a run
stopped at any point resumes (``resume=True``) from its last completed round to the same model
an uninterrupted run reaches.
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn
from tqdm import tqdm

from scaleflu.config import Config, ConfigError, as_config, read_config_file, save_config
from scaleflu.fl.aggregation import screening_config
from scaleflu.fl.data import (
    ImageData,
    PoisonInfo,
    apply_poison,
    insert_canaries,
    load_datasets,
    make_partitions,
    triggered_test_set,
)
from scaleflu.fl.device import config_device
from scaleflu.fl.fedavg import BNRecalibrator, LocalConfig, derive_seed, make_trainer
from scaleflu.fl.history import HistoryStore, LinkModel
from scaleflu.fl.integrity import load_model, save_model
from scaleflu.fl.models import build_model, layer_groups
from scaleflu.fl.ray_backend import RayTrainer
from scaleflu.fl.strategy import NOT_EVALUATED, CentralEvaluator, FedAvg, close_round
from scaleflu.plots import plot_training

log = logging.getLogger(__name__)

RoundCallback = Callable[[int, dict[str, Any]], None]

# Keys that may differ between a run and its resumption (they do not change the model beyond
# float rounding, or only extend the run).
_RESUME_FREE = {
    ("fl", "rounds"),
    ("fl", "backend"),
    ("fl", "ray_address"),
    ("fl", "ray_num_cpus"),
    ("fl", "ray_cpus_per_client"),
    ("fl", "trainer"),
    ("fl", "eval_batch_size"),
    ("fl", "threads"),
    ("fl", "workers"),
    ("fl", "device"),
}


# ----------------------------------------------------------------------------- validation


def validate_config(cfg: Mapping[str, Any]) -> Config:
    """The config as a checked :class:`~scaleflu.config.Config` (:func:`~scaleflu.config.as_config`:
    types, ranges, choices, cross-key rules), and ``fl.device`` available on this machine."""
    cfg = as_config(cfg)
    config_device(cfg)  # auto | cpu | cuda[:k], and CUDA present when asked for
    try:
        screening_config(cfg.fl.get("aggregation"), "fl.aggregation")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return cfg


# ----------------------------------------------------------------------------- setup


@dataclass
class FLSetup:
    """Everything a run derives from its config: data, partitions, poisoning, initial model."""

    cfg: Config
    train: ImageData  # training set as the clients hold it (poisoned where configured)
    clean_train: ImageData  # training set before poisoning
    test: ImageData
    parts: list[np.ndarray]  # client n's global training-sample indices
    poison: PoisonInfo
    triggered_test: ImageData | None  # attack-success set when a backdoor is configured
    model: nn.Module  # holds the initial model Theta[1]

    @property
    def data_sizes(self) -> dict[int, int]:
        """M_n of every client."""
        return {n: len(p) for n, p in enumerate(self.parts)}

    def model_args(self) -> tuple[str, int, int, int]:
        """Arguments of :func:`build_model` for this run."""
        return (
            str(self.cfg.model.name),
            self.train.num_classes,
            self.train.in_channels,
            self.train.image_size,
        )

    def new_model(self) -> nn.Module:
        """A fresh model of this run's architecture (weights: the initial model)."""
        model = build_model(*self.model_args())
        model.load_state_dict(self.model.state_dict())
        return model

    def evaluator(self, model: nn.Module, batch_size: int | None = None) -> CentralEvaluator:
        """The server's evaluation of a global model on this run's test (and triggered) set,
        computed on ``model`` in passes of ``batch_size`` images (None: the device's)."""
        target = self.poison.target_label if self.triggered_test is not None else None
        return CentralEvaluator(model, self.test, batch_size, self.triggered_test, target)


def build_data(
    cfg: Config,
) -> tuple[ImageData, ImageData, ImageData, list[np.ndarray], PoisonInfo]:
    """The seeded data of a config: (clean train, poisoned train, test, partitions, poison).

    Load, partition, poison, insert the membership canaries: the one builder of the clients'
    data, used by the simulation (:func:`build_setup`) and by each robot of the testbed.
    """
    seed = int(cfg.seed)
    clean, test = load_datasets(cfg.data, seed)
    parts = make_partitions(cfg.data, clean.labels, seed)
    train, poison = apply_poison(clean, parts, cfg.data.poison, seed)
    clean, train, parts, poison = insert_canaries(
        clean, train, parts, cfg.data.poison, poison, seed
    )
    return clean, train, test, list(parts), poison


def build_setup(cfg: Mapping[str, Any]) -> FLSetup:
    """Validate ``cfg`` and rebuild data, partitions, poisoning and the initial model from it."""
    cfg = validate_config(cfg)
    seed = int(cfg.seed)
    clean, train, test, parts, poison = build_data(cfg)
    triggered = None
    if len(poison.backdoor_indices):
        triggered = triggered_test_set(test, poison.target_label, poison.trigger_size)
    torch.manual_seed(derive_seed(seed, 0))
    model = build_model(str(cfg.model.name), train.num_classes, train.in_channels, train.image_size)
    return FLSetup(cfg, train, clean, test, parts, poison, triggered, model)


def open_history(cfg: Config, run_dir: str | Path, model: nn.Module) -> HistoryStore:
    """The run's history store with the config's retention, precision, groups and link model."""
    h = cfg.history
    link = LinkModel(
        float(h.link_goodput),
        float(h.link_latency),
        bool(h.count_uplink),
        phy=str(h.link_phy),
        snr_db=float(h.link_snr_db),
        fading=str(h.link_fading),
    )
    return HistoryStore(
        run_dir,
        keep_rounds=h.keep_rounds,
        fp16=bool(h.fp16),
        groups=layer_groups(model, int(cfg.scale.groups_per_layer)),
        link=link,
        update_tol=float(h.update_tol),
    )


# ----------------------------------------------------------------------------- training


@dataclass
class RunResult:
    """Outcome of :func:`train`: the final model, per-round metrics and the history store."""

    run_dir: Path
    cfg: Config
    model: nn.Module
    metrics: list[dict[str, Any]] = field(default_factory=list)
    history: HistoryStore | None = None

    @property
    def final_acc(self) -> float:
        """Test accuracy after the last evaluated round (nan when none)."""
        accs = [m["test_acc"] for m in self.metrics if m.get("test_acc") is not None]
        return accs[-1] if accs else float("nan")


def _diff_keys(a: Any, b: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out: list[tuple[str, ...]] = []
        for k in set(a) | set(b):
            out += _diff_keys(a.get(k), b.get(k), (*prefix, str(k)))
        return out
    return [] if a == b else [prefix]


def metrics_from_history(history: HistoryStore, up_to: int | None = None) -> list[dict[str, Any]]:
    """The metrics.jsonl rows of rounds 1..up_to rebuilt from the history store."""
    up_to = history.last_completed_round() if up_to is None else up_to
    rows = []
    for t in history.rounds():
        if t > up_to:
            break
        info = history.round_info(t)
        row = {"round": t, **info["metrics"]}
        row.update(
            participants=info["participants"],
            wall_s=info["wall_s"],
            link_s=info["link_s"],
            cum_link_s=info["cum_link_s"],
            bytes=int(info["bytes"]),
        )
        rows.append(row)
    return rows


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line (the runs' metrics.jsonl, the testbed's rounds/rejections logs)."""
    with Path(path).open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def _make_trainer(setup: FLSetup, model: nn.Module, local: LocalConfig) -> Any:
    fl = setup.cfg.fl
    seed = int(setup.cfg.seed)
    if fl.backend == "ray":
        return RayTrainer(
            setup.model_args(),
            setup.train,
            setup.parts,
            local,
            seed,
            address=fl.ray_address,
            num_cpus=fl.ray_num_cpus,
            cpus_per_client=int(fl.ray_cpus_per_client),
        )
    return make_trainer(
        fl.trainer,
        model,
        setup.train,
        setup.parts,
        local,
        seed,
        int(fl.workers),
        config_device(setup.cfg),
    )


def train(
    cfg: Mapping[str, Any],
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    callbacks: Iterable[RoundCallback] = (),
    outputs: bool = True,
) -> RunResult:
    """Train FedAvg per ``cfg`` into ``run_dir`` (resuming its last completed round if asked).

    ``outputs``: also write ``metrics.csv`` and ``training.png`` (:func:`write_training_outputs`).
    """
    cfg = validate_config(cfg)
    run_dir = Path(run_dir)
    saved_cfg_path = run_dir / "config.yaml"
    if saved_cfg_path.is_file() and (run_dir / "history").is_dir():
        if not resume:
            raise ConfigError(
                f"{run_dir} already holds a run: continue it (scaleflu train --resume --out "
                f"{run_dir}) or choose another folder"
            )
        saved = yaml.safe_load(saved_cfg_path.read_text())
        saved.setdefault("plugins", [])  # a run saved before plugins existed had none
        diff = [k for k in _diff_keys(saved, cfg) if k[:2] not in _RESUME_FREE]
        if diff:
            raise ConfigError(
                "cannot resume with a different config; changed keys: "
                + ", ".join(".".join(k) for k in sorted(diff))
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, saved_cfg_path)

    setup = build_setup(cfg)
    fl = cfg.fl
    model = setup.model
    history = open_history(cfg, run_dir, model)
    last = history.last_completed_round()
    if last == 0:
        history.record_initial(model.state_dict())
    else:
        log.info("resuming %s after round %d", run_dir, last)
    global_state = history.global_model(last + 1)
    model.load_state_dict(global_state)
    metrics_path = run_dir / "metrics.jsonl"
    metrics = metrics_from_history(history, last)
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in metrics))

    local = LocalConfig.from_config(fl)
    trainer = _make_trainer(setup, setup.new_model(), local)
    eval_model = setup.new_model().to(config_device(cfg))  # fl.device; the states stay on CPU
    bn_recal = BNRecalibrator.from_config(cfg, setup.new_model().to(config_device(cfg)), setup.test)
    strategy = FedAvg.from_config(
        cfg,
        setup.data_sizes,
        recalibrate=bn_recal,
        evaluator=setup.evaluator(eval_model, fl.eval_batch_size),
    )
    T = int(fl.rounds)
    bar = tqdm(
        range(last + 1, T + 1),
        desc="FedAvg",
        unit="round",
        disable=not progress,
        initial=last,
        total=T,
    )
    threads_before = torch.get_num_threads()
    if int(fl.threads) > 0:
        torch.set_num_threads(int(fl.threads))  # restored when train() returns
    try:
        for t in bar:
            t0 = time.perf_counter()
            result = strategy.fit_round(t, global_state, trainer)
            if result is None:
                raise RuntimeError(f"round {t}: no client selected")
            global_state = result.state
            model.load_state_dict(global_state)
            evaluate_now = t % int(fl.eval_every) == 0 or t == T
            metrics_t = strategy.evaluate(t, global_state) if evaluate_now else dict(NOT_EVALUATED)
            wall, link = close_round(history, result, metrics_t, t0)
            row: dict[str, Any] = {"round": t, **metrics_t}
            row.update(
                participants=result.clients,
                wall_s=wall,
                link_s=link["link_s"],
                cum_link_s=link["cum_link_s"],
                bytes=int(link["bytes"]),
            )
            metrics.append(row)
            append_jsonl(metrics_path, row)
            if row["test_acc"] is not None:
                bar.set_postfix(acc=f"{row['test_acc']:.3f}")
            for cb in callbacks:
                cb(t, row)
    finally:
        if hasattr(trainer, "shutdown"):
            trainer.shutdown()
        torch.set_num_threads(threads_before)
    save_model(model.state_dict(), run_dir / "model.safetensors")  # + digest when trusted
    (run_dir / "poison.json").write_text(json.dumps(setup.poison.to_json()))
    if outputs:
        write_training_outputs(metrics, run_dir)
    final = metrics[-1].get("test_acc") if metrics else None
    log.info(
        "run %s done: %d rounds, final test acc %s",
        run_dir,
        T,
        "n/a" if final is None else f"{final:.4f}",
    )
    return RunResult(run_dir, cfg, model, metrics, history)


# ----------------------------------------------------------------------------- outputs


CSV_COLUMNS = ("round", "test_acc", "test_loss", "asr", "participants", "wall_s", "link_s")
CSV_COLUMNS += ("cum_link_s", "bytes")


def write_metrics_csv(
    rows: Sequence[Mapping[str, Any]], path: Path, columns: Sequence[str] = CSV_COLUMNS
) -> Path:
    """metrics.jsonl as a table: one row per round, lists (participants) space-separated.

    ``columns``: which keys, in order (asr only when some round has it).
    """
    cols = [c for c in columns if c != "asr" or any(r.get("asr") is not None for r in rows)]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            cells = []
            for c in cols:
                v = r.get(c)
                if isinstance(v, list | tuple):
                    v = " ".join(str(n) for n in v)
                cells.append("" if v is None else v)
            w.writerow(cells)
    return path


def write_training_outputs(
    rows: Sequence[Mapping[str, Any]],
    run_dir: Path,
    columns: Sequence[str] = CSV_COLUMNS,
    title: str | None = None,
) -> tuple[Path, Path | None]:
    """``metrics.csv`` and ``training.png`` (accuracy and loss per round) in ``run_dir``.

    Every FedAvg run writes them: :func:`train` (``scaleflu train``, the Table II runs) and
    the testbed's edge server. A plotting failure is logged; the png is then None.
    """
    run_dir = Path(run_dir)
    csv_path = write_metrics_csv(rows, run_dir / "metrics.csv", columns)
    try:
        png = plot_training(
            rows, run_dir / "training.png", title=title or f"FedAvg: {run_dir.name}"
        )
    except Exception as exc:  # a plotting problem must not fail a finished run
        log.warning("training.png not written: %s", exc)
        png = None
    return csv_path, png


# ----------------------------------------------------------------------------- loading


@dataclass
class LoadedRun:
    """A finished (or interrupted) run rebuilt from its directory."""

    run_dir: Path
    cfg: Config
    setup: FLSetup  # data sets, partitions, poisoning; setup.model holds the initial model
    model: nn.Module  # the final global model (the last completed round's)
    history: HistoryStore
    metrics: list[dict[str, Any]]

    @property
    def train(self) -> ImageData:
        """Training set as the clients hold it."""
        return self.setup.train

    @property
    def test(self) -> ImageData:
        """Test set."""
        return self.setup.test

    @property
    def parts(self) -> list[np.ndarray]:
        """Client partitions (global training-sample indices)."""
        return self.setup.parts

    @classmethod
    def held(
        cls,
        run_dir: str | Path,
        setup: FLSetup,
        history: HistoryStore,
        state: Mapping[str, torch.Tensor],
        model: nn.Module | None = None,
    ) -> LoadedRun:
        """A run a process holds in memory (the edge server), as :func:`load_run` rebuilds one
        from its folder: ``state`` is the current global model, held in a copy of ``model`` (a
        module of the run's architecture; None: a fresh one)."""
        model = copy.deepcopy(model) if model is not None else setup.new_model()
        model.load_state_dict(dict(state))
        metrics = metrics_from_history(history)
        return cls(Path(run_dir), setup.cfg, setup, model, history, metrics)


def load_run(run_dir: str | Path) -> LoadedRun:
    """Rebuild cfg, data, partitions and final model of a run directory, and open its history."""
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
    setup = build_setup(read_config_file(cfg_path))
    cfg = setup.cfg
    history = open_history(cfg, run_dir, setup.model)
    model = setup.new_model()
    final = run_dir / "model.safetensors"
    last = history.last_completed_round()
    # after an erasure the history's final model is the unlearned one (the next request, and
    # its receipt's "model before", start there), not the trained model.safetensors
    if final.is_file() and last == int(cfg.fl.rounds) and not history.erased_clients():
        model.load_state_dict(load_model(final))  # checks the digest when trusted
    elif last > 0 or (history.dir / "global_00001.safetensors").is_file():
        model.load_state_dict(history.final_model())
    metrics = metrics_from_history(history, last)
    return LoadedRun(run_dir, cfg, setup, model, history, metrics)
