"""Robust aggregation strategies for the edge server (FedAvg, median, trimmed mean, Krum).

The strategies follow Flower's (``flwr.server.strategy``: FedAvg, FedMedian, FedTrimmedAvg,
Krum) and work on client *updates* ``Delta_n = Theta_n - Theta_global``; the new global model
is ``Theta_global + agg(Delta)``. Before a strategy runs, :func:`screen` applies two checks to
every update and returns the ones refused with their reason:

* **norm bound**: ``||Delta_n||_2`` above ``max_norm`` (a fixed bound) or above
  ``norm_factor x median_n ||Delta_n||`` (the adaptive bound, on by default; the median of a
  round with one outlier is an honest norm, so a scaled update cannot raise its own bound);
* **free-riding**: an update equal to the model it was trained from (``||Delta_n|| == 0``) is
  flagged and carries no weight.

With fewer than ``small_round`` updates (default 3) the round's median cannot single out a
scaled update (with two it is the mean of the honest and the scaled norm, with one the
attacker's own), so the adaptive bound then also takes a **floor**: ``floor_factor x`` the
median of the ``prior`` norms the caller gives (the edge server: the norms it accepted in the
last ``norm_history`` rounds, or in a round without such history the norm of its own
reference update, trained from the same global model on its validation slice with as many SGD
steps as the round's largest robot). The bound is the smaller of the two. ``floor_factor``
(default 10) is wider than ``norm_factor``: the trusted norms come from other rounds, robots or
data (non-IID robots move further than the server's balanced validation data); the scaled
updates of issue 13 were 13-100x the honest ones.

Integer buffers (e.g. BatchNorm's ``num_batches_tracked``) are not averaged: the largest value
among the accepted clients is kept, as :func:`scaleflu.fl.fedavg.aggregate` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

State = dict[str, np.ndarray]


@dataclass(frozen=True)
class AggregationConfig:
    """Settings of the robust aggregation (``testbed.aggregation`` in default.yaml)."""

    strategy: str = "fedavg"
    norm_factor: float | None = 3.0  # adaptive bound: x the round's median update norm
    max_norm: float | None = None  # fixed bound (both apply when both are set)
    trim_fraction: float = 0.2  # trimmed mean: fraction cut at each end per coordinate
    krum_f: int = 1  # Krum: number of Byzantine clients tolerated
    free_rider_tol: float = 0.0  # ||Delta|| <= this counts as free-riding
    small_round: int = 3  # rounds with fewer updates than this use the floor from prior norms
    floor_factor: float = 10.0  # the floor: x the median of the prior (trusted) norms
    norm_history: int = 5  # the floor: accepted norms of the last this many rounds (0: none)
    reference_samples: int = 512  # server's reference update: validation samples (0: none)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> AggregationConfig:
        """Parse and check ``testbed.aggregation`` (ValueError with the bad field)."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValueError(f"testbed.aggregation: unknown keys {sorted(extra)}")
        c = cls(**{k: d[k] for k in d})  # type: ignore[arg-type]
        if c.strategy not in STRATEGIES:
            raise ValueError(
                f"testbed.aggregation.strategy {c.strategy!r}: choose from {sorted(STRATEGIES)}"
            )
        if not isinstance(c.floor_factor, (int, float)) or not c.floor_factor > 0:
            raise ValueError(
                f"testbed.aggregation.floor_factor must be > 0, got {c.floor_factor!r}"
            )
        for name in ("norm_factor", "max_norm"):
            v = getattr(c, name)
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"testbed.aggregation.{name} must be > 0 or null, got {v!r}")
        if not 0.0 <= float(c.trim_fraction) < 0.5:
            raise ValueError("testbed.aggregation.trim_fraction must be in [0, 0.5)")
        if int(c.krum_f) < 0:
            raise ValueError("testbed.aggregation.krum_f must be >= 0")
        for name in ("small_round", "norm_history", "reference_samples"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"testbed.aggregation.{name} must be an int >= 0, got {v!r}")
        return c


def update_of(local: Mapping[str, np.ndarray], base: Mapping[str, np.ndarray]) -> State:
    """``local - base`` in float64 for the floating tensors (integer buffers are skipped)."""
    return {
        k: local[k].astype(np.float64) - base[k].astype(np.float64)
        for k in base
        if base[k].dtype.kind == "f"
    }


def norm(delta: Mapping[str, np.ndarray]) -> float:
    """L2 norm of an update over all its tensors."""
    return float(np.sqrt(sum(float(np.sum(v * v)) for v in delta.values())))


def screen(
    deltas: Mapping[int, State], cfg: AggregationConfig, prior: Sequence[float] = ()
) -> tuple[dict[int, str], dict[int, float]]:
    """Updates refused before aggregation ({client: reason}) and every update's norm.

    ``prior``: trusted norms (earlier rounds' accepted norms, the server's reference update)
    for the floor of rounds with fewer than ``small_round`` updates (module docstring).
    """
    norms = {n: norm(d) for n, d in deltas.items()}
    refused: dict[int, str] = {}
    for n, v in norms.items():
        if v <= cfg.free_rider_tol:
            refused[n] = f"free_riding: ||update|| {v:.3g} (the model it was sent)"
    rest = [v for n, v in norms.items() if n not in refused]
    bound = None
    if cfg.norm_factor is not None and rest:
        bound = float(cfg.norm_factor) * float(np.median(rest))
        prior = [float(p) for p in prior if np.isfinite(p) and p > 0]
        if len(rest) < int(cfg.small_round) and prior:
            bound = min(bound, float(cfg.floor_factor) * float(np.median(prior)))
    if cfg.max_norm is not None:
        bound = float(cfg.max_norm) if bound is None else min(bound, float(cfg.max_norm))
    if bound is not None:
        for n, v in norms.items():
            if n not in refused and v > bound:
                refused[n] = f"norm: ||update|| {v:.3g} > bound {bound:.3g}"
    return refused, norms


def _stack(deltas: Mapping[int, State], key: str, clients: list[int]) -> np.ndarray:
    return np.stack([deltas[n][key] for n in clients])


def fedavg(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Data-size weighted mean of the updates (McMahan et al.)."""
    clients = list(deltas)
    w = np.array([sizes[n] for n in clients], dtype=np.float64)
    w = w / w.sum()
    out = {}
    for k in deltas[clients[0]]:
        s = _stack(deltas, k, clients)
        out[k] = np.tensordot(w, s, axes=1)
    return out


def median(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Coordinate-wise median (Yin et al. 2018; Flower's FedMedian)."""
    clients = list(deltas)
    return {k: np.median(_stack(deltas, k, clients), axis=0) for k in deltas[clients[0]]}


def trimmed_mean(
    deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig
) -> State:
    """Coordinate-wise mean after cutting ``trim_fraction`` at each end (Flower's FedTrimmedAvg).

    At least one value is cut at each end whenever three or more updates are aggregated.
    """
    clients = list(deltas)
    m = len(clients)
    cut = int(float(cfg.trim_fraction) * m)
    if cfg.trim_fraction > 0 and m >= 3:
        cut = max(cut, 1)
    out = {}
    for k in deltas[clients[0]]:
        s = np.sort(_stack(deltas, k, clients), axis=0)
        out[k] = s[cut : m - cut].mean(axis=0)
    return out


def krum(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Krum (Blanchard et al. 2017): the update closest to its ``m - f - 2`` nearest others."""
    clients = list(deltas)
    m = len(clients)
    flat = np.stack([np.concatenate([d[k].ravel() for k in sorted(d)]) for d in deltas.values()])
    d2 = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
    k_near = max(1, m - int(cfg.krum_f) - 2)
    scores = []
    for i in range(m):
        others = np.sort(np.delete(d2[i], i))
        scores.append(float(others[:k_near].sum()) if len(others) else 0.0)
    best = clients[int(np.argmin(scores))]
    log.debug("krum picked client %d (scores %s)", best, scores)
    return {k: v.copy() for k, v in deltas[best].items()}


STRATEGIES: dict[str, Callable[[Mapping[int, State], Mapping[int, int], AggregationConfig], State]]
STRATEGIES = {"fedavg": fedavg, "median": median, "trimmed_mean": trimmed_mean, "krum": krum}


class NoUpdateAcceptedError(ValueError):
    """Every update of the round was refused; ``refused`` maps client -> reason."""

    def __init__(self, refused: Mapping[int, str]) -> None:
        super().__init__(f"no update accepted: {dict(refused)}")
        self.refused = dict(refused)


@dataclass
class AggregationResult:
    """The new global model, the accepted clients and the refused ones with their reasons."""

    state: State
    accepted: list[int]
    refused: dict[int, str]
    norms: dict[int, float]


def robust_aggregate(
    base: Mapping[str, np.ndarray],
    locals_: Mapping[int, Mapping[str, np.ndarray]],
    sizes: Mapping[int, int],
    cfg: AggregationConfig,
    prior: Sequence[float] = (),
) -> AggregationResult:
    """Screen the local models' updates against ``base``, aggregate the rest with the strategy.

    ``prior``: trusted norms for the floor of small rounds (:func:`screen`). Raises
    NoUpdateAcceptedError (a ValueError) when no update survives the screening.
    """
    deltas = {n: update_of(s, base) for n, s in locals_.items()}
    refused, norms = screen(deltas, cfg, prior)
    ok = [n for n in deltas if n not in refused]
    if not ok:
        raise NoUpdateAcceptedError(refused)
    agg = STRATEGIES[cfg.strategy]({n: deltas[n] for n in ok}, sizes, cfg)
    out: State = {}
    w = np.array([sizes[n] for n in ok], dtype=np.float64)
    w = w / w.sum()
    for k, ref in base.items():
        if ref.dtype.kind == "f" and cfg.strategy == "fedavg":
            # the weighted mean of the local models themselves, as fedavg.aggregate computes it
            s = np.stack([np.asarray(locals_[n][k], dtype=np.float64) for n in ok])
            out[k] = np.tensordot(w, s, axes=1).astype(ref.dtype)
        elif ref.dtype.kind == "f":
            out[k] = (ref.astype(np.float64) + agg[k]).astype(ref.dtype)
        else:
            out[k] = np.max(np.stack([np.asarray(locals_[n][k]) for n in ok]), axis=0)
    return AggregationResult(out, ok, refused, norms)
