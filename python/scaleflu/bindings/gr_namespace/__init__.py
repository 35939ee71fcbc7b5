"""gr-scaleflu blocks in the GNU Radio namespace: ``from gnuradio import scaleflu``.

C++ blocks come from the pybind11 module; the Python blocks and hier blocks (link_arq,
ofdm_link_tx/rx, frame_drop, and usrp_tx/usrp_rx where gr-uhd is installed) live in
``scaleflu.radio`` and are re-exported here. Both parts are required: a missing one is an
ImportError that says what to install, never a silently smaller module.
"""

import os

try:
    from .scaleflu_python import *  # noqa: F401,F403
except ImportError:
    dirname, filename = os.path.split(os.path.abspath(__file__))
    __path__.append(os.path.join(dirname, "bindings"))  # noqa: F405
    from .scaleflu_python import *  # noqa: F401,F403

try:
    from scaleflu.radio.blocks import *  # noqa: F401,F403
except ModuleNotFoundError as exc:
    if exc.name is not None and (exc.name == "scaleflu" or exc.name.startswith("scaleflu.")):
        raise ImportError(
            "gnuradio.scaleflu needs the pure-Python scaleflu package for its Python blocks "
            f"({exc}); install it (pip install -e . in the gr-scaleflu checkout, or make "
            "install) or put its python/ folder on PYTHONPATH"
        ) from exc
    raise
