"""A local fault (disk full, read-only folder) ends the edge server with one line and rc 3."""

from __future__ import annotations

import errno

import pytest

from scaleflu.testbed import cli
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


def test_failed_rounds_do_not_end_the_federation(tmp_path):
    """Rounds with no valid update are logged and retried; then the server reports, no exit."""
    from scaleflu.config import load_config
    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.server import EdgeServer

    cfg = load_config(
        None,
        [
            "data.num_clients=3", "fl.clients_per_round=3", "data.train_subset=600",
            "data.test_subset=100", "testbed.rounds=2", "testbed.round_deadline_s=0.5",
            "testbed.max_round_retries=2", "testbed.unlearn.wait_s=0",
        ],
    )  # fmt: skip
    store = KeyStore.create([1, 2, 3])
    with MemoryChannel(seed=0) as ch:
        server = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        server.wait_for_robots = lambda n, timeout: True  # nobody uploads anything
        report = server.run()
    failed = [e for e in report["events"] if e["event"] == "round_failed"]
    assert len(failed) == 3 and all(e["round"] == 1 for e in failed)
    assert any(e["event"] == "training_stopped" for e in report["events"])
    assert report["history_rounds"] == 0 and report["rounds"] == []
