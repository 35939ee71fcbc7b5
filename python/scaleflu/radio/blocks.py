"""The Python blocks of ``gnuradio.scaleflu``: this module's names are star-imported there.

The export face of the GNU Radio module, apart from the modules that define the blocks: the
message blocks (:mod:`scaleflu.radio.message_blocks`), the OFDM link hier blocks
(:mod:`scaleflu.radio.ofdm`; coded: :mod:`scaleflu.radio.coded_ofdm`), the USRP blocks where
gr-uhd is installed (:mod:`scaleflu.radio.uhd`) and the shared-medium node
(:mod:`scaleflu.radio.medium.port`).
Nothing inside scaleflu imports it.
"""

import importlib.util

from .coded_ofdm import coded_ofdm_rx, coded_ofdm_tx
from .medium.port import medium_node
from .message_blocks import frame_drop, frame_to_pdu, frame_to_raw_pdu, link_arq, pdu_to_frame
from .ofdm import ofdm_link_rx, ofdm_link_tx

__all__ = [
    "coded_ofdm_rx",
    "coded_ofdm_tx",
    "frame_drop",
    "frame_to_pdu",
    "frame_to_raw_pdu",
    "link_arq",
    "medium_node",
    "ofdm_link_rx",
    "ofdm_link_tx",
    "pdu_to_frame",
]

# The USRP hier blocks (GRC's "USRP Link Source/Sink") ride along where gr-uhd is installed;
# without gr-uhd there is no USRP block to offer.
if importlib.util.find_spec("gnuradio.uhd") is not None:
    from .uhd import RadioNotFound, usrp_rx, usrp_tx  # noqa: F401

    __all__ += ["RadioNotFound", "usrp_rx", "usrp_tx"]
