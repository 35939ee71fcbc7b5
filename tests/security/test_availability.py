"""A local fault (disk full, read-only folder) ends the edge server with one line and rc 3."""

from __future__ import annotations

import errno
import os

import pytest

from scaleflu.cli import testbed as cli
from scaleflu.testbed.keys import KeyStore


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS], ids=["disk_full", "read_only"])
def test_disk_fault_is_one_line_and_resumable(tmp_path, monkeypatch, capfd, err):
    store = KeyStore.create([1, 2, 3])
    keys = store.save(tmp_path / "keys.json")

    class FakeLink:
        closed = False

        def close(self):
            FakeLink.closed = True

    class FailingServer:
        def __init__(self, *a, **k):
            pass

        def run(self):
            raise OSError(err, "simulated", str(tmp_path / "run" / "history" / "x"))

    monkeypatch.setattr(cli, "build_link", lambda *a, **k: FakeLink())
    import scaleflu.testbed.server as server_mod

    monkeypatch.setattr(server_mod, "EdgeServer", FailingServer)
    rc = cli.server_main(
        ["--keys", str(keys), "--run-dir", str(tmp_path / "run"), "--link", "frames",
         "--no-plots", "--no-progress"]
    )  # fmt: skip
    assert rc == 3 and FakeLink.closed
    out = capfd.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if "ERROR" in ln]
    assert len(lines) == 1, out  # one line
    assert "Traceback" not in out.out + out.err
    assert "simulated" in lines[0] and "same --run-dir" in lines[0]


def test_loose_key_store_refused_by_the_server_app(tmp_path, capfd):
    store = KeyStore.create([1])
    keys = store.save(tmp_path / "keys.json")
    keys.chmod(0o644)
    rc = cli.server_main(["--keys", str(keys), "--run-dir", str(tmp_path / "run")])
    out = capfd.readouterr()
    assert rc == 2 and "chmod 600" in out.out + out.err


def _cfg(*extra):
    from scaleflu.config import load_config

    return load_config(
        None,
        [
            "data.num_clients=3", "fl.clients_per_round=3", "data.train_subset=600",
            "data.test_subset=100", "testbed.unlearn.wait_s=0", *extra,
        ],
    )  # fmt: skip


def test_failed_rounds_do_not_end_the_federation(tmp_path):
    """Rounds with no valid update are retried max_round_retries times, then recorded with no
    participant (model unchanged) and the run goes on with the next round; it is resumable."""
    import torch

    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.server import EdgeServer

    cfg = _cfg("testbed.rounds=2", "testbed.round_deadline_s=0.3", "testbed.max_round_retries=1")
    store = KeyStore.create([1, 2, 3])
    with MemoryChannel(seed=0) as ch:
        server = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        theta1 = server.history.global_model(1)
        server.sessions.wait_for_robots = lambda n, timeout: True  # nobody uploads anything
        report = server.run()
        server.link.close()
        failed = [e["round"] for e in report["events"] if e["event"] == "round_failed"]
        skipped = [e["round"] for e in report["events"] if e["event"] == "round_skipped"]
        assert failed == [1, 1, 2, 2] and skipped == [1, 2]  # 1 + max_round_retries attempts
        assert not any(e["event"] == "training_stopped" for e in report["events"])
        assert report["history_rounds"] == 2
        assert [r["round"] for r in report["rounds"]] == [1, 2]
        assert all(r["failed"] and r["participants"] == [] for r in report["rounds"])
        assert report["rounds"][0]["reason"] == "no valid update"
        h = server.history
        assert h.participants(1) == [] and h.participants(2) == []
        for t in (2, 3):  # the model is unchanged, bit for bit
            assert all(torch.equal(h.global_model(t)[k], theta1[k]) for k in theta1)
        # resumable: a restarted server goes on after round 2, with the failed rows reloaded
        again = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        again.link.close()
        assert again.history.last_completed_round() == 2
        assert [r.get("failed") for r in again.rounds.log] == [True, True]


def test_a_failed_round_is_skipped_and_the_next_completes_with_the_robot(tmp_path):
    """One robot free-rides in round 1 (every attempt): round 1 is recorded as failed with the
    reason, round 2 completes with the same robot's honest update."""
    import threading

    import torch

    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.robot import RobotClient
    from scaleflu.testbed.server import EdgeServer

    cfg = _cfg(
        "testbed.rounds=2", "testbed.round_deadline_s=20", "testbed.max_round_retries=1",
        "testbed.refused_grace_s=0.2", "testbed.min_robots=1", "testbed.register_timeout_s=20",
        "testbed.eval_test_samples=50", "fl.local_epochs=1",
    )  # fmt: skip
    store = KeyStore.create([1, 2, 3])
    with MemoryChannel(seed=1) as ch:
        server = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        robot = RobotClient(
            ch.attach(1), 1, store.robots[1], cfg, server_public_key=store.public_key,
            faults=("free_ride",), fault_round=1,
        )  # fmt: skip
        out: dict = {}
        th = threading.Thread(target=lambda: out.update(robot.run(120)))
        th.start()
        try:
            report = server.run()
        finally:
            th.join(60)
    r1, r2 = report["rounds"]
    assert r1["failed"] and r1["participants"] == [] and "free_riding" in r1["reason"]
    assert [x["reason"] for x in report["rejections"] if x["round"] == 1] == ["free_riding"] * 2
    assert not r2.get("failed") and r2["participants"] == [1]
    h = server.history
    theta1, theta2, theta3 = (h.global_model(t) for t in (1, 2, 3))
    assert all(torch.equal(theta1[k], theta2[k]) for k in theta1)  # round 1: unchanged
    assert any(not torch.equal(theta2[k], theta3[k]) for k in theta2)  # round 2: trained
    assert h.participants(2) == [0]


def test_operator_interrupt_is_one_line_and_resumable(tmp_path, monkeypatch, capfd):
    """SIGTERM / Ctrl-C (the operator's request) ends the server with one line, status 130."""
    store = KeyStore.create([1, 2, 3])
    keys = store.save(tmp_path / "keys.json")

    class FakeLink:
        def close(self):
            pass

    class InterruptedServer:
        def __init__(self, *a, **k):
            pass

        def run(self):
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_link", lambda *a, **k: FakeLink())
    import scaleflu.testbed.server as server_mod

    monkeypatch.setattr(server_mod, "EdgeServer", InterruptedServer)
    rc = cli.server_main(["--keys", str(keys), "--run-dir", str(tmp_path / "run"), "--no-plots"])
    out = capfd.readouterr()
    text = out.out + out.err
    assert rc == 130 and "Traceback" not in text
    lines = [ln for ln in text.splitlines() if "interrupted" in ln]
    assert len(lines) == 1 and "keeps every completed round" in lines[0]


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS], ids=["disk_full", "read_only"])
def test_disk_fault_mid_run_ends_the_real_server_in_one_line_and_it_resumes(
    tmp_path, monkeypatch, capfd, err
):
    """The edge server app with two robots: the disk fails while round 2 is recorded. The app
    exits with one line and status 3; the history keeps round 1, and a restarted server (same
    identity, same folder) resumes after it."""
    import threading

    from scaleflu.fl.history import HistoryStore
    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.robot import RobotClient
    from scaleflu.testbed.server import EdgeServer

    overrides = [
        "data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=600",
        "data.test_subset=100", "testbed.unlearn.wait_s=0", "testbed.rounds=3",
        "testbed.round_deadline_s=20", "testbed.min_robots=2", "testbed.register_timeout_s=20",
        "testbed.eval_test_samples=50", "fl.local_epochs=1",
    ]  # fmt: skip
    cfg = _cfg(*overrides)
    store = KeyStore.create([1, 2])
    keys = store.save(tmp_path / "keys.json")
    run = tmp_path / "run"
    orig = HistoryStore.record_round

    def failing(self, t, *a, **k):
        if t == 2:
            raise OSError(err, os.strerror(err), str(self.dir / "updates_00002.safetensors"))
        return orig(self, t, *a, **k)

    monkeypatch.setattr(HistoryStore, "record_round", failing)
    with MemoryChannel(seed=2) as ch:
        monkeypatch.setattr(cli, "build_link", lambda *a, **k: ch.attach(SERVER_ID))
        robots = [
            RobotClient(ch.attach(r), r, store.robots[r], cfg, server_public_key=store.public_key)
            for r in (1, 2)
        ]
        threads = [threading.Thread(target=rb.run, args=(60,)) for rb in robots]
        for th in threads:
            th.start()
        rc = cli.server_main(
            ["--keys", str(keys), "--run-dir", str(run), "--no-plots", "--no-progress"]
            + [a for o in overrides for a in ("--set", o)]
        )
        for rb in robots:
            rb.done = True
        for th in threads:
            th.join(30)
    out = capfd.readouterr()
    text = out.out + out.err
    errors = [ln for ln in text.splitlines() if " ERROR " in ln]
    assert rc == 3 and "Traceback" not in text, text[-3000:]
    assert len(errors) == 1 and os.strerror(err) in errors[0] and "same --run-dir" in errors[0]
    monkeypatch.setattr(HistoryStore, "record_round", orig)
    with MemoryChannel(seed=3) as ch:
        again = EdgeServer(ch.attach(SERVER_ID), store.robots, cfg, run, False,
                           signing_key=store.signing_key)  # fmt: skip
        again.link.close()
    assert again.history.last_completed_round() == 1
    assert [r["round"] for r in again.rounds.log] == [1]
    assert again.history.participants(1) == [0, 1]
