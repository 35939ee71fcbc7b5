"""Age of Information of parameter groups, in rounds and in link seconds (docs/scale.md, "AoI").

Group (l, j) keeps T_lj, when its latest version reached the clients: a round index and the
simulated link clock (seconds) at the end of that broadcast. ``A_lj = now - T_lj`` in both
units. The starting point comes from the run's history (:meth:`HistoryStore.group_last_update`,
``now`` = the end of the last round). During unlearning every step is one tick of the round
clock; the seconds clock advances by the link time of the step's payload (the changed groups,
float32, one broadcast), and the changed groups get T_lj = now.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scaleflu.fl.history import HistoryStore, LinkModel

log = logging.getLogger(__name__)

GroupKey = tuple[str, int]


@dataclass
class AoITracker:
    """Last-update times of every parameter group and the current clocks."""

    keys: list[GroupKey]
    sizes: dict[GroupKey, int]  # parameters per group
    last_round: np.ndarray
    last_s: np.ndarray
    now_round: float
    now_s: float
    link: LinkModel

    @classmethod
    def from_history(cls, history: HistoryStore, tol: float | None = None) -> AoITracker:
        """State after the run's last completed round (groups never updated: round 0)."""
        last = history.group_last_update(tol=tol)
        keys = [(layer, j) for layer, g in history.groups.items() for j in range(len(g))]
        sizes = {
            (layer, j): b - a for layer, g in history.groups.items() for j, (a, b) in enumerate(g)
        }
        T = history.last_completed_round()
        return cls(
            keys,
            sizes,
            np.array([last[k][0] for k in keys], dtype=np.float64),
            np.array([last[k][1] for k in keys], dtype=np.float64),
            float(T),
            float(history.cumulative_link_seconds(T)),
            history.link,
        )

    def copy(self) -> AoITracker:
        """An independent copy (episodes restart from the same state)."""
        return AoITracker(
            list(self.keys),
            dict(self.sizes),
            self.last_round.copy(),
            self.last_s.copy(),
            self.now_round,
            self.now_s,
            self.link,
        )

    def index(self, key: GroupKey) -> int:
        """Position of a group in the arrays."""
        return self.keys.index(key)

    def aoi_rounds(self) -> np.ndarray:
        """A_lj in rounds (steps) for every group."""
        return self.now_round - self.last_round

    def aoi_seconds(self) -> np.ndarray:
        """A_lj in link seconds for every group."""
        return self.now_s - self.last_s

    def mean(self, layers: Iterable[str] | None = None) -> dict[str, float]:
        """Average AoI (seconds and rounds) over the groups of ``layers`` (all when None)."""
        sel = self._mask(layers)
        if not sel.any():
            return {"aoi_s": 0.0, "aoi_rounds": 0.0}
        return {
            "aoi_s": float(self.aoi_seconds()[sel].mean()),
            "aoi_rounds": float(self.aoi_rounds()[sel].mean()),
        }

    def total(self, layers: Iterable[str] | None = None) -> dict[str, float]:
        """Sum AoI (seconds and rounds) over the groups of ``layers`` (all when None)."""
        sel = self._mask(layers)
        return {
            "aoi_s": float(self.aoi_seconds()[sel].sum()),
            "aoi_rounds": float(self.aoi_rounds()[sel].sum()),
        }

    def _mask(self, layers: Iterable[str] | None) -> np.ndarray:
        if layers is None:
            return np.ones(len(self.keys), dtype=bool)
        want = set(layers)
        return np.array([k[0] in want for k in self.keys], dtype=bool)

    def payload_bytes(self, changed: Iterable[GroupKey]) -> int:
        """Bytes to send the changed groups as float32."""
        return int(sum(self.sizes[k] for k in changed) * 4)

    def step(self, changed: Sequence[GroupKey], rounds: float = 1.0) -> float:
        """Advance the clocks by one step sending ``changed``; returns the link seconds spent."""
        link_s = self.link.seconds(self.payload_bytes(changed)) if changed else 0.0
        self.now_round += rounds
        self.now_s += link_s
        for k in changed:
            i = self.index(k)
            self.last_round[i] = self.now_round
            self.last_s[i] = self.now_s
        return link_s

    def full_round(self, link_s: float, changed: Iterable[GroupKey]) -> None:
        """Advance by one FL round costing ``link_s`` in which ``changed`` groups were updated."""
        self.now_round += 1.0
        self.now_s += link_s
        for k in changed:
            i = self.index(k)
            self.last_round[i] = self.now_round
            self.last_s[i] = self.now_s


def changed_groups(
    before: Mapping[str, object],
    after: Mapping[str, object],
    groups: Mapping[str, list[tuple[int, int]]],
    tol: float = 0.0,
) -> list[GroupKey]:
    """Groups (l, j) whose max |after - before| exceeds ``tol``."""
    out = []
    for layer, g in groups.items():
        delta = (after[layer] - before[layer]).abs().flatten()  # type: ignore[operator]
        for j, (a, b) in enumerate(g):
            if float(delta[a:b].max()) > tol:
                out.append((layer, j))
    return out
