"""What the testbed does with a link: counters per round, and the broadcast downlink's bodies.

The apps open their link with :func:`scaleflu.linkkinds.open_link`; this module reads its
counters (``link_stats``, ``link_counters``, ``round_link_row``) and packs the model bodies the
server broadcasts through the MAC (``pack_broadcast_body``, ``BodyCache``, ``JointHandle``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from typing import Any

from scaleflu.link import Link
from scaleflu.link.arq import SendStatus

log = logging.getLogger(__name__)


def link_stats(link: Link) -> dict[str, Any]:
    """ARQ counters of a link when it has them (bytes on air, retransmissions), else {}."""
    stats = getattr(link, "stats", None)
    if callable(stats):
        try:
            return dict(stats())
        except Exception:  # a back-end without counters
            return {}
    return {}


# -- broadcast downlink of model bodies ------------------------------------------------------
# A model for several robots goes on air once: the server broadcasts the body (prefixed with its
# SHA-256) through the MAC, and sends every robot a small sealed MODEL envelope with an empty body
# and meta["body_sha256"]. The robot uses a broadcast body only when an envelope authenticated
# with its own key names that hash, so the unauthenticated broadcast can not inject a model.
BCAST_PREFIX = b"SFBC\x01"
_BCAST_HEAD = len(BCAST_PREFIX) + 32


def pack_broadcast_body(body: bytes) -> tuple[str, bytes]:
    """(sha256 hex, bytes to broadcast) of a model body."""
    digest = hashlib.sha256(body).digest()
    return digest.hex(), BCAST_PREFIX + digest + body


def unpack_broadcast_body(data: bytes) -> tuple[str, bytes] | None:
    """(sha256 hex, body) of a broadcast body whose hash checks, else None (not one, or bad)."""
    if len(data) < _BCAST_HEAD or not data.startswith(BCAST_PREFIX):
        return None
    digest = data[len(BCAST_PREFIX) : _BCAST_HEAD]
    body = data[_BCAST_HEAD:]
    if hashlib.sha256(body).digest() != digest:
        log.warning("broadcast body with a wrong hash dropped")
        return None
    return digest.hex(), body


class BodyCache:
    """The last few broadcast bodies by hash (bounded: a flood only evicts, never grows)."""

    def __init__(self, max_items: int = 3) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, bytes] = OrderedDict()

    def put(self, sha: str, body: bytes) -> None:
        self._items[sha] = body
        self._items.move_to_end(sha)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def get(self, sha: str) -> bytes | None:
        return self._items.get(sha)


class JointHandle:
    """A model send made of a sealed envelope (unicast) and a broadcast body: both must arrive."""

    def __init__(self, envelope: Any, broadcast: Any, robot: int) -> None:
        self.envelope = envelope
        self.broadcast = broadcast
        self.robot = robot

    def done(self) -> bool:
        """Finished: the envelope failed, or both parts are settled for this robot."""
        if not self.envelope.done():
            return False
        if self.envelope.status is not SendStatus.DELIVERED:
            return True
        return self.robot in self.broadcast.confirmed or self.broadcast.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (polling; the two parts finish on the link's thread)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.02)
        return True

    @property
    def status(self) -> SendStatus:
        if not self.done():
            return SendStatus.PENDING
        ok = self.envelope.status is SendStatus.DELIVERED and self.robot in self.broadcast.confirmed
        return SendStatus.DELIVERED if ok else SendStatus.FAILED

    @property
    def reason(self) -> str:
        if self.envelope.status is not SendStatus.DELIVERED:
            return self.envelope.reason
        return (
            "" if self.robot in self.broadcast.confirmed else f"broadcast: {self.broadcast.reason}"
        )


def link_adaptation(link: Link) -> dict[str, Any] | None:
    """The MAC's link adaptation of a server link (per robot: SNRs, MCS each way, bytes by MCS;
    the broadcast's MCS), None without one (``MacServer.adaptation``)."""
    mac = getattr(link, "mac", None)
    adapt = getattr(mac, "adaptation", None)
    if not callable(adapt):
        return None
    lock = getattr(getattr(link, "arq", None), "link", link)
    try:
        with lock._lock:  # the MAC runs under the link's lock
            return adapt()
    except AttributeError:
        return adapt()


def _by_mcs_delta(after: dict[str, int], before: dict[str, int] | None) -> dict[str, int]:
    before = before or {}
    out = {k: int(v - before.get(k, 0)) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def round_adaptation(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict:
    """The link-adaptation columns of one round: per robot the SNR each end reported last and
    the MCS each way at the round's end, and the bytes each MCS carried in the round (the
    robots' uploads received, the server's frames: broadcast, ACKs, grants)."""
    if not after or after.get("mode") is None:
        return {}
    b_robots = (before or {}).get("robots", {})
    robots = {}
    for r, a in after["robots"].items():
        b = b_robots.get(r, {})
        robots[int(r)] = {
            "up_snr_db": None if a["up_snr_db"] is None else round(a["up_snr_db"], 1),
            "down_snr_db": None if a["down_snr_db"] is None else round(a["down_snr_db"], 1),
            "up_mcs": a["up_mcs"],
            "down_mcs": a["down_mcs"],
            "bytes_up_by_mcs": _by_mcs_delta(a["bytes_up_by_mcs"], b.get("bytes_up_by_mcs")),
            "up_lost": a["up_lost"] - b.get("up_lost", 0),
            "up_frames": a["up_frames"] - b.get("up_frames", 0),
            "fallbacks": a["fallbacks"] - b.get("fallbacks", 0),
        }
    return {
        "mode": after["mode"],
        "broadcast_mcs": after.get("broadcast_mcs"),
        "server_bytes_by_mcs": _by_mcs_delta(
            after.get("server_bytes_by_mcs", {}), (before or {}).get("server_bytes_by_mcs")
        ),
        "robots": robots,
    }


def link_counters(link: Link) -> dict[str, float]:
    """Counters of a link for the per-round report: ARQ retransmissions and MAC scheduling."""
    st = link_stats(link)
    arq, mac = st.get("arq", {}), st.get("mac", {})
    out = {
        "retransmissions": float(arq.get("retransmissions", 0)),
        "link_bytes": float(arq.get("bytes_tx", 0)),
    }
    if mac:
        out.update(
            sched_bytes=float(mac.get("control_bytes_tx", 0) + mac.get("control_bytes_rx", 0)),
            grants=float(mac.get("grants_tx", 0)),
            grant_timeouts=float(mac.get("grant_timeouts", 0)),
            bcast_frames=float(mac.get("bcast_frames_tx", 0)),
            bcast_bytes=float(mac.get("bcast_bytes_tx", 0)),
            bcast_repair_frames=float(mac.get("bcast_repair_frames", 0)),
        )
    cfg = getattr(getattr(link, "mac", None), "config", None)
    if cfg is not None:
        out["rate_bytes_per_s"] = float(cfg.rate_bytes_per_s)
    medium = getattr(link, "medium_stats", None)  # ofdm-shared: measured at the broker
    if callable(medium):
        try:
            m = medium()
            out["medium_air_s"] = float(sum(m["airtime_s"].values()))
            out["collision_s"] = float(m["collision_s"])
            out["virtual_s"] = float(m["virtual_s"])
        except Exception as exc:  # the broker may be gone at the very end: no medium columns
            log.debug("medium stats: %s", exc)
    return out


def round_link_row(before: dict[str, float], after: dict[str, float], air_bytes: int) -> dict:
    """The link columns of one round: airtime, retransmissions, scheduling overhead."""
    row: dict[str, Any] = {
        "retransmissions": int(after["retransmissions"] - before.get("retransmissions", 0))
    }
    rate = after.get("rate_bytes_per_s")
    if "sched_bytes" in after:
        sched = after["sched_bytes"] - before.get("sched_bytes", 0)
        row["sched_bytes"] = int(sched)
        bcast = after.get("bcast_bytes", 0) - before.get("bcast_bytes", 0)
        row["sched_overhead"] = sched / max(1.0, air_bytes + bcast + sched)
        for k in ("grants", "grant_timeouts", "bcast_frames", "bcast_repair_frames"):
            row[k] = int(after[k] - before.get(k, 0))
    if "medium_air_s" in after and "medium_air_s" in before:
        # the sample-level medium counts every node's samples on air, and overlapping ones
        row["airtime_s"] = after["medium_air_s"] - before["medium_air_s"]
        row["collision_s"] = after["collision_s"] - before["collision_s"]
        row["virtual_s"] = after["virtual_s"] - before["virtual_s"]
    elif rate:  # ARQ bytes of every node + broadcast bytes + MAC frames, at the PHY rate
        bcast = after.get("bcast_bytes", 0) - before.get("bcast_bytes", 0)
        row["airtime_s"] = (air_bytes + bcast + row.get("sched_bytes", 0)) / rate
    return row
