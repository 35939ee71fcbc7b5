"""The ARQ and MAC settings a link starts from, per medium: the one table of link defaults.

Every link kind (:mod:`scaleflu.linkkinds`) names its row here, and the back-ends that apply a
default of their own (the OFDM links of :mod:`scaleflu.radio.links`, the frame hub of
:mod:`scaleflu.link.hub`) read the same rows; what a caller gives goes over them. Why each value
is what it is, with the measurements behind it: docs/link.md, "Link defaults".

``ARQ_DEFAULTS`` (over :class:`~scaleflu.link.arq.ArqConfig`'s own defaults):

* ``frames``: a frame hub that serialises every node's frames at one rate; with several uploads
  at once round trips reach a second, so the first timers are long and losses are left to the
  ACK bitmaps' fast retransmit.
* ``ofdm``: the GNU Radio OFDM back-ends, whose frames wait in the transmitter's queue and GNU
  Radio's buffers (round trips of seconds when several flows share a CPU-bound PHY); a window
  of 64 frames keeps the PHY busy while a lost frame waits for its fast retransmit.
* ``mac``: any link under the server-scheduled MAC, where a frame may wait for its robot's
  grant: longer first timers, and a window that fills a grant.

``MAC_DEFAULTS`` (over :class:`~scaleflu.link.mac.MacConfig`'s own defaults):

* ``realtime``: nodes in processes of their own on the wall clock; a robot answers its grant
  after its Python thread wakes up (milliseconds, more while it trains): wide guards.
* ``virtual``: laid over ``realtime`` for a MAC on the sample-level medium's virtual clock
  (``ofdm-shared``), where a robot's answer costs a few lockstep blocks of virtual time (its
  receiver decoding the grant, its transmitter modulating the burst), not a thread's wake-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .mac import MacConfig

ARQ_DEFAULTS: dict[str, dict[str, Any]] = {
    "frames": {"window": 32, "initial_rto": 3.0, "min_rto": 0.6},
    "ofdm": {"window": 64, "initial_rto": 3.0, "min_rto": 0.25},
    "mac": {"window": 64, "initial_rto": 5.0, "min_rto": 1.0},
}

MAC_DEFAULTS: dict[str, dict[str, Any]] = {
    "realtime": {"turnaround_s": 0.01, "guard_s": 0.1, "contention_slots": 4},
    "virtual": {"turnaround_s": 0.005, "guard_s": 0.03},
}


def mac_config(
    opts: Mapping[str, Any] | MacConfig | None = None,
    rate: float | None = None,
    clock: str = "realtime",
) -> MacConfig:
    """A MacConfig: a MacConfig as it is; else the ``realtime`` row (and the ``virtual`` row
    over it for ``clock="virtual"``), then the options of ``opts`` that are not None, and
    ``rate`` as ``rate_bytes_per_s`` unless ``opts`` sets it."""
    if isinstance(opts, MacConfig):
        return opts
    if clock not in ("realtime", "virtual"):
        raise ValueError(f"clock must be 'realtime' or 'virtual', got {clock!r}")
    kw = dict(MAC_DEFAULTS["realtime"])
    if clock == "virtual":
        kw.update(MAC_DEFAULTS["virtual"])
    kw.update({k: v for k, v in (opts or {}).items() if v is not None})
    if rate and "rate_bytes_per_s" not in kw:
        kw["rate_bytes_per_s"] = rate
    return MacConfig(**kw)
