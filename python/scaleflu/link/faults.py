"""Faults injected into a link's frame input, for tests and benchmarks (the link is unchanged).

Each function wraps the ``feed(raw, snr_db=None)`` of a link (an ArqLink, or the ArqLink inside a
GNU Radio back-end's ``link_arq`` block) so that chosen frames never reach it.
"""

from __future__ import annotations

from typing import Any

from .frame import BROADCAST, FrameType
from .mac import MAC_MSG_ID
from .mac.txqueue import _frame_key


def drop_broadcast_bodies(link: Any, dropped: list[int]) -> None:
    """Make ``link`` (an object with a ``feed(raw)`` frame input) lose every broadcast DATA frame
    that carries a model body (not the MAC's own messages); the lost sequence numbers go to
    ``dropped``."""
    feed = link.feed

    def lossy_feed(raw: bytes, snr_db: float | None = None) -> None:
        k = _frame_key(raw)
        if k and k[0] == FrameType.DATA and k[2] == BROADCAST and k[3] != MAC_MSG_ID:
            dropped.append(k[4])
            return
        feed(raw, snr_db)

    link.feed = lossy_feed
