"""A server-scheduled MAC for one shared frequency, with a NORM-style broadcast downlink.

Pure Python, no threads, clock injectable: the same objects run in real time under a link
(``MacLink``-style owners call ``on_frame``/``poll`` as frames and timers arrive) and in virtual
time in the frame-level simulator (``scaleflu.link.macsim``). The MAC sits between an
:class:`~scaleflu.link.arq.ArqEndpoint` and the frame transport: it takes over the endpoint's
``transmit`` callable (frames the ARQ wants on air go into a MAC queue) and sorts what comes off
the air (its own control frames; link frames go on to ``endpoint.on_frame``). The ARQ knows
nothing of it.

Rules (docs/link.md, "MAC"): the **server** (:class:`MacServer`, module ``server``) owns the
medium and alternates its downlink bursts with GRANTs to one robot at a time; a **robot**
(:class:`MacStation`, module ``station``) transmits only inside its grants and ends each with a
REPORT; **registration** (JOIN in the contention slots a BEACON opens) is the one contention
access; a **broadcast** goes on air once and is repaired from the robots' REPORTs.

Modules:
  server   MacServer, BroadcastHandle: scheduling, registration, broadcast downlink
  station  MacStation: a robot's side
  frames   the control frames' wire format (BEACON, GRANT, REPORT, JOIN) and their carriage
  txqueue  the transmit queue the MAC puts under the ARQ
  config   MacConfig (timing, sizes), MacStats (counters)

The names below are the package's face: import them from ``scaleflu.link.mac``.
"""

from .config import MacConfig, MacStats
from .frames import (
    MAC_HEADER,
    MAC_MAGIC,
    MAC_MSG_ID,
    MAC_OVERHEAD,
    MAC_VERSION,
    MAX_BCAST_PER_GRANT,
    BcastStatus,
    MacFrame,
    MacFrameError,
    MacType,
    decode_mac,
    encode_mac,
    is_mac_frame,
    mac_from_air,
    mac_on_air,
)
from .server import BroadcastHandle, MacServer
from .station import MacStation

__all__ = [
    "MAC_HEADER",
    "MAC_MAGIC",
    "MAC_MSG_ID",
    "MAC_OVERHEAD",
    "MAC_VERSION",
    "MAX_BCAST_PER_GRANT",
    "BcastStatus",
    "BroadcastHandle",
    "MacConfig",
    "MacFrame",
    "MacFrameError",
    "MacServer",
    "MacStation",
    "MacStats",
    "MacType",
    "decode_mac",
    "encode_mac",
    "is_mac_frame",
    "mac_from_air",
    "mac_on_air",
]
