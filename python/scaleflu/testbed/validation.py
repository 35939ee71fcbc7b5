"""Typed records for what robots send, and per-robot rate limits (the server's input checks).

Every handler parses the JSON meta of a message into one of these records *before* it looks at
the body or stores anything; a field of the wrong type or out of range raises
:class:`~scaleflu.testbed.protocol.ProtocolError` with reason ``bad_meta`` and the field named in
the detail. Nothing is cast: ``"x"`` where an int belongs, ``True`` for a count or ``1.5`` for
an id is refused.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scaleflu.testbed.protocol import ProtocolError

UNLEARN_KINDS = ("client", "class", "sample")


def _int(meta: Mapping[str, Any], name: str, lo: int = 0, hi: int = 2**63 - 1, default=None):
    v = meta.get(name, default)
    if v is None and default is None and name not in meta:
        raise ProtocolError("bad_meta", f"{name}: missing")
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError("bad_meta", f"{name}: expected an int, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ProtocolError("bad_meta", f"{name}: {v} outside {lo}..{hi}")
    return v


def _float_or_none(meta: Mapping[str, Any], name: str) -> float | None:
    v = meta.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ProtocolError("bad_meta", f"{name}: expected a finite number >= 0, got {v!r}")
    return float(v)


def _sha_or_none(meta: Mapping[str, Any], name: str) -> str | None:
    v = meta.get(name)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise ProtocolError("bad_meta", f"{name}: expected a lowercase SHA-256 hex digest")
    return v


@dataclass(frozen=True)
class UpdateMeta:
    """Meta of an UPDATE."""

    num_samples: int
    train_s: float | None
    model_sha256: str | None
    link_bytes_tx: int
    delta: bool

    @classmethod
    def parse(cls, meta: Mapping[str, Any]) -> UpdateMeta:
        """Typed fields or ProtocolError('bad_meta', '<field>: ...')."""
        delta = meta.get("delta", False)
        if not isinstance(delta, bool):
            raise ProtocolError("bad_meta", f"delta: expected a bool, got {type(delta).__name__}")
        return cls(
            num_samples=_int(meta, "num_samples", 0, 2**31),
            train_s=_float_or_none(meta, "train_s"),
            model_sha256=_sha_or_none(meta, "model_sha256"),
            link_bytes_tx=_int(meta, "link_bytes_tx", 0, default=0),
            delta=delta,
        )


@dataclass(frozen=True)
class EvalMeta:
    """Meta of an EVAL_REPORT (the metrics are kept as sent, for the report only)."""

    purpose: str
    sha256: str | None
    metrics: dict[str, Any]
    link_bytes_tx: int

    @classmethod
    def parse(cls, meta: Mapping[str, Any]) -> EvalMeta:
        """Typed fields or ProtocolError('bad_meta', ...)."""
        purpose = meta.get("purpose")
        if not isinstance(purpose, str) or not 1 <= len(purpose) <= 32:
            raise ProtocolError("bad_meta", "purpose: expected a string of 1..32 characters")
        metrics = meta.get("metrics", {})
        if not isinstance(metrics, dict):
            raise ProtocolError("bad_meta", "metrics: expected an object")
        return cls(
            purpose=purpose,
            sha256=_sha_or_none(meta, "sha256"),
            metrics=metrics,
            link_bytes_tx=_int(meta, "link_bytes_tx", 0, default=0),
        )


@dataclass(frozen=True)
class RegisterMeta:
    """Meta of a REGISTER (``mcs_table``: the robot's MCS table version, None when it sent
    none: software from before link adaptation)."""

    nonce: str
    num_samples: int
    mcs_table: int | None = None

    @classmethod
    def parse(cls, meta: Mapping[str, Any]) -> RegisterMeta:
        """Typed fields or ProtocolError('bad_meta', ...)."""
        nonce = meta.get("nonce")
        if not isinstance(nonce, str) or not 1 <= len(nonce) <= 64:
            raise ProtocolError("bad_meta", "nonce: expected a string of 1..64 characters")
        table = None
        if meta.get("mcs_table") is not None:
            table = _int(meta, "mcs_table", 0, 255)
        return cls(nonce=nonce, num_samples=_int(meta, "num_samples", 0, 2**31), mcs_table=table)


@dataclass(frozen=True)
class UnlearnMeta:
    """Meta of an UNLEARN_REQUEST, checked against what the run can serve."""

    robot: int
    kind: str
    classes: tuple[int, ...] | None
    fraction: float | None

    @classmethod
    def parse(cls, meta: Mapping[str, Any], num_classes: int) -> UnlearnMeta:
        """Typed fields; a request the run cannot serve is refused here (``bad_request``)."""
        robot = _int(meta, "robot", 1, 0xFFFE)
        kind = meta.get("kind")
        if kind not in UNLEARN_KINDS:
            raise ProtocolError("bad_request", f"kind: {kind!r} is not one of {UNLEARN_KINDS}")
        classes = fraction = None
        if kind == "class":
            raw = meta.get("classes")
            if not isinstance(raw, list) or not raw or len(raw) > num_classes:
                raise ProtocolError("bad_request", "classes: expected a non-empty list")
            for c in raw:
                if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < num_classes:
                    raise ProtocolError(
                        "bad_request", f"class:{c} does not exist (0..{num_classes - 1})"
                    )
            classes = tuple(sorted(set(raw)))
        elif kind == "sample":
            f = meta.get("fraction")
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
                raise ProtocolError("bad_request", f"fraction: {f!r} not in (0, 1]")
            fraction = float(f)
        return cls(robot, kind, classes, fraction)


class RateLimiter:
    """At most one accepted event per ``interval_s`` per (robot, kind); the rest are refused."""

    def __init__(self, intervals: Mapping[str, float], clock=time.monotonic) -> None:
        self.intervals = dict(intervals)
        self.clock = clock
        self._last: dict[tuple[int, str], float] = {}

    def allow(self, robot: int, kind: str) -> bool:
        """Whether this event is within the robot's rate (and count it when it is)."""
        gap = float(self.intervals.get(kind, 0.0))
        now = self.clock()
        last = self._last.get((robot, kind))
        if last is not None and now - last < gap:
            return False
        self._last[(robot, kind)] = now
        return True
