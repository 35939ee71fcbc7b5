#!/usr/bin/env python3
"""SCALE testbed robot client (thin wrapper over scaleflu.testbed; see docs/testbed.md).

Example::

    .venv/bin/python apps/robot_client.py --keys keys.json --robot-id 3 --link frames \
        --hub tcp://127.0.0.1:5560 --unlearn client --unlearn-after-round 2

On a MentorPi with its USRP 2900::

    .venv/bin/python apps/robot_client.py --keys robot3.json --robot-id 3 --link uhd \
        --args "type=b200,master_clock_rate=20e6" --freq 2.45e9 --rate 5e6 --tx-gain 60

``--mcs auto`` (the default, ``testbed.mcs``) runs the coded OFDM PHY with link adaptation (the
server's MAC chooses each robot's MCS), ``--mcs stock`` the paper's uncoded QPSK PHY, ``--mcs
16qam-1/2`` (any MCS name) one MCS; every node of a deployment runs the same.
"""

import sys

from scaleflu.cli.testbed import robot_main

if __name__ == "__main__":
    sys.exit(robot_main())
