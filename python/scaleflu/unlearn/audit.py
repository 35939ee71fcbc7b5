"""The per-example membership audit: offline LiRA against shadow federations of the run.

Question asked per forgotten example (U-LiRA's, Hayes et al., "Inexact Unlearning Needs More
Careful Evaluations to Avoid a False Sense of Privacy", SaTML 2025): can an attacker tell that
this example was in the training set of the model it is shown, when it is calibrated on how
models trained *without* that very example behave on it?

* **Shadow federations** (:class:`ShadowSet`): ``scale.eval.audit.shadows`` (K, even) FedAvg runs
  of the run's own procedure -- its clients, rounds (``audit.rounds``, null: ``fl.rounds``),
  local epochs, learning rate, batch size, client selection rule and BatchNorm handling -- each
  from its own random initial model and seed, on a random half of every client's data (LiRA's
  shadow design, Carlini et al. 2022): every training example (a membership canary with all its
  copies counts as one) is held in exactly K/2 shadows and left out of the other K/2. They are
  trained once per run and kept in ``RUN/audit/<settings>/`` (safetensors, with the run's
  digest when the run is trusted), so every method and every request of a run shares them.
* **Score** (offline LiRA with a fixed variance, Carlini et al. 2022, Sec. VI): per audited
  example ``x``, ``phi = z_y - logsumexp_{j != y} z_j`` (the logit-scaled confidence of its label,
  from the logits, stable near p = 1); ``mu_out(x)`` = the mean ``phi`` of the shadows that did
  not hold ``x``; the audited model's score is ``(phi_model(x) - mu_out(x)) / sigma`` with
  ``sigma`` the pooled standard deviation of the OUT shadows' ``phi`` around their per-example
  means. The shadows that held ``x`` give its memorisation margin ``(mu_in - mu_out) / sigma``:
  how far the run's own procedure moves ``x``, the audit's power on that example.
* **Positives and negatives** (per request): D_u's membership canaries (the memorised
  mislabelled duplicates of ``data.poison.canaries``) against their held-out twins (same true
  class, the same wrong label, trained on by nobody; twin ``i`` is calibrated on the shadows
  where canary ``i`` was left out, so a canary and its twin see the same shadows) when D_u holds
  at least ``scale.eval.canary_min`` of them; otherwise a class-matched sample of D_u against
  held-out test images of the same classes transformed alike (``class_matched_indices``: the
  class request, and runs without canaries). The audited model scores both sets, so a shift of
  the whole model (more or less confident everywhere) moves positives and negatives together.
* **Reported**: AUC, TPR at 1 % and 0.1 % FPR (threshold: the negatives' upper quantile; with
  fewer than 1/FPR negatives it is their maximum, ``audit_fpr_floor`` = 1 / negatives says the
  smallest FPR the set resolves), each with a bootstrap confidence interval (positives and
  negatives resampled independently, ``audit.bootstrap`` draws, level ``audit.ci``; the shadows
  are not resampled).

The full U-LiRA trains shadow *unlearnings* (each method run on each shadow); that costs a
method's run per shadow and request and is not done here: the OUT distribution is that of a
model retrained without the example, which is the reference every method is measured against.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData, PoisonInfo
from scaleflu.fl.device import config_device, infer_batch, infer_slices
from scaleflu.fl.fedavg import BNRecalibrator, LocalConfig, derive_seed, make_trainer
from scaleflu.fl.integrity import key_for, load_model, save_model
from scaleflu.fl.models import build_model
from scaleflu.fl.strategy import FedAvg

log = logging.getLogger(__name__)

AUDIT_DIR = "audit"
MASK_KEY = "__audit_in__"  # the shadow's inclusion mask, stored beside its weights
SEED_TAG = 950  # shadow k's seed: derive_seed(run seed, SEED_TAG, k)
FPRS = (0.01, 0.001)


@dataclass(frozen=True)
class AuditSettings:
    """``scale.eval.audit``: K shadows (0: off), their rounds, the bootstrap's draws and level."""

    shadows: int = 0
    rounds: int | None = None
    bootstrap: int = 1000
    ci: float = 0.95

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> AuditSettings:
        """Typed and checked (a :class:`ConfigError` names the bad key)."""
        sec = dict(section or {})
        unknown = set(sec) - {"shadows", "rounds", "bootstrap", "ci"}
        if unknown:
            raise ConfigError(f"unknown key scale.eval.audit.{sorted(unknown)[0]}")
        k = int(sec.get("shadows") or 0)
        if k < 0 or k % 2 or k == 2:
            raise ConfigError(
                f"scale.eval.audit.shadows must be 0 (off) or an even number >= 4, got {k}"
            )
        rounds = sec.get("rounds")
        if rounds is not None and int(rounds) < 1:
            raise ConfigError(f"scale.eval.audit.rounds must be >= 1 or null, got {rounds}")
        boot = int(sec.get("bootstrap", 1000) or 0)
        if boot < 0:
            raise ConfigError(f"scale.eval.audit.bootstrap must be >= 0, got {boot}")
        ci = float(sec.get("ci", 0.95) or 0.95)
        if not 0.0 < ci < 1.0:
            raise ConfigError(f"scale.eval.audit.ci must be in (0, 1), got {ci}")
        return cls(k, None if rounds is None else int(rounds), boot, ci)

    @property
    def enabled(self) -> bool:
        """Whether the audit runs."""
        return self.shadows > 0


# ----------------------------------------------------------------------------- shadows


def example_units(n_train: int, poison: PoisonInfo) -> np.ndarray:
    """The audit's unit of every training index: itself, or for a canary's copies the canary."""
    units = np.arange(n_train, dtype=np.int64)
    for row in poison.canary_copies:
        units[np.asarray(row, np.int64)] = int(row[0])
    return units


def inclusion_masks(n_units: int, k: int, seed: int) -> np.ndarray:
    """(k, n_units) booleans: each unit held by exactly k/2 shadows, chosen at random (seeded)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, SEED_TAG]))
    order = rng.random((k, n_units)).argsort(0)
    return order < k // 2


def run_fingerprint(cfg: Mapping[str, Any]) -> str:
    """A digest of what shapes a run's data and training (its config less unlearning settings)."""
    view = {
        k: v
        for k, v in dict(cfg).items()
        if k not in ("scale", "baselines", "experiment", "testbed")
    }
    if isinstance(view.get("fl"), Mapping):
        view["fl"] = {k: v for k, v in view["fl"].items() if k not in ("device", "threads")}
    text = json.dumps(view, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def label_margins(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``z_y - logsumexp_{j != y} z_j`` of each row's label ``y`` (differentiable)."""
    zy = logits.gather(1, y.view(-1, 1)).flatten()
    return zy - torch.logsumexp(logits.scatter(1, y.view(-1, 1), float("-inf")), dim=1)


@torch.no_grad()
def label_phi(model: nn.Module, data: ImageData, batch_size: int | None = None) -> np.ndarray:
    """LiRA's statistic of each sample's label: ``z_y - logsumexp_{j != y} z_j`` (eval mode).

    The same as ``log p_y - log(1 - p_y)`` of the softmax, computed from the logits so that a
    memorised sample (p_y within 1e-12 of 1) keeps its rank.
    """
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = []
    for sl in infer_slices(len(data), infer_batch(dev, batch_size)):
        z = model(data.inputs(sl).to(dev)).double()
        out.append(label_margins(z, data.labels[sl].to(dev)).cpu())
    model.train(was)
    return torch.cat(out).numpy() if out else np.zeros(0)


class ShadowSet:
    """The K shadow federations of a run: trained once, kept in ``RUN/audit/``, loaded after.

    ``run``: a :class:`scaleflu.fl.run.LoadedRun`; ``cfg``: the resolved unlearning config (its
    ``fl`` section is the run's). :meth:`ensure` trains what is missing; :meth:`phi` scores a
    set with every shadow; :meth:`held` says which shadows held given training indices.
    """

    def __init__(
        self, run: Any, cfg: Mapping[str, Any], settings: AuditSettings, progress: bool = False
    ) -> None:
        """No training yet (see :meth:`ensure`)."""
        if not settings.enabled:
            raise ValueError("the audit is off (scale.eval.audit.shadows is 0)")
        self.run = run
        self.cfg = cfg
        self.settings = settings
        self.progress = progress
        self.seed = int(cfg["seed"])
        fl = cfg["fl"]
        self.rounds = int(settings.rounds or fl["rounds"])
        setup = run.setup
        self.units = example_units(len(setup.train), setup.poison)
        self.masks = inclusion_masks(len(self.units), settings.shadows, self.seed)
        self.fingerprint = run_fingerprint(run.cfg)
        self.folder = (
            Path(run.run_dir) / AUDIT_DIR / f"k{settings.shadows}-r{self.rounds}-{self.fingerprint}"
        )
        self.states: list[dict[str, torch.Tensor]] = []
        self.info: dict[str, Any] = {}
        self._phi_cache: dict[int, np.ndarray] = {}

    # -- training and the cache --------------------------------------------------------------

    def _path(self, k: int) -> Path:
        return self.folder / f"shadow-{k}.safetensors"

    def _load(self, k: int) -> dict[str, torch.Tensor] | None:
        path = self._path(k)
        if not path.is_file():
            return None
        try:
            state = load_model(path, key_for(path))
        except Exception as exc:  # noqa: BLE001 - a damaged cache entry is retrained
            log.warning("audit shadow %s unreadable (%s); training it again", path, exc)
            return None
        mask = state.pop(MASK_KEY, None)
        if mask is None or not np.array_equal(mask.numpy().astype(bool), self.masks[k]):
            log.warning("audit shadow %s was trained on other data; training it again", path)
            return None
        return state

    def ensure(self) -> dict[str, Any]:
        """Load every shadow, training the missing ones; returns :attr:`info` (costs included)."""
        if self.states:
            return self.info
        meta_path = self.folder / "meta.json"
        meta: dict[str, Any] = {}
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except ValueError:
                meta = {}
        cpu = dict(meta.get("train_cpu_s") or {})
        wall = dict(meta.get("train_wall_s") or {})
        trained_now = 0
        for k in range(self.settings.shadows):
            state = self._load(k)
            if state is None:
                c0, t0 = time.process_time(), time.perf_counter()
                state = self._train(k)
                cpu[str(k)] = time.process_time() - c0
                wall[str(k)] = time.perf_counter() - t0
                self._save(k, state)
                trained_now += 1
            self.states.append(state)
        meta = {
            "shadows": self.settings.shadows,
            "rounds": self.rounds,
            "seed": self.seed,
            "fingerprint": self.fingerprint,
            "units": int(len(np.unique(self.units))),
            "train_cpu_s": cpu,
            "train_wall_s": wall,
        }
        if trained_now:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = meta_path.with_name("meta.json.tmp")
            tmp.write_text(json.dumps(meta, indent=1))
            tmp.replace(meta_path)
        self.info = {
            "shadows": self.settings.shadows,
            "rounds": self.rounds,
            "trained_now": trained_now,
            "train_cpu_s": float(sum(cpu.values())),  # per run, all shadows (when measured)
            "train_wall_s": float(sum(wall.values())),
            "folder": str(self.folder),
        }
        return self.info

    def _save(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        out = dict(state)
        out[MASK_KEY] = torch.as_tensor(self.masks[k].astype(np.uint8))
        path = self._path(k)
        save_model(out, path, key_for(path))

    def _train(self, k: int) -> dict[str, torch.Tensor]:
        """Shadow k: the run's FedAvg on the examples it holds, from its own initial model."""
        setup = self.run.setup
        fl = self.cfg["fl"]
        seed = derive_seed(self.seed, SEED_TAG, k)
        keep = self.masks[k]
        parts = [np.asarray(p, np.int64)[keep[self.units[p]]] for p in setup.parts]
        torch.manual_seed(seed)
        model = build_model(*setup.model_args())
        state = {n: v.detach().clone() for n, v in model.state_dict().items()}
        device = config_device(self.cfg)
        kind = str(fl.get("trainer") or "auto")
        trainer = make_trainer(
            kind,
            model,
            setup.train,
            parts,
            LocalConfig.from_config(fl),
            seed,
            int(fl.get("workers", 1)),
            device,
        )
        recal = BNRecalibrator.from_config(self.cfg, build_model(*setup.model_args()), setup.test)
        sizes = {n: len(p) for n, p in enumerate(parts)}
        strategy = FedAvg.from_config(self.cfg, sizes, seed, recalibrate=recal)
        try:
            for t in tqdm(
                range(1, self.rounds + 1),
                desc=f"audit shadow {k + 1}/{self.settings.shadows}",
                unit="round",
                disable=not self.progress,
                leave=False,
            ):
                result = strategy.fit_round(t, state, trainer)
                if result is not None:
                    state = result.state
        finally:
            if hasattr(trainer, "shutdown"):
                trainer.shutdown()
        return {n: v.detach().cpu().clone() for n, v in state.items()}

    # -- scoring -----------------------------------------------------------------------------

    def phi(self, data: ImageData) -> np.ndarray:
        """(K, len(data)) LiRA statistics of every shadow on ``data`` (memoised per set)."""
        key = id(data)
        if key not in self._phi_cache:
            self.ensure()
            model = self.run.setup.new_model().to(config_device(self.cfg))
            rows = []
            for state in self.states:
                model.load_state_dict(state)
                rows.append(label_phi(model, data))
            self._phi_cache[key] = np.stack(rows) if rows else np.zeros((0, len(data)))
        return self._phi_cache[key]

    def held(self, train_idx: np.ndarray) -> np.ndarray:
        """(K, n) booleans: shadow k held training example ``train_idx[i]``."""
        return self.masks[:, self.units[np.asarray(train_idx, np.int64)]]


# ----------------------------------------------------------------------------- the attack


def pooled_sigma(phi: np.ndarray, out: np.ndarray) -> float:
    """Pooled standard deviation of the OUT statistics around their per-example means."""
    resid, dof = 0.0, 0
    for j in range(phi.shape[1]):
        v = phi[out[:, j], j]
        if len(v) >= 2:
            resid += float(((v - v.mean()) ** 2).sum())
            dof += len(v) - 1
    if dof == 0:
        return 1.0
    return max(float(np.sqrt(resid / dof)), 1e-6)


def out_means(phi: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Per-example mean of the OUT shadows' statistics (NaN where no shadow left it out)."""
    n_out = out.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_out > 0, (phi * out).sum(0) / np.maximum(n_out, 1), np.nan)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, ties given their average rank (``scipy.stats.rankdata``'s
    default, without importing scipy into every unlearning process)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.flatnonzero(np.concatenate(([True], xs[1:] != xs[:-1], [True])))
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat((starts[:-1] + 1 + starts[1:]) / 2.0, np.diff(starts))
    return ranks


def fast_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(pos > neg) + P(tie) / 2 by ranks (NaN on an empty side)."""
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    r = average_ranks(np.concatenate([pos, neg]))
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def tpr_at(pos: np.ndarray, neg: np.ndarray, fpr: float) -> float:
    """Share of ``pos`` above the negatives' (1 - fpr) quantile (their maximum when
    ``len(neg) < 1 / fpr``): the threshold keeps the negatives' false-positive rate <= fpr."""
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    thr = float(np.quantile(neg, 1.0 - fpr, method="higher"))
    return float((pos > thr).mean())


def bootstrap_ci(
    pos: np.ndarray, neg: np.ndarray, stat: Any, draws: int, level: float, seed: int
) -> tuple[float, float]:
    """Percentile interval of ``stat(pos, neg)`` over ``draws`` resamples of each side."""
    if draws <= 0 or len(pos) == 0 or len(neg) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 951]))
    vals = np.empty(draws)
    for b in range(draws):
        vals[b] = stat(
            pos[rng.integers(0, len(pos), len(pos))], neg[rng.integers(0, len(neg), len(neg))]
        )
    a = (1.0 - level) / 2.0
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1.0 - a))


@dataclass
class AuditSet:
    """One request's audited examples: positives (D_u) and negatives, with their shadow masks.

    ``pos_out`` / ``neg_out``: (K, n) booleans, True where the shadow did *not* hold the example
    (its OUT shadows, the calibration); ``pos_in``: where the shadow held it (the margin).
    """

    name: str  # "canaries" | "forget sample"
    pos: ImageData
    neg: ImageData
    pos_out: np.ndarray
    neg_out: np.ndarray
    pos_in: np.ndarray


def audit_scores(
    phi_pos: np.ndarray,
    phi_neg: np.ndarray,
    shadow_pos: np.ndarray,
    shadow_neg: np.ndarray,
    aset: AuditSet,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Offline LiRA scores of the audited model's statistics; the calibration's summary."""
    sigma = pooled_sigma(
        np.concatenate([shadow_pos, shadow_neg], axis=1),
        np.concatenate([aset.pos_out, aset.neg_out], axis=1),
    )
    mu_pos = out_means(shadow_pos, aset.pos_out)
    mu_neg = out_means(shadow_neg, aset.neg_out)
    mu_in = out_means(shadow_pos, aset.pos_in)  # the same mean over the IN shadows
    margin = (mu_in - mu_pos) / sigma
    s_pos = (phi_pos - mu_pos) / sigma
    s_neg = (phi_neg - mu_neg) / sigma
    ok_p, ok_n = np.isfinite(s_pos), np.isfinite(s_neg)
    return (
        s_pos[ok_p],
        s_neg[ok_n],
        {"sigma": sigma, "margin": float(np.nanmean(margin)) if len(margin) else float("nan")},
    )


def audit_metrics(
    s_pos: np.ndarray, s_neg: np.ndarray, settings: AuditSettings, seed: int
) -> dict[str, float | None]:
    """AUC and TPR at 1 % / 0.1 % FPR with bootstrap intervals (the ``audit_*`` metrics)."""
    out: dict[str, float | None] = {
        "audit_n": int(len(s_pos)),
        "audit_neg_n": int(len(s_neg)),
        "audit_fpr_floor": (1.0 / len(s_neg)) if len(s_neg) else None,
        "audit_auc": fast_auc(s_pos, s_neg),
    }
    lo, hi = bootstrap_ci(s_pos, s_neg, fast_auc, settings.bootstrap, settings.ci, seed)
    out["audit_auc_lo"], out["audit_auc_hi"] = lo, hi
    for fpr, tag in zip(FPRS, ("1fpr", "01fpr"), strict=True):
        out[f"audit_tpr_{tag}"] = tpr_at(s_pos, s_neg, fpr)

        def stat(p: np.ndarray, n: np.ndarray, f: float = fpr) -> float:
            return tpr_at(p, n, f)

        lo, hi = bootstrap_ci(s_pos, s_neg, stat, settings.bootstrap, settings.ci, seed + 1)
        out[f"audit_tpr_{tag}_lo"], out[f"audit_tpr_{tag}_hi"] = lo, hi
    return out


AUDIT_KEYS = (
    "audit_set",
    "audit_n",
    "audit_neg_n",
    "audit_fpr_floor",
    "audit_auc",
    "audit_auc_lo",
    "audit_auc_hi",
    "audit_tpr_1fpr",
    "audit_tpr_1fpr_lo",
    "audit_tpr_1fpr_hi",
    "audit_tpr_01fpr",
    "audit_tpr_01fpr_lo",
    "audit_tpr_01fpr_hi",
)


def empty_metrics() -> dict[str, Any]:
    """Every ``audit_*`` key set to None (the audit is off, or nothing to audit)."""
    return dict.fromkeys(AUDIT_KEYS)


def build_audit_set(
    shadows: ShadowSet,
    *,
    canary_members: np.ndarray,
    canary_heldout: np.ndarray,
    canary_min: int,
    train: ImageData,
    sample_idx: np.ndarray,
    sample_nonmembers: ImageData,
) -> AuditSet | None:
    """The request's audited examples (module docstring); None when there is nothing to audit.

    ``canary_members`` / ``canary_heldout``: D_u's canaries and their twins (pairwise);
    ``sample_idx`` / ``sample_nonmembers``: the class-matched D_u sample and its non-members.
    """
    K = shadows.settings.shadows
    if len(canary_members) and len(canary_members) >= max(1, canary_min):
        held = shadows.held(canary_members)
        return AuditSet(
            "canaries",
            train.subset(np.asarray(canary_members, np.int64)),
            train.subset(np.asarray(canary_heldout, np.int64)),
            ~held,
            ~held,  # twin i: calibrated on the shadows that left canary i out
            held,
        )
    if len(sample_idx) and len(sample_nonmembers):
        held = shadows.held(sample_idx)
        return AuditSet(
            "forget sample",
            train.subset(np.asarray(sample_idx, np.int64)),
            sample_nonmembers,
            ~held,
            np.ones((K, len(sample_nonmembers)), dtype=bool),
            held,
        )
    return None


def run_audit(
    model: nn.Module, shadows: ShadowSet, aset: AuditSet | None, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The audit of one model on one request's set: (metrics, calibration summary)."""
    if aset is None:
        return empty_metrics(), {}
    phi_pos = label_phi(model, aset.pos)
    phi_neg = label_phi(model, aset.neg)
    s_pos, s_neg, cal = audit_scores(
        phi_pos, phi_neg, shadows.phi(aset.pos), shadows.phi(aset.neg), aset
    )
    out = {**empty_metrics(), **audit_metrics(s_pos, s_neg, shadows.settings, seed)}
    out["audit_set"] = aset.name
    return out, cal


def summarise_scores(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of finite values (for logs and reports)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], float)
    if not len(v):
        return {}
    return {"min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())}
