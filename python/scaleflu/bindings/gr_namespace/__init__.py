"""gr-scaleflu blocks in the GNU Radio namespace: ``from gnuradio import scaleflu``.

C++ blocks come from the pybind11 module; the Python blocks and hier blocks live in
``scaleflu.radio`` and are re-exported here when that package is importable.
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
except ImportError:  # the pure-Python package is optional for the C++ blocks
    pass
