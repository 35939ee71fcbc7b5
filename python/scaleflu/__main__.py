"""``python -m scaleflu``: the ``scaleflu`` command."""

import sys

from scaleflu.cli.main import main

sys.exit(main())
