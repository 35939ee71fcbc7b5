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
