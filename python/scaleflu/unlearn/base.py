"""What every unlearning method shares: the context, the result schema, the Unlearner interface.

A method is an object with a ``name`` and ``run(ctx) -> UnlearnResult``. The
:class:`UnlearnContext` holds the trained run (config, data, partitions, history, final and
initial models), the resolved request, the evaluation sets, and helpers: FedAvg rounds with the
remaining clients (:meth:`UnlearnContext.fedavg_rounds`: the run's round,
:meth:`UnlearnContext.strategy`, the one of :mod:`scaleflu.fl.strategy`, with the FL runtime's
trainer) and :meth:`UnlearnContext.make_result`, which measures a model with every metric so a
method only produces the model and its costs.

Result schema (``UnlearnResult.to_dict()``, ``schema: 1``) -- documented in docs/scale.md:
``method, mode, request{...}, protocol, run_dir, metrics{test_acc, ra, ra_clean, fa, fr,
fa_protocol, fa_clean, backdoor_asr, mia_cm_loss_auc, mia_ref_auc, mia_ref_tpr_1fpr,
mia_canary_n, mia_canary_loss_auc, mia_canary_auc, mia_canary_tpr_1fpr,
fa_class_test, ra_class_test, mia_loss_member_rate, mia_loss_auc,
mia_entropy_member_rate, mia_entropy_auc, relearn_rounds}, original{same keys for the model
before unlearning}, cost{wall_s, cpu_s, bytes, link_s, fl_rounds, steps,
overhead}, aoi{mean_s,
mean_rounds, mean_s_all, mean_rounds_all, sum_s_trace}, details{...method specific},
config{...}, model_path, created``.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from scaleflu.config import (
    Config,
    ConfigError,
    Section,
    _read_file,
    as_config,
    default_config,
    merge,
    parse_override,
)
from scaleflu.fl.data import ImageData, triggered_test_set
from scaleflu.fl.device import config_device
from scaleflu.fl.fedavg import (
    BNRecalibrator,
    LocalConfig,
    derive_seed,
    make_trainer,
    server_val_permutation,
)
from scaleflu.fl.history import state_bytes
from scaleflu.fl.integrity import IntegrityError, check_mac, key_for, state_sha256, write_mac
from scaleflu.fl.models import build_model
from scaleflu.fl.run import LoadedRun, load_run
from scaleflu.fl.strategy import FedAvg
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.audit import (
    AuditSet,
    AuditSettings,
    ShadowSet,
    build_audit_set,
    empty_metrics,
    run_audit,
)
from scaleflu.unlearn.metrics import (
    class_matched_indices,
    communication_overhead,
    evaluate_model,
    logit_confidence,
    predict,
    relearn_rounds,
    true_label_probs,
)
from scaleflu.unlearn.request import (
    ResolvedRequest,
    UnlearnRequest,
    parse_request,
    resolve_request,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MODES = ("default", "paper")
UNLEARN_SECTIONS = ("scale", "baselines")  # what an unlearning run may set
State = dict[str, torch.Tensor]


@dataclass
class UnlearnResult:
    """One unlearning run's outcome in the shared JSON schema (see the module docstring)."""

    method: str
    mode: str | None
    request: dict[str, Any]
    protocol: str
    run_dir: str
    metrics: dict[str, Any]
    original: dict[str, Any]
    cost: dict[str, Any]
    aoi: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    erasure: dict[str, Any] | None = (
        None  # what the history store erased (HistoryStore.erase_clients)
    )
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (NaN becomes None)."""
        return _clean(asdict(self))

    def to_json(self, indent: int | None = 2) -> str:
        """The result as a JSON string."""
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnlearnResult:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**dict(data))


def _read_metrics_cache(path: Path) -> dict[str, Any] | None:
    """Metrics kept by :meth:`UnlearnContext.original_metrics` (None: absent or unusable)."""
    if not path.is_file():
        return None
    try:
        key = key_for(path)
        if key is not None:
            check_mac(key, path, "metrics cache")
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, int | float | str))
            for k, v in data.items()
        ):
            raise ValueError("not a flat object of metrics")
    except (OSError, ValueError, IntegrityError) as exc:
        log.warning("%s: metrics cache not used (%s); measuring again", path, exc)
        return None
    log.info("original model's metrics from %s", path)
    return data


def _write_metrics_cache(path: Path, metrics: Mapping[str, Any]) -> None:
    """Keep metrics for the next method or request on the same model (digest when trusted)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(_clean(dict(metrics)), sort_keys=True))
        key = key_for(path)
        if key is not None:
            write_mac(key, tmp, path.name)
        tmp.replace(path)
    except OSError as exc:  # a read-only run folder: measured each time, nothing lost
        log.warning("%s: metrics cache not written (%s)", path, exc)


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


class UnlearningFailedError(RuntimeError):
    """A method produced no usable model (e.g. a non-finite parameter): the cell is failed.

    Never scored: :meth:`UnlearnContext.make_result` raises it before any metric is computed,
    and the experiment harness records it as the cell's error with its reason.
    """


def nonfinite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors of ``state`` holding a NaN or an infinity."""
    return [
        k
        for k, v in state.items()
        if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]


@runtime_checkable
class Unlearner(Protocol):
    """An unlearning method: ``run`` turns a context into a result."""

    name: str

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Unlearn ``ctx.request`` from ``ctx.run`` and measure the outcome."""
        ...


@dataclass
class RoundsCost:
    """Link and time cost of FedAvg rounds run during unlearning."""

    rounds: int = 0
    bytes: int = 0
    link_s: float = 0.0
    wall_s: float = 0.0


def resolve_unlearn_config(
    run_cfg: Mapping[str, Any],
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Config:
    """The run's config with current ``scale`` defaults filled in and user scale settings on top.

    Only ``scale.*`` and ``baselines.*`` may differ from the run: data, model and FL settings
    belong to the run.
    """
    cfg = copy.deepcopy(dict(run_cfg))
    defaults = default_config()
    for section in UNLEARN_SECTIONS:
        if section in defaults:
            filled = copy.deepcopy(defaults[section])
            _deep_update(filled, cfg.get(section) or {}, section)
            cfg[section] = filled
    updates: list[Mapping[str, Any]] = []
    if path is not None:
        updates.append(_read_file(Path(path)))
    updates += [parse_override(o) for o in overrides]
    for upd in updates:
        for key, value in upd.items():
            if key in UNLEARN_SECTIONS:
                continue
            if key not in cfg or merge({key: cfg[key]}, {key: value}) != {key: cfg[key]}:
                raise ConfigError(
                    f"unlearn settings may only change scale.* or baselines.*; {key} differs "
                    "from the run "
                    "(train a new run to change it)"
                )
        mine = {k: v for k, v in upd.items() if k in UNLEARN_SECTIONS}
        if mine:
            cfg = merge(cfg, mine)
    return as_config(cfg)


def _deep_update(base: dict[str, Any], upd: Mapping[str, Any], where: str) -> None:
    """``upd`` (a run's saved settings) over ``base`` (today's defaults); a setting that this
    version no longer has (retired: an older run saved it) is left out with a log line."""
    for k, v in upd.items():
        if k not in base:
            log.info("%s.%s: a setting of an older version, not used", where, k)
        elif isinstance(v, Mapping) and isinstance(base.get(k), dict):
            _deep_update(base[k], v, f"{where}.{k}")
        else:
            base[k] = copy.deepcopy(v)


class UnlearnContext:
    """A trained run plus a resolved request, evaluation sets and shared helpers."""

    def __init__(
        self,
        run: LoadedRun,
        request: ResolvedRequest,
        cfg: Mapping[str, Any],
        mode: str = "default",
        progress: bool = True,
        audit: bool = True,
        measure: bool = True,
        metrics_cache: bool = False,
    ) -> None:
        """Build evaluation sets (validation split, D_u, D_r, triggered test) for ``request``.

        What :meth:`make_result` measures: with ``measure`` every metric of the result and of
        the model before (forward passes over the evaluation sets), with ``audit`` also the
        expensive audits (the calibrated MIAs' reference models, the per-example audit's
        shadows, the relearn time), as Table II does. ``scaleflu unlearn`` measures only on
        request (``--evaluate``, ``--audit``), so the command costs about what the method
        costs. ``metrics_cache``: keep the model before's metrics in the run folder for the next
        method or request (:meth:`original_metrics`).
        """
        if mode not in MODES:
            raise ConfigError(f"unlearn mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.full_audit = bool(audit)
        self.measure = bool(measure or audit)
        self.metrics_cache = bool(metrics_cache)
        self.run = run
        self.request = request
        self.cfg: Config = as_config(cfg)
        self.mode = mode
        self.progress = progress
        self.seed = int(self.cfg.seed)
        sc = self.cfg.scale
        setup = run.setup
        # Server-side validation set (MEC assumption: the edge server holds a small public
        # set from the task's distribution): a seeded slice of the test set, left out of the
        # test metrics so no method is scored on what it tuned on.
        # (fl.bn_recalibration takes the head of the same permutation: fl.fedavg.server_images)
        perm = server_val_permutation(len(setup.test), self.seed)
        n_val = min(int(sc.val_size), len(setup.test) // 2)
        self.val: ImageData = setup.test.subset(np.sort(perm[:n_val]))
        self.test: ImageData = setup.test.subset(np.sort(perm[n_val:]))
        # what the model must still do after unlearning, measured on the validation set: a
        # class removed from the whole federation is left out (scoring it would reward
        # remembering it); a class removed from some clients stays (the others still hold it)
        # and the validation samples of such a class (empty otherwise): its forgetting is
        # observable there
        req = request.request
        gone = np.zeros(len(self.val), dtype=bool)
        if req.whole_class:
            gone = np.isin(self.val.labels.numpy(), list(req.classes))
        self.val_retain: ImageData = self.val.subset(np.flatnonzero(~gone))
        self.val_forget: ImageData = self.val.subset(np.flatnonzero(gone))
        self.triggered: ImageData | None = None
        if len(setup.poison.backdoor_indices):
            self.triggered = triggered_test_set(
                self.test, setup.poison.target_label, setup.poison.trigger_size
            )
        self.forget_idx = request.forget_indices
        self.remaining_idx = request.remaining_indices
        self.forget: ImageData = setup.train.subset(self.forget_idx)
        self.forget_clean: ImageData = setup.clean_train.subset(self.forget_idx)
        cap = int(sc.eval.max_samples)
        self.remaining: ImageData = setup.train.subset(self._cap(self.remaining_idx, cap, 42))
        mia_n = int(sc.eval.mia_samples)
        self.members: ImageData = setup.train.subset(self._cap(self.remaining_idx, mia_n, 43))
        self.nonmembers: ImageData = self.test.subset(
            self._cap(np.arange(len(self.test)), mia_n, 44)
        )
        # the protocol with power: RA on true labels, the class-matched calibrated MIA's sets
        self.remaining_clean: ImageData = setup.clean_train.subset(
            self._cap(self.remaining_idx, cap, 42)
        )
        self.mia_target_idx, self.mia_nonmembers = class_matched_indices(
            setup.train,
            setup.clean_train.labels,
            np.setdiff1d(self.forget_idx, setup.poison.canary_indices),  # canaries: below
            setup.poison,
            self.test,
            mia_n,
            self.seed,
        )
        self.mia_target: ImageData = setup.train.subset(self.mia_target_idx)
        # the canary MIA: D_u's membership canaries against their held-out twins (same true
        # class, random wrong label alike, trained on by nobody; scaleflu.fl.data.insert_canaries)
        in_du = np.isin(setup.poison.canary_members, self.forget_idx)
        self.canary_target_idx = setup.poison.canary_members[in_du]
        self.canary_heldout_idx = setup.poison.canary_heldout[in_du]
        self.canary_target: ImageData = setup.train.subset(self.canary_target_idx)
        self.canary_nonmembers: ImageData = setup.train.subset(self.canary_heldout_idx)
        # the per-example membership audit (unlearn.audit): shadows shared by the run's requests
        self.audit_settings = AuditSettings.from_config(sc.eval.get("audit"))
        self._audit: tuple[ShadowSet, AuditSet | None] | None = None
        self.audit_info: dict[str, Any] = {}
        self._mia_ref: tuple[np.ndarray, np.ndarray] | None = None
        self._canary_ref: tuple[np.ndarray, np.ndarray] | None = None
        self.mia_reference_info: dict[str, Any] = {}
        self.groups = run.history.groups
        self.link = run.history.link
        self._original_metrics: dict[str, Any] | None = None
        self.last_state: State | None = None
        self._p_old: torch.Tensor | None = None

    @staticmethod
    def _cap(idx: np.ndarray, cap: int, tag: int) -> np.ndarray:
        if len(idx) <= cap:
            return idx
        rng = np.random.default_rng(np.random.SeedSequence([0, tag]))
        return np.sort(rng.choice(idx, size=cap, replace=False))

    @classmethod
    def from_run_dir(
        cls,
        run_dir: str | Path,
        request: UnlearnRequest | str,
        mode: str = "default",
        config: str | Path | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        progress: bool = True,
        run: LoadedRun | None = None,
        **measuring: bool,
    ) -> UnlearnContext:
        """Load the run (unless given: the one a server holds), resolve the config and the
        request (its text is parsed here). ``measuring``: ``audit``, ``measure``,
        ``metrics_cache`` (see the constructor)."""
        run = run if run is not None else load_run(run_dir)
        cfg = resolve_unlearn_config(run.cfg, config, overrides)
        return cls.for_request(run, request, cfg, mode, progress, **measuring)

    @classmethod
    def for_request(
        cls,
        run: LoadedRun,
        request: UnlearnRequest | str,
        cfg: Mapping[str, Any],
        mode: str = "default",
        progress: bool = True,
        **measuring: bool,
    ) -> UnlearnContext:
        """A context for the request (or its text) on a loaded run with a resolved config."""
        setup = run.setup
        resolved = resolve_request(
            parse_request(request) if isinstance(request, str) else request,
            setup.parts,
            setup.train.labels,
            setup.train.num_classes,
            setup.poison.backdoor_indices,
            setup.poison.flipped_indices,
            int(cfg.seed),
            setup.poison.canary_copies,
        )
        return cls(run, resolved, cfg, mode, progress, **measuring)

    def nothing_to_forget(self) -> str | None:
        """Why the request touches nothing the run learned, or None when it does.

        Its forget set is empty, or none of its clients took part in a round the history
        records: never selected, or their updates were erased from the history already.
        """
        text = self.request.request.text
        if len(self.forget_idx) == 0:
            return f"request {text}: the forget set is empty"
        history = self.run.history
        targets = set(self.request.targets)
        if any(targets & set(history.participants(t)) for t in history.rounds()):
            return None
        who = ", ".join(map(str, sorted(targets)))
        erased = sorted(targets & history.erased_clients())
        if erased:
            return (
                f"request {text}: client(s) {', '.join(map(str, erased))} were erased from the "
                f"history of {self.run.run_dir} already; it records no update of client(s) {who}"
            )
        return (
            f"request {text}: client(s) {who} took part in no round of {self.run.run_dir} "
            f"(rounds 1..{history.last_completed_round()}): the model never learned from this data"
        )

    # -- models --------------------------------------------------------------------------

    @property
    def scale_cfg(self) -> Section:
        """The ``scale`` config section."""
        return self.cfg.scale

    def original_state(self) -> State:
        """The trained global model Theta (a copy)."""
        return {k: v.detach().clone() for k, v in self.run.model.state_dict().items()}

    def initial_state(self) -> State:
        """The run's initial model Theta[1] (a copy)."""
        return {k: v.detach().clone() for k, v in self.run.setup.model.state_dict().items()}

    def new_model(self, state: Mapping[str, torch.Tensor] | None = None) -> nn.Module:
        """A fresh model of the run's architecture, loaded with ``state`` when given."""
        model = self.run.setup.new_model()
        if state is not None:
            model.load_state_dict(dict(state))
        return model

    def local_config(self, epochs: int | None = None) -> LocalConfig:
        """The run's local SGD settings (optionally another epoch count)."""
        return LocalConfig.from_config(self.cfg.fl, epochs)

    # -- FedAvg with the remaining clients -----------------------------------------------

    def fedavg_rounds(
        self,
        state: Mapping[str, torch.Tensor],
        rounds: int,
        first_round: int,
        local: LocalConfig | None = None,
        aoi: AoITracker | None = None,
        desc: str = "FedAvg",
        seed: int | None = None,
    ) -> tuple[State, RoundsCost]:
        """Run FedAvg rounds ``first_round..`` on D_r (the run's selection, minus removed clients).

        The run's round (:meth:`strategy`) with the FL runtime's trainer; clients keep their
        round-t selection seeds, so Retrain selects exactly as the original run did. Updates
        ``aoi`` if given. ``seed`` (default: the run's) seeds the selection and the clients'
        batch order.
        """
        seed = self.seed if seed is None else int(seed)
        fl = self.cfg.fl
        local = local or self.local_config()
        parts = self.request.remaining
        strategy = self.strategy(seed)
        model = self.new_model()
        kind = fl.trainer if fl.backend == "local" else "auto"
        trainer = make_trainer(
            kind,
            model,
            self.run.setup.train,
            parts,
            local,
            seed,
            int(fl.get("workers", 1)),  # a run saved before fl.workers existed: 1
            self.device,
        )
        cur = {k: v.detach().clone() for k, v in state.items()}
        cost = RoundsCost()
        t0 = time.perf_counter()
        model_bytes = state_bytes(cur)
        for t in tqdm(
            range(first_round, first_round + rounds),
            desc=desc,
            unit="round",
            disable=not self.progress,
            leave=False,
        ):
            result = strategy.fit_round(t, cur, trainer)
            if result is None:  # every selected client left the federation
                continue
            new = result.state
            link_s = self.link.seconds(model_bytes)
            nbytes = model_bytes
            if self.link.count_uplink:
                link_s += len(result.clients) * self.link.seconds(model_bytes)
                nbytes += len(result.clients) * model_bytes
            if aoi is not None:
                aoi.full_round(link_s, changed_groups(cur, new, self.groups, self.link_tol))
            cur = new
            cost.rounds += 1
            cost.bytes += nbytes
            cost.link_s += link_s
        cost.wall_s = time.perf_counter() - t0
        if hasattr(trainer, "shutdown"):
            trainer.shutdown()  # the worker threads of fl.workers > 1
        return cur, cost

    def strategy(self, seed: int | None = None, recalibrate: bool = True) -> FedAvg:
        """The run's FedAvg round over the remaining clients (their D_n minus D_u,n; a client
        left with no data is never selected): the run's selection (seeded by ``seed``, default
        the run's), screening and, with ``recalibrate``, BatchNorm re-estimation."""
        sizes = {n: len(p) for n, p in enumerate(self.request.remaining)}
        seed = self.seed if seed is None else seed
        # built on the first aggregation (it draws a model from torch's generator, as then)
        recal = (lambda state: self.bn_recal(state)) if recalibrate else None
        return FedAvg.from_config(self.cfg, sizes, seed, recalibrate=recal)

    @functools.cached_property
    def bn_recal(self) -> BNRecalibrator:
        """The server's BatchNorm re-estimation after each aggregation, as in the run's training
        (``fl.bn_recalibration``; a no-op when 0 or the model has no BatchNorm)."""
        model = self.new_model().to(self.device)
        return BNRecalibrator.from_config(self.cfg, model, self.run.setup.test)

    @property
    def device(self) -> torch.device:
        """``fl.device`` resolved: where methods compute (states they return stay on the CPU)."""
        return config_device(self.cfg)

    @property
    def link_tol(self) -> float:
        """Tolerance above which a parameter group counts as updated."""
        return float(self.run.history.update_tol)

    # -- measuring -----------------------------------------------------------------------

    def _old_probs(self) -> torch.Tensor:
        if self._p_old is None:
            model = self.new_model(self.original_state())
            self._p_old = true_label_probs(predict(model, self.forget), self.forget.labels)
        return self._p_old

    def mia_reference(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean phi of ``scale.eval.mia_shadows`` reference models on the MIA sets (cached).

        Each reference is FedAvg on D_r (Retrain's rounds, selection and local settings) from
        its own random initial model (seeded ``(seed, 900 + k)``): trained without D_u and
        without the non-members, unlike every model audited. None when ``mia_shadows`` is 0.
        """
        ev = self.scale_cfg.eval
        n = int(ev.mia_shadows or 0)
        if n <= 0 or len(self.mia_target) == 0:
            return None
        self._reference_scores()
        return self._mia_ref

    def canary_reference(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The same reference models' mean phi on D_u's canaries and their held-out twins."""
        n = int(self.scale_cfg.eval.mia_shadows or 0)
        if n <= 0 or len(self.canary_target) == 0:
            return None
        self._reference_scores()
        return self._canary_ref

    def _reference_scores(self) -> None:
        """Train the ``mia_shadows`` reference models once; score every MIA set with them."""
        ev = self.scale_cfg.eval
        n = int(ev.mia_shadows or 0)
        if self._mia_ref is None:
            rounds = int(ev.mia_shadow_rounds or self.cfg.fl.rounds)
            t0 = time.perf_counter()
            sets = (
                self.mia_target,
                self.mia_nonmembers,
                self.canary_target,
                self.canary_nonmembers,
            )
            phi = [np.zeros(len(d)) for d in sets]
            for k in range(n):
                torch.manual_seed(derive_seed(self.seed, 900 + k))
                init = build_model(*self.run.setup.model_args()).state_dict()
                state, _ = self.fedavg_rounds(init, rounds, 1, desc=f"MIA reference {k + 1}")
                model = self.new_model(state)
                for acc, d in zip(phi, sets, strict=True):
                    if len(d):
                        acc += logit_confidence(predict(model, d), d.labels)
            self._mia_ref = (phi[0] / n, phi[1] / n)
            self._canary_ref = (phi[2] / n, phi[3] / n)
            self.mia_reference_info = {
                "models": n,
                "rounds": rounds,
                "wall_s": time.perf_counter() - t0,
                "target": len(self.mia_target),
                "nonmembers": len(self.mia_nonmembers),
                "canaries": len(self.canary_target),
            }
            log.info(
                "MIA reference: %d model(s) of %d rounds in %.1fs",
                n,
                rounds,
                self.mia_reference_info["wall_s"],
            )

    def shadows(self) -> tuple[ShadowSet, AuditSet | None] | None:
        """The run's audit shadows (trained or loaded once) and this request's audited set.

        None when ``scale.eval.audit.shadows`` is 0. :attr:`audit_info` records the shadows'
        cost (CPU seconds of training them, per run) and the set.
        """
        if not self.audit_settings.enabled:
            return None
        if self._audit is None:
            c0 = time.process_time()
            shadows = ShadowSet(self.run, self.cfg, self.audit_settings, self.progress)
            info = shadows.ensure()
            aset = build_audit_set(
                shadows,
                canary_members=self.canary_target_idx,
                canary_heldout=self.canary_heldout_idx,
                canary_min=int(self.scale_cfg.eval.canary_min or 1),
                train=self.run.setup.train,
                sample_idx=self.mia_target_idx,
                sample_nonmembers=self.mia_nonmembers,
            )
            self._audit = (shadows, aset)
            self.audit_info = {
                **info,
                "set": None if aset is None else aset.name,
                "positives": 0 if aset is None else len(aset.pos),
                "negatives": 0 if aset is None else len(aset.neg),
                "load_cpu_s": time.process_time()
                - c0
                - (info["train_cpu_s"] if info["trained_now"] else 0.0),
            }
        return self._audit

    def audit(self, model: nn.Module) -> dict[str, Any]:
        """The per-example membership audit of ``model`` (``audit_*`` metrics; None when off)."""
        got = self.shadows()
        if got is None:
            return empty_metrics()
        shadows, aset = got
        c0 = time.process_time()
        metrics, cal = run_audit(model, shadows, aset, self.seed)
        if cal:
            self.audit_info.update(sigma=cal["sigma"], margin=cal["margin"])
        self.audit_info["score_cpu_s"] = time.process_time() - c0
        return metrics

    def evaluate(
        self, state: Mapping[str, torch.Tensor], relearn: bool = True, label: str = "the model"
    ) -> dict[str, Any]:
        """Every metric of a model state (see :mod:`scaleflu.unlearn.metrics`); without
        :attr:`full_audit` the calibrated MIAs, the per-example audit (``audit_*``) and the
        relearn time are None (not measured). A log line per stage names ``label``."""
        t0 = time.perf_counter()
        audits = "membership audits" if self.full_audit else "forward-pass membership audits"
        log.info("measuring %s: accuracies (test, RA, FA) and %s", label, audits)
        model = self.new_model(state).to(self.device)
        setup = self.run.setup
        out = evaluate_model(
            model,
            test=self.test,
            remaining=self.remaining,
            forget=self.forget,
            forget_clean=self.forget_clean,
            nonmembers=self.nonmembers,
            members=self.members,
            protocol=self.request.protocol,
            p_old_forget=self._old_probs(),
            triggered=self.triggered,
            target_label=setup.poison.target_label if self.triggered is not None else None,
            classes=list(self.request.request.classes) if self.request.kind == "class" else [],
            remaining_clean=self.remaining_clean,
            mia_target=self.mia_target,
            mia_nonmembers=self.mia_nonmembers,
            mia_reference=self.mia_reference() if self.full_audit else None,
            canary_target=self.canary_target,
            canary_nonmembers=self.canary_nonmembers,
            canary_reference=self.canary_reference() if self.full_audit else None,
            canary_min=int(self.scale_cfg.eval.canary_min or 1),
        )
        out.update(self.audit(model) if self.full_audit else empty_metrics())
        out["relearn_rounds"] = None
        ev = self.scale_cfg.eval
        if relearn and self.full_audit and int(ev.relearn_max_rounds) > 0:
            target = float(ev.relearn_target) * float(self.original_metrics()["fa"] or 0.0)
            log.info(
                "measuring %s: rounds to relearn the forget set (at most %d)",
                label,
                int(ev.relearn_max_rounds),
            )
            out["relearn_rounds"] = relearn_rounds(
                model,
                state,
                setup.train,
                self.forget_idx,
                target,
                self.local_config(1),
                self.seed,
                int(ev.relearn_max_rounds),
            )
        log.info("measured %s in %.1f s", label, time.perf_counter() - t0)
        return out

    def original_metrics(self) -> dict[str, Any]:
        """Metrics of the model before unlearning (cached in memory and in the run folder).

        They are the same for every method serving the same request on the same model, so with
        ``metrics_cache`` the first measurement is kept in ``run_dir/cache/original-<key>.json``
        (with its digest when the run is trusted): the key covers the model's digest, the
        request, the seed, the evaluation settings and :attr:`full_audit`. A cache file that fails
        to parse or its digest is measured again and replaced.
        """
        if self._original_metrics is None:
            state = self.original_state()
            path = self._metrics_cache_path("original", state) if self.metrics_cache else None
            got = _read_metrics_cache(path) if path is not None else None
            if got is None:
                got = self.evaluate(state, relearn=False, label="the model before unlearning")
                if path is not None:
                    _write_metrics_cache(path, got)
            self._original_metrics = got
        return self._original_metrics

    def _metrics_cache_path(self, what: str, state: Mapping[str, torch.Tensor]) -> Path:
        sc = self.scale_cfg
        key = {
            "schema": SCHEMA_VERSION,
            "model": state_sha256(state),
            "request": self.request.request.text,
            "seed": self.seed,
            "val_size": sc.val_size,
            "eval": sc.eval,
            "audit": self.full_audit,
            "fl": self.cfg.fl if self.full_audit else None,  # the reference models train with it
            "device": str(self.device),
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode())
        return Path(self.run.run_dir) / "cache" / f"{what}-{digest.hexdigest()[:24]}.json"

    def make_result(
        self,
        method: str,
        state: Mapping[str, torch.Tensor],
        *,
        wall_s: float,
        bytes_: int,
        link_s: float,
        fl_rounds: int,
        aoi: AoITracker,
        top_layers: list[str] | None = None,
        steps: int = 0,
        sum_aoi_trace: list[float] | None = None,
        details: Mapping[str, Any] | None = None,
        mode: str | None = None,
        cpu_s: float | None = None,
    ) -> UnlearnResult:
        """Measure ``state`` and pack the result (costs are the method's own).

        The state is kept as ``self.last_state`` so callers (the CLI) can save the model.
        A state with a non-finite parameter is not measured: :class:`UnlearningFailedError`
        (``details["failure"]``, when the method gives one, says why it happened).
        """
        bad = nonfinite_tensors(state)
        if bad:
            why = (details or {}).get("failure")
            raise UnlearningFailedError(
                f"{method} produced a model with non-finite values in {len(bad)} of "
                f"{len(state)} tensors ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})"
                + (f": {why}" if why else "")
            )
        self.last_state = {k: v.detach().clone() for k, v in state.items()}
        # measured on request (scaleflu unlearn --evaluate / --audit; always in experiments)
        metrics: dict[str, Any] = {}
        if self.measure:
            self.original_metrics()  # first (cached): the relearn test's target depends on it
            metrics = self.evaluate(state, label=f"the model after {method}")
        sc = self.scale_cfg
        sel = aoi.mean(top_layers) if top_layers else aoi.mean()
        every = aoi.mean()
        aoi_out = {
            "mean_s": sel["aoi_s"],
            "mean_rounds": sel["aoi_rounds"],
            "mean_s_all": every["aoi_s"],
            "mean_rounds_all": every["aoi_rounds"],
            "layers": list(top_layers) if top_layers else None,
            "sum_s_trace": list(sum_aoi_trace or []),
        }
        cost = {
            "wall_s": wall_s,
            "cpu_s": cpu_s,
            "bytes": int(bytes_),
            "link_s": link_s,
            "fl_rounds": fl_rounds,
            "steps": steps,
            "overhead": communication_overhead(
                link_s, sel["aoi_s"], float(sc.comm_a), float(sc.comm_b)
            ),
        }
        return UnlearnResult(
            method=method,
            mode=mode,
            request=self.request.to_json(),
            protocol=self.request.protocol,
            run_dir=str(self.run.run_dir),
            metrics=metrics,
            original=self.original_metrics() if self.measure else {},
            cost=cost,
            aoi=aoi_out,
            details={
                **dict(details or {}),
                **({"audit": dict(self.audit_info)} if self.audit_info else {}),
            },
            config={
                "scale": copy.deepcopy(sc),
                "fl": copy.deepcopy(self.cfg.fl),
                # what was measured: metrics (and original) empty without "measure"; the
                # calibrated MIAs, the per-example audit and the relearn time None without "audit"
                "measure": self.measure,
                "audit": self.full_audit,
            },
        )
