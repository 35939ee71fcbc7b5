#!/usr/bin/env python3
"""SCALE testbed edge server (thin wrapper over scaleflu.testbed; see docs/testbed.md).

Example (two processes on one machine over the simulated channel, after apps/testbed.py wrote
the keys, or with your own key file)::

    .venv/bin/python apps/edge_server.py --keys keys.json --run-dir runs/mytest \
        --link frames --hub tcp://127.0.0.1:5560 --set testbed.rounds=3

Real radios (USRP 2955 receives, a USRP 2900 transmits)::

    .venv/bin/python apps/edge_server.py --keys keys.json --run-dir runs/lab --link uhd \
        --rx-args "type=x300,addr=192.168.40.2,master_clock_rate=200e6" --rx-subdev "A:0" \
        --tx-args "type=b200,serial=XXXX,master_clock_rate=20e6" --freq 2.45e9 --rate 5e6

``--mcs auto`` (the default, ``testbed.mcs``) runs the coded OFDM PHY with link adaptation (the
server's MAC chooses each robot's MCS), ``--mcs stock`` the paper's uncoded QPSK PHY, ``--mcs
16qam-1/2`` (any MCS name) one MCS; every node of a deployment runs the same.
"""

import sys

from scaleflu.cli.testbed import server_main

if __name__ == "__main__":
    sys.exit(server_main())
