"""Aggregation of a round's local models: plain FedAvg, and robust screening and strategies.

Every FedAvg round of the project aggregates here, in torch (the simulation, the unlearning
methods and the edge server alike; :mod:`scaleflu.fl.strategy` is the round around it).

:func:`aggregate` is FedAvg (McMahan et al.): every floating-point state-dict entry (weights
and BatchNorm running statistics alike) becomes ``sum_n M_n / sum_n' M_n' * Theta_{n,E}[t]``,
computed in float64 in the order the local models are given and cast back to the entry's
dtype; integer buffers (``num_batches_tracked``) take the participants' maximum.

:func:`robust_aggregate` adds the edge server's defences (``testbed.aggregation`` in
default.yaml). The strategies follow Flower's (``flwr.server.strategy``: FedAvg, FedMedian,
FedTrimmedAvg, Krum) and work on client *updates* ``Delta_n = Theta_n - Theta_global``; the
new global model is ``Theta_global + agg(Delta)`` (FedAvg: :func:`aggregate` of the accepted
local models itself, bit for bit). Before a strategy runs, :func:`screen` applies two checks
to every update and returns the ones refused with their reason:

* **norm bound**: ``||Delta_n||_2`` above ``max_norm`` (a fixed bound) or above
  ``norm_factor x median_n ||Delta_n||`` (the adaptive bound, on by default; the median of a
  round with one outlier is an honest norm, so a scaled update cannot raise its own bound);
* **free-riding**: an update equal to the model it was trained from (``||Delta_n|| == 0``) is
  flagged and carries no weight;
* **direction** (rounds of fewer than ``small_round`` updates, given the server's own reference
  update of the round): an update whose cosine with it is below ``min_cosine`` (default -0.2:
  pointing clearly away from the server's own descent) is refused. A non-IID robot's honest
  update can be orthogonal to the reference (cosine -0.005 in a first round of the testbed's
  tests); the growth attack's, which climbs the robot's own loss, had -0.35 to -0.91
  (docs/testbed.md, "Direction of small rounds").

With fewer than ``small_round`` updates (default 3) the round's median cannot single out a
scaled update (with two it is the mean of the honest and the scaled norm, with one the
attacker's own), so the adaptive bound then also takes a **floor**: ``floor_factor x`` the
median of the ``prior`` norms the caller gives (the edge server: the norms it accepted in the
last ``norm_history`` rounds that had ``small_round`` updates or more, where the round's median
bounded them, or else the norm of its own reference update, trained from the same global model
on its validation slice with as many SGD steps as the round's largest robot: never the norms of
small rounds, which the updates being bounded could walk up round by round). The bound is the
smaller of the two. ``floor_factor``
(default 10) is wider than ``norm_factor``: the trusted norms come from other rounds, robots or
data (non-IID robots move further than the server's balanced validation data); the measured
norms are in docs/testbed.md ("Robust aggregation").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def aggregate(states: Mapping[int, Mapping[str, torch.Tensor]], sizes: Mapping[int, int]) -> State:
    """FedAvg: Theta[t+1] = sum_n M_n / sum_n' M_n' * Theta_{n,E}[t] over the participants."""
    clients = list(states)
    if not clients:
        raise ValueError("cannot aggregate zero client models")
    total = float(sum(sizes[n] for n in clients))
    weights = torch.tensor([sizes[n] / total for n in clients], dtype=torch.float64)
    out: State = {}
    for key, ref in states[clients[0]].items():
        if torch.is_floating_point(ref):
            stacked = torch.stack([states[n][key].to(torch.float64) for n in clients])
            w = weights.view(-1, *[1] * ref.dim())
            out[key] = (stacked * w).sum(0).to(ref.dtype)
        else:
            out[key] = torch.stack([states[n][key] for n in clients]).max(0).values.clone()
    return out


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
    # the floor: norms accepted in the last this many rounds of small_round updates or more,
    # where the round's median bounded them (0: none)
    norm_history: int = 5
    reference_samples: int = 512  # server's reference update: validation samples (0: none)
    # in a round of fewer than small_round updates, refuse an update whose cosine with the
    # server's own reference update of the round is below this (None: no such test)
    min_cosine: float | None = -0.2
    # the candidate model's accuracy on the server's validation data may fall at most this far
    # below the previous model's; else the round's candidate is refused (None: no check)
    acceptance_margin: float | None = None
    acceptance_samples: int = 1000  # validation samples of the acceptance check

    @classmethod
    def from_dict(
        cls, d: Mapping[str, object], where: str = "testbed.aggregation"
    ) -> AggregationConfig:
        """Parse and check a config section (``where``: its name in the errors; ValueError with
        the bad field)."""
        known = set(cls.__dataclass_fields__)
        extra = set(d) - known
        if extra:
            raise ValueError(f"{where}: unknown keys {sorted(extra)}")
        c = cls(**{k: d[k] for k in d})  # type: ignore[arg-type]
        if c.strategy not in STRATEGIES:
            raise ValueError(f"{where}.strategy {c.strategy!r}: choose from {sorted(STRATEGIES)}")
        if not isinstance(c.floor_factor, (int, float)) or not c.floor_factor > 0:
            raise ValueError(f"{where}.floor_factor must be > 0, got {c.floor_factor!r}")
        for name in ("norm_factor", "max_norm"):
            v = getattr(c, name)
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                raise ValueError(f"{where}.{name} must be > 0 or null, got {v!r}")
        if not 0.0 <= float(c.trim_fraction) < 0.5:
            raise ValueError(f"{where}.trim_fraction must be in [0, 0.5)")
        if int(c.krum_f) < 0:
            raise ValueError(f"{where}.krum_f must be >= 0")
        mc = c.min_cosine
        if mc is not None and (
            isinstance(mc, bool) or not isinstance(mc, (int, float)) or not -1 <= mc <= 1
        ):
            raise ValueError(f"{where}.min_cosine must be in [-1, 1] or null, got {mc!r}")
        m = c.acceptance_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or m < 0):
            raise ValueError(f"{where}.acceptance_margin must be >= 0 or null, got {m!r}")
        if isinstance(c.acceptance_samples, bool) or not isinstance(c.acceptance_samples, int):
            raise ValueError(f"{where}.acceptance_samples must be an int >= 1")
        if c.acceptance_samples < 1:
            raise ValueError(f"{where}.acceptance_samples must be an int >= 1")
        for name in ("small_round", "norm_history", "reference_samples"):
            v = getattr(c, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{where}.{name} must be an int >= 0, got {v!r}")
        return c


def screening_config(raw: object, where: str) -> AggregationConfig | None:
    """The robust-aggregation settings of a config section (null: None, plain FedAvg)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping of aggregation settings or null")
    return AggregationConfig.from_dict(dict(raw), where)


def update_of(local: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> State:
    """``local - base`` in float64 for the floating tensors (integer buffers are skipped)."""
    return {
        k: local[k].to(torch.float64) - base[k].to(torch.float64)
        for k in base
        if torch.is_floating_point(base[k])
    }


def norm(delta: Mapping[str, torch.Tensor]) -> float:
    """L2 norm of an update over all its tensors."""
    return float(sum(float((v.to(torch.float64) ** 2).sum()) for v in delta.values()) ** 0.5)


def cosine(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Cosine of two updates over their common tensors (0 when either is zero)."""
    dot = sum(float((a[k].to(torch.float64) * b[k].to(torch.float64)).sum()) for k in a if k in b)
    den = norm(a) * norm(b)
    return dot / den if den > 0 else 0.0


def screen(
    deltas: Mapping[int, State],
    cfg: AggregationConfig,
    prior: Sequence[float] = (),
    reference: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[int, str], dict[int, float]]:
    """Updates refused before aggregation ({client: reason}) and every update's norm.

    ``prior``: trusted norms (earlier rounds' accepted norms, the server's reference update)
    for the floor of rounds with fewer than ``small_round`` updates (module docstring);
    ``reference``: the server's own update of the round: in such a round an update pointing
    away from it (cosine below ``min_cosine``) is refused as ``direction``.
    """
    norms = {n: norm(d) for n, d in deltas.items()}
    refused: dict[int, str] = {}
    for n, v in norms.items():
        if v <= cfg.free_rider_tol:
            refused[n] = f"free_riding: ||update|| {v:.3g} (the model it was sent)"
    small = len(deltas) - len(refused) < int(cfg.small_round)
    if small and reference is not None and cfg.min_cosine is not None:
        for n, d in deltas.items():
            c = cosine(d, reference)
            if n not in refused and c < float(cfg.min_cosine):
                refused[n] = (
                    f"direction: cosine {c:.3f} with the server's reference update "
                    f"< {float(cfg.min_cosine):g}"
                )
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


def _stack(deltas: Mapping[int, State], key: str, clients: list[int]) -> torch.Tensor:
    return torch.stack([deltas[n][key] for n in clients])


def fedavg(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Data-size weighted mean of the updates (McMahan et al.)."""
    clients = list(deltas)
    total = float(sum(sizes[n] for n in clients))
    w = torch.tensor([sizes[n] / total for n in clients], dtype=torch.float64)
    out = {}
    for k, ref in deltas[clients[0]].items():
        out[k] = (_stack(deltas, k, clients) * w.view(-1, *[1] * ref.dim())).sum(0)
    return out


def median(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Coordinate-wise median (Yin et al. 2018; Flower's FedMedian); an even count takes the
    mean of the two middle values."""
    clients = list(deltas)
    m = len(clients)
    out = {}
    for k in deltas[clients[0]]:
        s = torch.sort(_stack(deltas, k, clients), dim=0).values
        out[k] = s[m // 2] if m % 2 else (s[m // 2 - 1] + s[m // 2]) / 2
    return out


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
        s = torch.sort(_stack(deltas, k, clients), dim=0).values
        out[k] = s[cut : m - cut].sum(0) / (m - 2 * cut)
    return out


def krum(deltas: Mapping[int, State], sizes: Mapping[int, int], cfg: AggregationConfig) -> State:
    """Krum (Blanchard et al. 2017): the update closest to its ``m - f - 2`` nearest others."""
    clients = list(deltas)
    m = len(clients)
    flat = torch.stack([torch.cat([d[k].reshape(-1) for k in sorted(d)]) for d in deltas.values()])
    d2 = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
    k_near = max(1, m - int(cfg.krum_f) - 2)
    scores = []
    for i in range(m):
        others = torch.sort(torch.cat([d2[i, :i], d2[i, i + 1 :]])).values
        scores.append(float(others[:k_near].sum()) if len(others) else 0.0)
    best = clients[int(np.argmin(scores))]
    log.debug("krum picked client %d (scores %s)", best, scores)
    return {k: v.clone() for k, v in deltas[best].items()}


STRATEGIES: dict[str, Callable[[Mapping[int, State], Mapping[int, int], AggregationConfig], State]]
STRATEGIES = {"fedavg": fedavg, "median": median, "trimmed_mean": trimmed_mean, "krum": krum}


class NoUpdateAcceptedError(ValueError):
    """Every update of the round was refused; ``refused`` maps client -> reason."""

    def __init__(self, refused: Mapping[int, str]) -> None:
        super().__init__(f"no update accepted: {dict(refused)}")
        self.refused = dict(refused)


@dataclass
class AggregationResult:
    """The new global model, the accepted clients and the refused ones with their reasons.

    ``norms``: every update's norm (empty when no screening ran).
    """

    state: State
    accepted: list[int]
    refused: dict[int, str]
    norms: dict[int, float]


def robust_aggregate(
    base: Mapping[str, torch.Tensor],
    locals_: Mapping[int, Mapping[str, torch.Tensor]],
    sizes: Mapping[int, int],
    cfg: AggregationConfig | None,
    prior: Sequence[float] = (),
    reference: Mapping[str, torch.Tensor] | None = None,
) -> AggregationResult:
    """Screen the local models' updates against ``base``, aggregate the rest with the strategy.

    ``cfg`` None: no screening, plain :func:`aggregate` of every local model. ``prior``:
    trusted norms for the floor of small rounds, ``reference``: the server's own update for
    their direction test (:func:`screen`). Raises NoUpdateAcceptedError (a ValueError) when
    no update survives the screening.
    """
    if cfg is None:
        return AggregationResult(aggregate(locals_, sizes), list(locals_), {}, {})
    deltas = {n: update_of(s, base) for n, s in locals_.items()}
    refused, norms = screen(deltas, cfg, prior, reference)
    ok = [n for n in deltas if n not in refused]
    if not ok:
        raise NoUpdateAcceptedError(refused)
    if cfg.strategy == "fedavg":  # the weighted mean of the local models themselves
        return AggregationResult(aggregate({n: locals_[n] for n in ok}, sizes), ok, refused, norms)
    agg = STRATEGIES[cfg.strategy]({n: deltas[n] for n in ok}, sizes, cfg)
    out: State = {}
    for k, ref in base.items():
        if torch.is_floating_point(ref):
            out[k] = (ref.to(torch.float64) + agg[k]).to(ref.dtype)
        else:
            out[k] = torch.stack([locals_[n][k] for n in ok]).max(0).values.clone()
    return AggregationResult(out, ok, refused, norms)
