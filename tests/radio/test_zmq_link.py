"""Cross-process link: two programs exchange a message over ZeroMQ-carried OFDM samples."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys

import pytest

from scaleflu.cli.linktest import payload

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(120)]


def _free_base_port() -> int:
    """A base port with base and base+1 free (ids 0 and 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + 1 < 65536:
            with socket.socket() as s2:
                try:
                    s2.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
            return base
    raise RuntimeError("no free port pair")


def test_two_processes_deliver_bit_exact():
    base = _free_base_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    common = [
        sys.executable,
        "-m",
        "scaleflu.cli.linktest",
        "--kind",
        "ofdm-pairs",
        "--base-port",
        str(base),
        "--snr-db",
        "25",
        "--cfo",
        "0.001",
        "--timeout",
        "60",
    ]
    receiver = subprocess.Popen(
        [*common, "--node", "1", "--peers", "0", "--recv", "1", "--linger", "1.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sender = subprocess.Popen(
        [*common, "--node", "0", "--peers", "1", "--send", "60000", "--seed", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        s_out, s_err = sender.communicate(timeout=90)
        r_out, r_err = receiver.communicate(timeout=30)
    finally:
        for p in (sender, receiver):
            if p.poll() is None:
                p.kill()
    assert sender.returncode == 0, s_err[-2000:]
    assert receiver.returncode == 0, r_err[-2000:]
    sent = json.loads(s_out.strip().splitlines()[-1])
    got = json.loads(r_out.strip().splitlines()[-1])
    want = hashlib.sha256(payload(60000, 5)).hexdigest()
    assert sent["status"] == "delivered" and sent["sha256"] == want
    assert got == {"src": 0, "size": 60000, "sha256": want}
