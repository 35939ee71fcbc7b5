#!/usr/bin/env python3
"""One-command local SCALE testbed (``make demo``): edge server + 3 robots as processes.

    .venv/bin/python apps/testbed.py                      # the demo (OFDM over ZeroMQ, SCALE)
    .venv/bin/python apps/testbed.py --link frames        # ARQ frames without a PHY (cheaper)
    .venv/bin/python apps/testbed.py --kill-robot 2 --attacker-robot 1 \
        --restart-server-after-round 1                    # the faults, all at once

See docs/testbed.md.
"""

import sys

from scaleflu.cli.testbed import launcher_main

if __name__ == "__main__":
    sys.exit(launcher_main())
