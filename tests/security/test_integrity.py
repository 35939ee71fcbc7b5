"""Integrity at rest: the server's history tensor files carry an authenticated digest."""

from __future__ import annotations

import pytest

from scaleflu.config import load_config
from scaleflu.fl.history import HistoryIntegrityError
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


def _server(ch, store, cfg, run_dir):
    return EdgeServer(
        ch.attach(SERVER_ID), store.robots, cfg, run_dir, False, signing_key=store.signing_key
    )


def test_tampered_or_foreign_history_is_refused_on_resume(tmp_path):
    cfg = load_config(None, OVERRIDES)
    store = KeyStore.create([1, 2, 3])
    with MemoryChannel(seed=0) as ch:
        a = _server(ch, store, cfg, tmp_path)
        path = a.history._global_path(1)
        assert path.is_file() and (path.parent / (path.name + ".mac")).is_file()
        a.link.close()
        # the same server identity resumes fine
        b = _server(ch, store, cfg, tmp_path)
        b.link.close()
        # one flipped byte in the stored model: refused with a clear error
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(HistoryIntegrityError, match="mismatch"):
            b.history.global_model(1)
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        assert b.history.global_model(1)
        # another server identity (another key) cannot vouch for this store
        other = KeyStore.create([1, 2, 3])
        c = _server(ch, other, cfg, tmp_path / "x")
        c.link.close()
        c.history.integrity_key = b"k" * 32
        with pytest.raises(HistoryIntegrityError):
            c.history.global_model(1)
        # a missing digest is refused too
        (path.parent / (path.name + ".mac")).unlink()
        with pytest.raises(HistoryIntegrityError, match="missing"):
            b.history.global_model(1)
