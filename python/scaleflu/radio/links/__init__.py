"""Link back-ends over GNU Radio OFDM: each a :class:`scaleflu.link.Link` for the apps.

Modules, one back-end each (the stack per node is in ``base``):
  base      GrLink (the Link over a flowgraph's link_arq block) and the receive chain
  loopback  OfdmLoopbackNetwork / OfdmLoopbackLink: every node in one process (ideal FDMA)
  pairs     ZmqOfdmLink: one node per process, a private channel per pair over ZeroMQ (FDMA)
  shared    SharedMediumLink: one node per process on one simulated frequency (collisions)
  usrp      UhdLink: a real radio

Link kinds choose among them and build them (:mod:`scaleflu.linkkinds`). The names below are
the package's face: import them from ``scaleflu.radio.links`` (the PHY's from
:mod:`scaleflu.radio.phy`, re-exported here).
"""

from ..phy import ChannelConfig, PhyConfig, burst_power, phy_rate_bytes_per_s
from .base import GrLink
from .loopback import OfdmLoopbackLink, OfdmLoopbackNetwork
from .pairs import ZmqOfdmLink
from .shared import SharedMediumLink
from .usrp import UhdLink

__all__ = [
    "ChannelConfig",
    "GrLink",
    "OfdmLoopbackLink",
    "OfdmLoopbackNetwork",
    "PhyConfig",
    "SharedMediumLink",
    "UhdLink",
    "ZmqOfdmLink",
    "burst_power",
    "phy_rate_bytes_per_s",
]
