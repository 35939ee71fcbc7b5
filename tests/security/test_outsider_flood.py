"""A keyless outsider floods the link while the real apps run FL rounds (the threat model:
docs/testbed.md).

``apps/testbed.py --link frames --outsider-rate 300``: the edge server and three robot
processes on the frame hub, and a fourth process (``scaleflu.testbed.outsider``, node 77, no
key) sending 300 frames/s: keyless partial and complete messages, DATA/ACK/NACK frames forged
as coming from a robot, NACKs forged as coming from the server, random bytes. The rounds must
complete with every robot, every robot must train from exactly the server's model, and the
outsider's frames must be counted as refused with their reason. Twice: with the default link
settings (``testbed.arq.require_auth`` on: the link drops keyless frames and answers none) and
with ``testbed.arq.require_auth=false`` (keyless frames reach the server's parser, which
refuses them).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaleflu.fl.history import HistoryStore
from scaleflu.testbed.common import arrays
from scaleflu.testbed.protocol import state_sha256

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module", params=["default", "keyless_allowed"])
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("flood")
    off = request.param == "keyless_allowed"
    extra = ["--set", "testbed.arq.require_auth=false"] if off else []
    cmd = [
        sys.executable, str(ROOT / "apps" / "testbed.py"),
        "--out", str(out), "--robots", "3", "--rounds", "2", "--link", "frames",
        "--unlearn", "none", "--outsider-rate", "300", "--timeout", "360", "--quiet",
        "--set", "data.train_subset=1500", "--set", "data.test_subset=300",
        "--set", "testbed.eval_test_samples=100", "--set", "testbed.round_deadline_s=60",
        "--set", "testbed.unlearn.wait_s=0", *extra,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    report = json.loads((out / "report.json").read_text())
    robots = {r: json.loads((out / "logs" / f"robot{r}.json").read_text()) for r in (1, 2, 3)}
    return out, report, robots, request.param


def test_rounds_complete_with_every_robot_under_the_flood(run):
    _, report, robots, _ = run
    frames = report["launcher"]["outsider"]["frames"]
    assert all(n > 100 for n in frames.values()), frames  # it really flooded, every kind
    rows = report["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["participants"] == [1, 2, 3] and not r["missing"] for r in rows)
    for r, s in robots.items():
        assert [x["upload"] for x in s["rounds"]] == ["delivered", "delivered"], r
        assert s["link"]["arq"]["sends_failed"] == 0  # forged NACKs failed no send


def test_every_robot_trained_from_the_servers_model_bit_exact(run):
    out, _, robots, _ = run
    with HistoryStore(out) as h:  # the key stayed with the server; the digests are not checked
        want = {t: state_sha256(arrays(h.global_model(t))) for t in (1, 2)}
    for r, s in robots.items():
        assert {x["round"]: x["model_sha256"] for x in s["rounds"]} == want, r


def test_outsider_frames_are_refused_with_their_reason(run):
    _, report, robots, mode = run
    arq = report["server_link"]["arq"]
    # frames forged as a robot's (DATA, ACK, NACK) fail the link tag: dropped, counted
    assert arq["auth_failures"] > 500 and arq["bad_nacks"] == 0 and arq["sends_failed"] == 0
    assert arq["bad_frames"] + arq["crc_errors"] > 100  # the random bytes
    if mode == "keyless_allowed":
        # its complete messages reach the parser and are refused: 20 logged, then counted
        assert report["rejection_counts"]["malformed"] > 100
        assert report["rejections_counted_only"]["77"]["malformed"] > 80
        assert sum(1 for x in report["rejections"] if x["robot"] == 77) <= 20 * 3
    else:  # the default: the link drops every keyless frame, nothing reaches the parser
        assert arq["unauthenticated"] > 500
        assert not [x for x in report["rejections"] if x["robot"] == 77]
        assert arq["acks_tx"] < 1000  # no ACK is spent on the outsider's frames
    # NACKs forged as the server's fail the tag on every robot
    for r, s in robots.items():
        assert s["link"]["arq"]["auth_failures"] > 50, r
