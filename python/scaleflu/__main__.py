"""``python -m scaleflu``: the ``scaleflu`` command."""

import sys

from scaleflu.cli.main import entry

sys.exit(entry())
