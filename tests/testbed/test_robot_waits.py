"""The robot app on its default link with nothing to talk to: it says what it waits for and
stops at --max-runtime (no silent hang)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

APPS = Path(__file__).resolve().parents[2] / "apps"
pytest.importorskip("gnuradio.scaleflu", reason="the default link (ofdm-shared) needs the blocks")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def enrolment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from scaleflu.cli import main

    d = tmp_path_factory.mktemp("keys")
    argv = ["keys", "enrol", "--store", str(d / "keys.json"), "--robot", "1", "--out-dir", str(d)]
    assert main(argv) == 0
    return d / "robot1.json"


def _robot(enrolment: Path, *extra: str, timeout: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(APPS / "robot_client.py"), "--keys", str(enrolment)]
        + ["--robot-id", "1", "--log-level", "INFO", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return out.returncode, out.stderr, time.monotonic() - t0


def test_no_broker_is_said_every_few_seconds_and_max_runtime_holds(enrolment: Path) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"  # nobody serves it
    rc, err, wall = _robot(enrolment, "--broker", address, "--max-runtime", "7", timeout=90)
    assert rc == 2, err
    waiting = [x for x in err.splitlines() if "waiting for the medium broker" in x]
    assert waiting and all(" INFO " in x and address in x for x in waiting), err
    assert "python -m scaleflu.cli.medium --address " + address in waiting[0]
    last = err.strip().splitlines()[-1]
    assert "cannot open the link" in last and address in last and "in 7 s" in last
    assert wall < 60  # the bound held (interpreter and GNU Radio start-up aside)


def test_no_server_behind_the_broker_stops_at_max_runtime(enrolment: Path) -> None:
    from scaleflu.radio.medium import MediumBroker, MediumConfig

    broker = MediumBroker(MediumConfig(address=f"tcp://127.0.0.1:{_free_port()}")).start()
    try:
        rc, err, wall = _robot(
            enrolment, "--broker", broker.address, "--max-runtime", "10", timeout=120
        )
    finally:
        broker.close()
    assert rc == 0, err
    assert "no REGISTER_ACK from the edge server" in err
    assert "max runtime reached before the edge server answered" in err
    assert wall < 70
