"""End to end: edge server + 3 robots as processes over the simulated OFDM link (ZeroMQ).

Noise (20 dB SNR) and frame loss (5 %) on every receive channel, 2 rounds, robot 1 (the
backdoored one) asks to be forgotten, robot 3 sends forged / NaN / wrong-shape / duplicate /
replayed / garbage uploads in round 1, robot 2 dies on receiving the round-2 model and rejoins
after the round closed. Asserts bit-exact deployment, the fall of the forgetting metric,
the rejections and a round closed at its deadline.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gnuradio.zeromq")
pytest.importorskip("scaleflu.radio.links")

ROOT = Path(__file__).resolve().parents[2]
# robot 3 (the attacker) starts round 2 after its round-1 spill (three extra uploads and the
# garbage): on a loaded 2-core CI machine its genuine round-2 upload once came after a 30 s
# deadline (reproduced with three testbeds and two CPU hogs at once: it arrived, refused as late)
DEADLINE = 40

pytestmark = [pytest.mark.gnuradio, pytest.mark.slow, pytest.mark.timeout(560)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("testbed")
    cmd = [
        sys.executable, str(ROOT / "apps" / "testbed.py"),
        "--out", str(out), "--robots", "3", "--rounds", "2", "--link", "ofdm-pairs",
        "--snr-db", "20", "--drop-rate", "0.05",
        "--backdoor-robot", "1", "--unlearn", "client",
        "--kill-robot", "2", "--kill-round", "2",
        "--attacker-robot", "3",
        "--timeout", "480", "--quiet",
        "--set", "data.train_subset=4000",
        "--set", "data.test_subset=600",
        "--set", "testbed.eval_test_samples=300",
        "--set", f"testbed.round_deadline_s={DEADLINE}",
        # robot 3's genuine upload follows two refused ones: on a loaded 2-core CI machine the
        # 5 s default grace ran out before it started (the round closed without it), and 15 s
        # once more (a fresh-clone make test at 13.7 min); the deadline still caps the wait
        "--set", "testbed.refused_grace_s=25",
        "--set", "testbed.unlearn.wait_s=30",
        "--set", "scale.ppo.episodes=8",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    report = json.loads((out / "report.json").read_text())
    robots = {r: json.loads((out / "logs" / f"robot{r}.json").read_text()) for r in (1, 2, 3)}
    return report, robots, log


def test_rounds_recorded_and_killed_robot_did_not_stall(run):
    report, robots, _ = run
    rows = report["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[0]["participants"] == [1, 2, 3]
    assert 2 in rows[1]["missing"] and 2 not in rows[1]["participants"]
    assert 1 in rows[1]["participants"]
    # robot 3 is counted, or its round-2 upload is accounted for: refused as late by the server
    # or not delivered by the robot's link (a machine too loaded for the deadline), never lost
    assert set(rows[1]["missing"]) <= {2, 3}
    if 3 in rows[1]["missing"]:
        up = next(x for x in robots[3]["rounds"] if x["round"] == 2)  # it trained round 2
        late = [
            x
            for x in report["rejections"]
            if x["robot"] == 3 and x["reason"] == "late" and x["message"] == "UPDATE r2"
        ]
        assert late or up["upload"] != "delivered", (up, report["rejections"])
    # closed at the deadline, not stalled: measured on the deadline's own clock (the round's
    # wall time adds the broadcast, aggregation and evaluation, which a loaded machine stretches)
    assert rows[1]["closed_by"] == "deadline" and rows[0]["closed_by"] == "all_in"
    assert DEADLINE <= rows[1]["collect_s"] < DEADLINE + 5
    assert report["history_rounds"] == 2
    assert report["launcher"]["robot_starts"]["2"] == 2  # it rejoined


def test_forged_and_invalid_updates_rejected(run):
    report, _, _ = run
    counts = report["rejection_counts"]
    for reason in ("bad_auth", "non_finite", "wrong_shape", "replay", "malformed"):
        assert counts.get(reason, 0) >= 1, counts
    assert counts.get("duplicate", 0) >= 1, counts
    forged = [x for x in report["rejections"] if x["reason"] == "bad_auth"]
    assert forged and all(x["robot"] == 3 for x in forged)
    assert rows_participants(report, 1) == [1, 2, 3]  # robot 3's genuine update still counted


def rows_participants(report, t):
    return next(r["participants"] for r in report["rounds"] if r["round"] == t)


def test_unlearned_model_bit_exact_on_every_robot(run):
    report, robots, _ = run
    un = report["unlearning"]
    sha = un["model_sha256"]
    assert un["bit_exact"] == {"1": True, "2": True, "3": True}
    for r in (1, 2, 3):
        assert robots[r]["evals"]["unlearned"]["sha256"] == sha
        assert robots[r]["evals"]["before"]["sha256"] == un["before_sha256"]


def test_forgetting_metric_fell(run):
    report, robots, _ = run
    before = robots[1]["evals"]["before"]["metrics"]
    after = robots[1]["evals"]["unlearned"]["metrics"]
    assert before["fa_protocol"] == "backdoor"
    assert after["fa"] < before["fa"], (before, after)
    assert report["unlearning"]["request"]["text"] == "client:0"


def test_report_files(run):
    report, _, log = run
    assert "SCALE testbed summary" in log
    assert report["air_bytes_total"] > 0


def test_side_by_side_and_erasure(run):
    report, _, log = run
    un = report["unlearning"]
    rows = {r["method"]: r for r in un["side_by_side"]}
    assert "scale-default" in rows and "retrain" in rows and "finetune" in rows
    assert rows["retrain"]["fl_rounds"] == 2 and rows["retrain"]["asr"] is not None
    assert "error" not in rows["finetune"] and rows["finetune"]["asr"] is not None  # in the build
    assert rows["scale-default"]["air_bytes"] > 0  # measured on the air for the deployed one
    assert "same request, server-side measurements" in log
    er = un["erasure"]
    assert er["clients"] == [0] and er["rounds"] == [1, 2] and er["updates"] == 2
