"""What the MAC holds of the ARQ: its transmit queue, and the endpoint settings it needs.

Server and station both take over their ArqEndpoint's ``transmit``: link frames the ARQ wants
on air wait in a :class:`_TxQueue` (control frames first, one copy of each DATA fragment) until
the MAC gives them air time.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from dataclasses import replace

from ..arq import ArqEndpoint
from ..frame import FRAME_MAGIC, FrameType
from .config import MacStats
from .frames import _U16


def _under_mac(endpoint: ArqEndpoint) -> None:
    """Settings of an ArqEndpoint that the MAC wraps: its frames wait in the MAC's queue for a
    grant, so the time since the ARQ handed a frame over says nothing about whether it went on
    air, and an ACK one RTT later does not prove it lost (``ArqConfig.rack_rtt`` off)."""
    if endpoint.config.rack_rtt:
        endpoint.config = replace(endpoint.config, rack_rtt=False)


def _frame_key(raw: bytes) -> tuple[int, ...] | None:
    """(type, src, dst, msg_id, seq) of a link frame, for de-duplication in the MAC queue."""
    if len(raw) < 16 or _U16.unpack_from(raw)[0] != FRAME_MAGIC:
        return None
    return (raw[3], *struct.unpack_from(">HHII", raw, 4))


class _TxQueue:
    """Link frames waiting for air time: control (ACK/NACK) first, then DATA; one copy per key."""

    def __init__(self, stats: MacStats) -> None:
        self._ctl: deque[bytes] = deque()
        self._data: OrderedDict[tuple[int, ...] | int, bytes] = OrderedDict()
        self._n = 0
        self.stats = stats

    def put(self, raw: bytes) -> None:
        key = _frame_key(raw)
        if key is not None and key[0] != FrameType.DATA:
            self._ctl.append(raw)
            return
        if key is None:
            self._n += 1
            key = self._n
        elif key in self._data:
            self.stats.queued_duplicates += 1
        self._data[key] = raw

    def pop_upto(self, budget: int) -> list[bytes]:
        out: list[bytes] = []
        used = 0
        while self._ctl and used + len(self._ctl[0]) <= budget:
            raw = self._ctl.popleft()
            used += len(raw)
            out.append(raw)
        while self._data:
            key, raw = next(iter(self._data.items()))
            if used + len(raw) > budget:
                break
            del self._data[key]
            used += len(raw)
            out.append(raw)
        return out

    @property
    def control_bytes(self) -> int:
        return sum(map(len, self._ctl))

    @property
    def nbytes(self) -> int:
        return sum(map(len, self._ctl)) + sum(map(len, self._data.values()))

    def __len__(self) -> int:
        return len(self._ctl) + len(self._data)
