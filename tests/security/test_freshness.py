"""Freshness of the history: a store put back from before an erasure is refused on open (the
edge server refuses to resume on it), with one line; a deliberate restore is recorded and
applies the erasure again. Integrity alone (the store's own digests) lets such a copy in."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from scaleflu.config import load_config
from scaleflu.fl.history import HistoryIntegrityError, HistoryRollbackError, HistoryStore
from scaleflu.fl.integrity import HistoryHeads, IntegrityError, heads_path, untrust
from scaleflu.keys import load_integrity_key, write_integrity_key
from scaleflu.link import MemoryChannel
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.server import EdgeServer
from scaleflu.testbed.sessions import RobotInfo
from scaleflu.unlearn.outputs import erase_history

OVERRIDES = [
    "data.num_clients=3",
    "fl.clients_per_round=3",
    "data.train_subset=600",
    "data.test_subset=100",
    "testbed.round_deadline_s=1",
    "testbed.send_timeout_s=1",
]


def _state(scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(scale * 100))
    return {"w": torch.randn(4, 3, generator=g) * scale, "b": torch.randn(3, generator=g)}


def _store(run: Path, key: bytes, heads: HistoryHeads | None) -> HistoryStore:
    """Two rounds of clients 0 and 1 (tiny tensors, no training)."""
    h = HistoryStore(run, groups={"w": [(0, 6), (6, 12)]}, integrity_key=key, heads=heads)
    h.record_initial(_state(1.0))
    for t in (1, 2):
        locals_ = {n: _state(1.0 + t + n) for n in (0, 1)}
        h.record_round(t, [0, 1], {0: 10, 1: 30}, locals_, _state(2.0 + t), {"test_acc": 0.5})
    return h


def _put_back(backup: Path, run: Path) -> None:
    shutil.rmtree(run / "history")
    shutil.copytree(backup, run / "history")


@pytest.fixture
def keyed(tmp_path):
    """A run with an integrity key file (0600) and the heads file beside it; client 0 erased
    after a copy of the whole store was taken."""
    key_file = write_integrity_key(tmp_path / "integrity.json")
    key = load_integrity_key(key_file)
    heads = HistoryHeads(heads_path(key_file), key)
    run = tmp_path / "run"
    _store(run, key, heads).close()
    backup = shutil.copytree(run / "history", tmp_path / "backup")
    with HistoryStore(run, integrity_key=key, heads=heads) as h:
        erased = erase_history(h, [0], "client:0", _state(9.0))
        assert h.client_rounds(0) == [] and erased["updates"] == 2
    return run, backup, key, heads, key_file


def test_store_put_back_from_before_an_erasure_is_refused(keyed):
    run, backup, key, heads, _ = keyed
    _put_back(backup, run)
    with pytest.raises(HistoryRollbackError) as exc:
        HistoryStore(run, integrity_key=key, heads=heads)
    text = str(exc.value)
    assert "\n" not in text
    assert "older copy" in text and "erasure of client(s) [0]" in text
    assert "scaleflu history restore" in text
    # the copy is genuine: its own digests pass, so integrity alone lets it in (the hole)
    with HistoryStore(run, integrity_key=key) as h:
        assert h.client_rounds(0) == [1, 2]  # the forgotten client's updates are back
    # and nothing was written to it while it was refused (it is still the copy)
    assert sorted(p.name for p in (run / "history").iterdir()) == sorted(
        p.name for p in backup.iterdir()
    )


def test_an_old_update_file_put_back_is_refused_when_loaded(keyed):
    run, backup, key, heads, _ = keyed
    with HistoryStore(run, integrity_key=key, heads=heads) as h:
        current = h._updates_path(1)
    assert current.name != "updates_00001.safetensors"  # the erasure wrote a new file
    # the old file under its old name: nothing names it, it is removed on open
    shutil.copy(backup / "updates_00001.safetensors", run / "history")
    with HistoryStore(run, integrity_key=key, heads=heads) as h:
        assert not (run / "history" / "updates_00001.safetensors").exists()
        assert set(h.client_updates(1)) == {1}
    # the old bytes under the current name: its SHA-256 is not the committed one
    shutil.copy(backup / "updates_00001.safetensors", current)
    with HistoryStore(run, integrity_key=key, heads=heads) as h:
        with pytest.raises(HistoryIntegrityError, match="put back from an older copy"):
            h.client_updates(1)


def test_a_forked_store_with_the_same_version_is_refused(keyed):
    run, backup, key, heads, _ = keyed
    signed = heads.get(json.loads(_meta(run, "store_id")))["version"]
    # the copy, moved forward by as many changes without the heads file: same version, other head
    fork = backup.parent / "fork"
    shutil.copytree(backup, fork / "history")
    with HistoryStore(fork, integrity_key=key) as h:
        while h.version < signed:
            h.replace_final(_state(float(h.version)))
    _put_back(fork / "history", run)
    with pytest.raises(HistoryRollbackError, match="a fork"):
        HistoryStore(run, integrity_key=key, heads=heads)


def _meta(run: Path, key: str) -> str:
    db = sqlite3.connect(run / "history" / "history.sqlite")
    try:
        return db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()[0]
    finally:
        db.close()


def test_deliberate_restore_is_recorded_and_erases_again(keyed, capsys):
    from scaleflu.cli import main

    run, backup, key, heads, key_file = keyed
    store_id = json.loads(_meta(run, "store_id"))
    signed = heads.get(store_id)["version"]
    _put_back(backup, run)
    base = ["history", "restore", "--run", str(run), "--keys", str(key_file)]
    with pytest.raises(SystemExit) as exit_:  # no acknowledgement, no restore
        main(base)
    assert exit_.value.code == 2
    untrust(run)
    assert main([*base, "--acknowledge", "disk replaced, backup of Monday"]) == 0
    out = capsys.readouterr().out
    assert "recorded with the reason 'disk replaced, backup of Monday'" in out
    assert "erasure applied again: client(s) [0] (client:0)" in out
    untrust(run)
    with HistoryStore(run, integrity_key=key, heads=heads) as h:  # opens normally now
        assert h.client_rounds(0) == [] and h.erased_clients() == {0}
        assert h.version > signed
        (restore,) = h.restores()
        assert restore["from_version"] < signed == restore["signed_version"]
        assert restore["reason"] == "disk replaced, backup of Monday"
    rec = heads.get(store_id)
    assert rec["restores"][0]["reason"] == "disk replaced, backup of Monday"
    assert main(["history", "status", "--run", str(run), "--keys", str(key_file)]) == 0
    out = capsys.readouterr().out
    assert "erased clients: [0]" in out and "restored: version" in out
    untrust(run)
    # a second restore has nothing to do
    assert main([*base, "--acknowledge", "again"]) == 0
    assert "nothing to restore" in capsys.readouterr().out
    untrust(run)


def test_the_heads_file_is_sealed(keyed):
    run, _, key, heads, _ = keyed
    data = json.loads(heads.path.read_text())
    sid = next(iter(data["stores"]))
    data["stores"][sid]["version"] = 1  # move the record back by hand
    heads.path.write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="heads file fails its seal"):
        HistoryStore(run, integrity_key=key, heads=heads)


def test_edge_server_refuses_to_resume_on_a_store_put_back_after_an_erasure(
    tmp_path, capfd, monkeypatch
):
    """The server app's path: its history (rounds recorded, a client request served by the
    real unlearning service: erasure and receipt), the whole history folder copied before the
    request and put back after it; the server app refuses to resume (one line, status 2)."""
    from scaleflu.cli import testbed as cli
    from scaleflu.testbed.unlearn_service import RobotRequest
    from scaleflu.testbed.validation import UnlearnMeta
    from testbed_helpers import halve_unlearn

    cfg = load_config(None, OVERRIDES)
    store = KeyStore.create([1, 2, 3])
    keys = store.save(tmp_path / "keys.json")
    run = tmp_path / "run"

    def server(ch):
        return EdgeServer(
            ch.attach(SERVER_ID),
            store.robots,
            cfg,
            run,
            False,
            halve_unlearn,
            signing_key=store.signing_key,
            heads=heads_path(keys),
        )

    with MemoryChannel(seed=0) as ch:
        s = server(ch)
        g = s.history.final_model()
        for t in (1, 2):  # two rounds as the Rounds part records them (no training here)
            local = {n: {k: v + 0.01 * (n + t) for k, v in g.items()} for n in (0, 1, 2)}
            new = {k: v + 0.01 * t for k, v in g.items()}
            s.history.record_round(t, [0, 1, 2], {0: 200, 1: 200, 2: 200}, local, new)
        s.link.close()
    backup = shutil.copytree(run / "history", tmp_path / "backup")
    with MemoryChannel(seed=1) as ch:  # robot 1 asks to be forgotten; the service serves it
        s = server(ch)
        s.sessions.robots[1] = RobotInfo(1)
        meta = {"robot": 1, "kind": "client"}
        done = s.unlearning.serve(RobotRequest.of(UnlearnMeta.parse(meta, 10)))
        assert done["erasure"]["updates"] == 2 and done["receipt"]["history_version"] > 0
        assert s.history.client_rounds(0) == []
        s.link.close()
    _put_back(backup, run)
    untrust(run)
    with MemoryChannel(seed=2) as ch:
        monkeypatch.setattr(cli, "build_link", lambda *a, **k: ch.attach(SERVER_ID))
        rc = cli.server_main(
            ["--keys", str(keys), "--run-dir", str(run), "--no-plots", "--no-progress"]
            + [a for o in OVERRIDES for a in ("--set", o)]
        )
    text = capfd.readouterr()
    text = text.out + text.err
    errors = [ln for ln in text.splitlines() if "ERROR" in ln]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert "refuses the run folder" in errors[0] and "erasure of client(s) [0]" in errors[0]
    untrust(run)
