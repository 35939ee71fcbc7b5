"""Key store, enrolment files, permissions, revocation, rotation, per-direction keys."""

from __future__ import annotations

import json
import os

import pytest

from scaleflu.keys import derive_key
from scaleflu.testbed.keys import Enrolment, KeyStore, load_keys
from scaleflu.testbed.protocol import (
    SERVER_ID,
    CounterSource,
    Envelope,
    MsgType,
    ProtocolError,
    ReplayGuard,
    open_envelope,
    seal,
)


def _upd(sender=1, receiver=SERVER_ID, session=5):
    return Envelope(MsgType.UPDATE, session, 1, sender, receiver, CounterSource().next(), {"a": 1})


def test_store_and_enrolment_files_are_private_and_minimal(tmp_path):
    store = KeyStore.create([1, 2, 3])
    p = store.save(tmp_path / "server.json")
    assert os.stat(p).st_mode & 0o777 == 0o600
    e = store.write_enrolment(2, tmp_path / "robot2.json")
    assert os.stat(e).st_mode & 0o777 == 0o600
    raw = json.loads(e.read_text())
    assert set(raw["robots"]) == {"2"} and "server_signing_key" not in raw  # only its own key
    got = Enrolment.load(e, 2)
    assert got.key == store.robots[2] and got.server_public_key == store.public_key
    with pytest.raises(ValueError, match="no key for robot 3"):
        Enrolment.load(e, 3)
    back = KeyStore.load(p)
    assert back.robots == store.robots and back.public_key == store.public_key
    # key bytes are never in what `scaleflu keys list` prints
    text = "\n".join(back.describe())
    assert all(k.hex() not in text for k in store.robots.values())


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_loose_key_files_are_refused(tmp_path, mode):
    store = KeyStore.create([1])
    p = store.save(tmp_path / "server.json")
    e = store.write_enrolment(1, tmp_path / "robot1.json")
    for path in (p, e):
        path.chmod(mode)
    with pytest.raises(PermissionError, match="chmod 600"):
        KeyStore.load(p)
    with pytest.raises(PermissionError, match="chmod 600"):
        Enrolment.load(e, 1)
    with pytest.raises(PermissionError):
        load_keys(p)


def test_revoked_robot_cannot_authenticate_and_rotation_kills_the_old_key(tmp_path):
    store = KeyStore.create([1, 2])
    old = store.robots[1]
    msg = seal(_upd(), old)
    open_envelope(msg, 1, store.robots, SERVER_ID, 5, ReplayGuard())
    store.rotate(1)
    with pytest.raises(ProtocolError, match="bad_auth"):
        open_envelope(seal(_upd(), old), 1, store.robots, SERVER_ID, 5, ReplayGuard())
    store.revoke(2)
    with pytest.raises(ProtocolError, match="unknown_sender"):
        open_envelope(seal(_upd(sender=2), old), 2, store.robots, SERVER_ID, 5, ReplayGuard())
    assert 2 in store.revoked and 2 not in store.robots
    with pytest.raises(ValueError, match="already enrolled"):
        store.enrol(1)
    store.enrol(2)
    assert 2 in store.robots and 2 not in store.revoked


def test_per_direction_keys_and_confidentiality():
    k = b"m" * 32
    up, down, link = derive_key(k, "up", 1), derive_key(k, "down", 1), derive_key(k, "link", 1)
    assert len({up, down, link, k, derive_key(k, "up", 2)}) == 5
    # a robot-to-server message cannot be reflected back to the robot as a server message
    data = seal(_upd(), k)
    assert b'"a":1' not in data  # meta is encrypted
    with pytest.raises(ProtocolError):
        open_envelope(data, SERVER_ID, {1: k}, 1, 5, ReplayGuard(), peer_of=1)


def test_keys_command_enrol_rotate_revoke_list(tmp_path, capsys):
    from scaleflu.cli import main

    store = tmp_path / "keys.json"
    out = tmp_path / "enr"
    assert (
        main(["keys", "enrol", "--store", str(store), "--robot", "1,2", "--out-dir", str(out)]) == 0
    )
    first = Enrolment.load(out / "robot1.json", 1).key
    assert (
        main(["keys", "rotate", "--store", str(store), "--robot", "1", "--out-dir", str(out)]) == 0
    )
    assert Enrolment.load(out / "robot1.json", 1).key != first
    assert main(["keys", "revoke", "--store", str(store), "--robot", "2"]) == 0
    loaded = KeyStore.load(store)
    assert set(loaded.robots) == {1} and loaded.revoked == [2]
    assert KeyStore.load(store).robots[1] == Enrolment.load(out / "robot1.json", 1).key
    printed = capsys.readouterr().out
    assert "robot 2: revoked" in printed and loaded.robots[1].hex() not in printed
    assert main(["keys", "rotate", "--store", str(store), "--robot", "9"]) == 2  # not enrolled
    store.chmod(0o644)
    assert main(["keys", "list", "--store", str(store)]) == 2  # loose mode refused


class _KeyedLink:
    def __init__(self):
        self.keys = {}

    def set_peer_key(self, peer, key):
        self.keys[peer] = key


def test_link_keys_match_between_server_and_robot_and_differ_per_robot():
    from scaleflu.testbed.common import install_link_keys

    store = KeyStore.create([1, 2, 3])
    srv = _KeyedLink()
    assert install_link_keys(srv, store.robots, SERVER_ID)
    for r in (1, 2, 3):
        rob = _KeyedLink()
        assert install_link_keys(rob, {r: store.robots[r]}, r)
        assert rob.keys == {SERVER_ID: srv.keys[r]}
        assert srv.keys[r] not in (store.robots[r], derive_key(store.robots[r], "up", r))
    assert len(set(srv.keys.values())) == 3
    assert not install_link_keys(object(), store.robots, SERVER_ID)  # no API: above-link only
