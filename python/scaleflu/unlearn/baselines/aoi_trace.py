"""Time-averaged AoI for every method: a recording AoI tracker and a SCALE replay.

The schema's ``aoi.mean_s*`` is the AoI *at the end* of unlearning; a method that ends with a
full-model broadcast scores 0 there, which ranks nothing. The table's Avg AoI is the standard
time-average age: with A_lj(t) growing at rate 1 on the link clock and dropping to 0 when a
new version of group (l, j) reaches the clients, ``Avg AoI = (1 / D) * integral_0^D mean_lj
A_lj(t) dt`` over the unlearning process of link duration D (a step of duration d adds
``d * A_before + d^2 / 2`` per group). Stored as ``details.aoi_time_avg_s``; the mean AoI over
all groups after each step is ``details.aoi_mean_s_trace``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scaleflu.unlearn.aoi import AoITracker, GroupKey
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult


class RecordingAoITracker(AoITracker):
    """An AoITracker that records the mean AoI over all groups after every step or round."""

    trace: list[float]
    area: float
    duration: float

    @classmethod
    def wrap(cls, base: AoITracker) -> RecordingAoITracker:
        """A recording copy of ``base``."""
        out = cls(
            list(base.keys),
            dict(base.sizes),
            base.last_round.copy(),
            base.last_s.copy(),
            base.now_round,
            base.now_s,
            base.link,
        )
        out.trace = []
        out.area = 0.0
        out.duration = 0.0
        return out

    def _mean_now(self) -> float:
        return float(self.aoi_seconds().mean()) if len(self.keys) else 0.0

    def _record(self, before: float, d: float) -> None:
        self.area += d * before + 0.5 * d * d
        self.duration += d
        self.trace.append(self._mean_now())

    def step(self, changed: Sequence[GroupKey], rounds: float = 1.0) -> float:
        """As :meth:`AoITracker.step`, then record."""
        before = self._mean_now()
        s = super().step(changed, rounds)
        self._record(before, s)
        return s

    def full_round(self, link_s: float, changed: Iterable[GroupKey]) -> None:
        """As :meth:`AoITracker.full_round`, then record."""
        before = self._mean_now()
        super().full_round(link_s, changed)
        self._record(before, float(link_s))

    def time_average(self) -> float | None:
        """Time-average mean AoI over the recorded steps (None when no time passed)."""
        if self.duration <= 0:
            return self.trace[-1] if self.trace else None
        return self.area / self.duration


def annotate(result: UnlearnResult, aoi: RecordingAoITracker) -> UnlearnResult:
    """Store the per-step mean-AoI trace, the time-average AoI and its duration in ``details``."""
    result.details["aoi_mean_s_trace"] = [float(x) for x in aoi.trace]
    result.details["aoi_time_avg_s"] = aoi.time_average()
    result.details["aoi_duration_s"] = aoi.duration
    return result


def replay_scale_trace(ctx: UnlearnContext, details: Mapping[str, Any]) -> RecordingAoITracker:
    """Rebuild SCALE's per-step mean AoI (all groups) from its rollout and recovery details.

    Rollout steps send the changed groups of one layer; each recovery round is taken as a full
    broadcast updating every group (FedAvg changes every weight), at the recorded link cost.
    """
    aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
    for s in details.get("rollout") or []:
        aoi.step([(s["layer"], int(j)) for j in s.get("changed_groups") or []])
    rec = details.get("recovery") or {}
    n = int(rec.get("rounds") or 0)
    for _ in range(n):
        aoi.full_round(float(rec.get("link_s") or 0.0) / n, list(aoi.keys))
    return aoi
