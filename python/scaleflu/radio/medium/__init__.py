"""Sample-level shared medium: every transmitter on one frequency adds into one sample stream.

One **broker** owns the medium. Every node is a separate process with one OFDM transmitter and
one receiver (a ``MediumPort`` in its flowgraph). Time is *virtual sample time*: the broker
advances it in lockstep, one block of ``block`` samples per step. In each step every node sends
the block of samples its transmitter put out (zeros when idle) and gets back what its receiver
hears through the channel of every link (path loss, carrier and timing offsets, fading, noise);
bursts that overlap collide. A slow node makes the whole medium wait, so the physics does not
depend on CPU speed: the same transmitted streams and seed give bit-identical received streams.
What still runs on wall-clock time is idle pacing (an idle medium costs little CPU) and, unless
the link runs on the medium's clock, the ARQ above. Airtime is counted in virtual samples.

Modules:
  config  MediumConfig, LinkChannel: the medium and the channel of each link (from YAML/JSON)
  model   MediumModel: the physics in numpy, no sockets
  broker  MediumBroker (ZeroMQ lockstep server), MediumClient (one node's raw end), broker_stats
  port    the GNU Radio end of a node (MediumPort, the GRC block medium_node, frame_burst)

Use (the Link of a node is ``scaleflu.radio.links.SharedMediumLink``, link kind
``ofdm-shared``)::

    cfg = MediumConfig(nodes=(0, 1, 2), seed=1, default=LinkChannel(snr_db=20, fading="rayleigh"))
    broker = MediumBroker(cfg).start()             # thread; or `python -m scaleflu.cli.medium`
    broker.stats()  # virtual time, airtime and collision samples per node, steps
    broker.close()

The names below are the face of the package; they need no GNU Radio (``port`` does).
"""

from .broker import MediumBroker, MediumClient, MediumError, broker_stats
from .config import DEFAULT_MEDIUM_ADDRESS, MAX_NODE_ID, LinkChannel, MediumConfig
from .model import MediumModel

__all__ = [
    "DEFAULT_MEDIUM_ADDRESS",
    "MAX_NODE_ID",
    "LinkChannel",
    "MediumBroker",
    "MediumClient",
    "MediumConfig",
    "MediumError",
    "MediumModel",
    "broker_stats",
]
