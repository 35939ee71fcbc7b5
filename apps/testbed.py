#!/usr/bin/env python3
"""One-command local SCALE testbed (``make demo``): edge server + 3 robots as processes.

    .venv/bin/python apps/testbed.py                      # the demo (frames link, SCALE)
    .venv/bin/python apps/testbed.py --link ofdm-zmq      # OFDM samples between processes
    .venv/bin/python apps/testbed.py --kill-robot 2 --attacker-robot 1 \
        --restart-server-after-round 1                    # the faults, all at once

See docs/testbed.md.
"""

import sys

from scaleflu.testbed.launcher import main

if __name__ == "__main__":
    sys.exit(main())
