"""Integrity at rest: the history store's SQLite metadata and tensor files,
the final model, the unlearning output model and the served unlearned model carry an
authenticated digest (HMAC-SHA256 under a key only the server holds), checked on load; a
tampered store or model is refused with a one-line error; loose key files are refused."""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from scaleflu.config import load_config
from scaleflu.fl.history import HistoryIntegrityError, HistoryStore
from scaleflu.fl.integrity import IntegrityError, load_model, mac_path, save_model, trust, untrust
from scaleflu.keys import history_key, load_integrity_key, write_integrity_key
from scaleflu.link import MemoryChannel
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.server import EdgeServer

OVERRIDES = [
    "data.num_clients=3",
    "fl.clients_per_round=3",
    "data.train_subset=600",
    "data.test_subset=100",
]
KEY = bytes(range(32))


def _server(ch, store, cfg, run_dir):
    return EdgeServer(
        ch.attach(SERVER_ID), store.robots, cfg, run_dir, False, signing_key=store.signing_key
    )


def _flip(path, at=-1):
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _state(scale: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(int(scale * 100))
    return {"w": torch.randn(4, 3, generator=g) * scale, "b": torch.randn(3, generator=g)}


def _store(run_dir, key=KEY) -> HistoryStore:
    """A store with two rounds of clients 0 and 1 (tiny tensors, no training)."""
    h = HistoryStore(run_dir, groups={"w": [(0, 6), (6, 12)]}, integrity_key=key)
    h.record_initial(_state(1.0))
    for t in (1, 2):
        locals_ = {n: _state(1.0 + t + n) for n in (0, 1)}
        h.record_round(t, [0, 1], {0: 10, 1: 30}, locals_, _state(2.0 + t), {"test_acc": 0.5})
    return h


def test_tampered_or_foreign_history_tensor_file_is_refused(tmp_path):
    cfg = load_config(None, OVERRIDES)
    store = KeyStore.create([1, 2, 3])
    with MemoryChannel(seed=0) as ch:
        a = _server(ch, store, cfg, tmp_path)
        path = a.history._global_path(1)
        # the file's SHA-256 is in the authenticated metadata (no sidecar to swap with it)
        assert path.is_file() and not mac_path(path).exists()
        a.link.close()
        # the same server identity resumes fine
        b = _server(ch, store, cfg, tmp_path)
        b.link.close()
        path = b.history._global_path(1)  # written again at the resume (no round yet)
        # one flipped byte in the stored model: refused with a clear error
        _flip(path)
        with pytest.raises(HistoryIntegrityError, match="fails its authenticated digest"):
            b.history.global_model(1)
        _flip(path)
        assert b.history.global_model(1)
        # another server identity (another key) cannot open this store at all: its metadata
        # digest was made under this server's key
        other = KeyStore.create([1, 2, 3])
        with pytest.raises(HistoryIntegrityError, match="metadata"):
            _server(ch, other, cfg, tmp_path)
        # a missing file is refused too
        path.unlink()
        with pytest.raises(HistoryIntegrityError, match="is missing"):
            b.history.global_model(1)
    untrust(tmp_path)


@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE rounds SET participants = '[0, 1]' WHERE round = 1",  # re-add the erased client
        "UPDATE rounds SET data_sizes = '{\"1\": 1}' WHERE round = 2",  # re-weight a client
        "DELETE FROM rounds WHERE round = 2",  # roll the store back a round
        "DELETE FROM erased",  # hide that a client was erased
        "UPDATE meta SET value = '1' WHERE key = 'keep_rounds'",  # drop updates on next write
        "UPDATE group_change SET max_abs = 0 WHERE round = 1",  # hide updates from the AoI
        "DELETE FROM group_change WHERE round = 2",
        "DELETE FROM integrity",  # remove the digest itself
        "DELETE FROM integrity WHERE id = 2",  # or the group_change chain
    ],
    ids=[
        "participants",
        "data_sizes",
        "rollback",
        "erasure_log",
        "settings",
        "aoi_changes",
        "aoi_round_dropped",
        "digest_removed",
        "chain_removed",
    ],  # fmt: skip
)
def test_tampered_history_metadata_is_refused_on_open(tmp_path, edit):
    h = _store(tmp_path)
    h.erase_clients([0], reason="client:0")  # every writer keeps the digest current
    h.replace_final(_state(9.0))
    h.close()
    with HistoryStore(tmp_path, integrity_key=KEY) as ok:  # untouched: opens
        assert ok.participants(1) == [1] and ok.erased_clients() == {0}
        files = sorted(p.name for p in ok.dir.glob("*.safetensors"))
    db = sqlite3.connect(tmp_path / "history" / "history.sqlite")
    with db:
        db.execute(edit)
    db.close()
    with pytest.raises(HistoryIntegrityError, match="history metadata") as exc:
        HistoryStore(tmp_path, integrity_key=KEY)
    assert "\n" not in str(exc.value)
    # refused before anything was cleaned up: no file of the store was removed
    assert sorted(p.name for p in (tmp_path / "history").glob("*.safetensors")) == files
    # without a key the store is not checked (tools that were not given it)
    HistoryStore(tmp_path).close()


def test_store_written_without_a_key_or_under_another_is_refused(tmp_path):
    _store(tmp_path / "a", key=None).close()
    with pytest.raises(HistoryIntegrityError, match="no authenticated digest"):
        HistoryStore(tmp_path / "a", integrity_key=KEY)
    _store(tmp_path / "b").close()
    with pytest.raises(HistoryIntegrityError, match="another key"):
        HistoryStore(tmp_path / "b", integrity_key=b"x" * 32)
    # a fresh store gets its digest when the key is set, and keeps it
    trust(tmp_path / "c", KEY)
    try:
        _store(tmp_path / "c", key=None).close()  # the trusted key applies
        with HistoryStore(tmp_path / "c", integrity_key=KEY) as h:
            assert h.last_completed_round() == 2
            assert torch.equal(h.final_model()["w"], _state(4.0)["w"])
    finally:
        untrust(tmp_path / "c")


def test_saved_models_carry_a_digest_checked_on_load(tmp_path):
    state = _state(3.0)
    path = save_model(state, tmp_path / "m" / "model.safetensors", KEY)
    got = load_model(path, KEY)
    assert all(torch.equal(got[k], state[k]) for k in state)
    _flip(path)
    with pytest.raises(IntegrityError, match="model fails its authenticated digest"):
        load_model(path, KEY)
    _flip(path)
    with pytest.raises(IntegrityError, match="another key"):
        load_model(path, b"y" * 32)
    # a model written under a trusted folder gets its digest without being told the key
    trust(tmp_path / "run", KEY)
    try:
        p2 = save_model(state, tmp_path / "run" / "unlearn" / "x" / "model.safetensors")
        assert mac_path(p2).is_file()
        mac_path(p2).unlink()
        with pytest.raises(IntegrityError, match="no authenticated digest"):
            load_model(p2)
    finally:
        untrust(tmp_path / "run")


def test_integrity_key_files_must_be_private(tmp_path):
    path = write_integrity_key(tmp_path / "integrity.json")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(load_integrity_key(path)) == 32
    store = KeyStore.create([1])
    sp = store.save(tmp_path / "keys.json")
    assert load_integrity_key(sp) == history_key(store.signing_key)  # as the server derives it
    for p in (path, sp):
        p.chmod(0o640)
        with pytest.raises(PermissionError, match="chmod 600"):
            load_integrity_key(p)
    (tmp_path / "bad.json").write_text('{"integrity_key": "00"}')
    (tmp_path / "bad.json").chmod(0o600)
    with pytest.raises(ValueError, match="no server_signing_key and no integrity_key"):
        load_integrity_key(tmp_path / "bad.json")


def test_server_app_refuses_a_tampered_run_folder_in_one_line(tmp_path, capfd, monkeypatch):
    from scaleflu.cli import testbed as cli

    cfg = load_config(None, OVERRIDES)
    store = KeyStore.create([1, 2, 3])
    keys = store.save(tmp_path / "keys.json")
    run = tmp_path / "run"
    with MemoryChannel(seed=0) as ch:
        _server(ch, store, cfg, run).link.close()
    untrust(run)
    db = sqlite3.connect(run / "history" / "history.sqlite")
    with db:
        db.execute("UPDATE meta SET value = 'null' WHERE key = 'initial_link_s'")
    db.close()
    with MemoryChannel(seed=0) as ch:
        monkeypatch.setattr(cli, "build_link", lambda *a, **k: ch.attach(SERVER_ID))
        rc = cli.server_main(
            ["--keys", str(keys), "--run-dir", str(run), "--no-plots", "--no-progress"]
            + [a for o in OVERRIDES for a in ("--set", o)]
        )
    out = capfd.readouterr()
    text = out.out + out.err
    errors = [ln for ln in text.splitlines() if "ERROR" in ln]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in text, text
    assert "refuses the run folder" in errors[0] and "history metadata" in errors[0]
    untrust(run)


def test_train_and_unlearn_commands_sign_and_check(tmp_path, capfd):
    """`scaleflu train --keys` and `scaleflu unlearn --keys`: outputs carry digests; a run
    whose final model or history was edited is refused (status 2, one line)."""
    from scaleflu.cli import main

    key = write_integrity_key(tmp_path / "integrity.json")
    run = tmp_path / "run"
    common = [
        "--set", "data.num_clients=2", "--set", "fl.clients_per_round=2",
        "--set", "data.train_subset=300", "--set", "data.test_subset=100",
        "--set", "fl.rounds=2", "--set", "fl.local_epochs=1", "--set", "fl.threads=1",
    ]  # fmt: skip
    assert main(["train", "--out", str(run), "--keys", str(key), "--no-progress", *common]) == 0
    assert mac_path(run / "model.safetensors").is_file()
    out = tmp_path / "un"
    argv = ["unlearn", "--run", str(run), "--request", "client:0", "--method", "retrain",
            "--keys", str(key), "--out", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    k = load_integrity_key(key)
    assert load_model(out / "model.safetensors", k)  # the output model is signed
    untrust(run)
    capfd.readouterr()
    _flip(run / "model.safetensors")
    argv.append("--force")  # the same --out again: the refusal below is the run's, not the folder's
    assert main(argv) == 2
    err = capfd.readouterr()
    assert "refused:" in err.out + err.err and "model.safetensors" in err.out + err.err
    _flip(run / "model.safetensors")
    untrust(run)
    key.chmod(0o644)
    assert main(argv) == 2
    err = capfd.readouterr()
    assert "chmod 600" in err.out + err.err
    untrust(run)


def test_keys_integrity_command_writes_a_private_key_once(tmp_path, capsys):
    from scaleflu.cli import main

    path = tmp_path / "integrity.json"
    assert main(["keys", "integrity", "--store", str(path)]) == 0
    assert os.stat(path).st_mode & 0o777 == 0o600
    key = load_integrity_key(path)
    out = capsys.readouterr().out
    assert key.hex() not in out and "integrity key" in out  # a fingerprint, never the key
    assert main(["keys", "integrity", "--store", str(path)]) == 2  # never overwritten
    assert load_integrity_key(path) == key
