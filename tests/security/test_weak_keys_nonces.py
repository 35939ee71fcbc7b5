"""Weak robot keys are refused (with the key file and the fix), and an AEAD nonce a sender has
used is refused the second time (``nonce_reuse``, counted), whatever counter it comes with."""

from __future__ import annotations

import json
import random
import secrets
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from scaleflu.keys import WeakKeyError, derive_key, weak_key_reason
from scaleflu.link import MemoryChannel
from scaleflu.testbed.keys import Enrolment, KeyStore, load_keys, save_keys
from scaleflu.testbed.protocol import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    SERVER_ID,
    VERSION,
    CounterSource,
    Envelope,
    MsgType,
    ProtocolError,
    ReplayGuard,
    open_envelope,
    seal,
)

WEAK = {
    "all_zero": bytes(32),
    "repeated_byte": b"\xab" * 32,
    "pattern": bytes(range(4)) * 8,
    "short": secrets.token_bytes(16),
    "few_values": bytes(random.Random(0).choices(range(6), k=32)),  # 6 byte values
}


@pytest.mark.parametrize("name", sorted(WEAK))
def test_weak_robot_keys_are_refused_in_every_file_naming_the_file_and_the_fix(tmp_path, name):
    weak = WEAK[name]
    why = weak_key_reason(weak)
    assert why is not None
    if name == "few_values":
        assert "distinct" in why
    store = KeyStore.create([1, 2])
    store.robots[2] = weak  # as an old enrolment or a hand-edited store would hold it
    path = store.save(tmp_path / "keys.json")
    with pytest.raises(WeakKeyError) as exc:
        KeyStore.load(path)
    msg = str(exc.value)
    assert str(path) in msg and "robot 2" in msg and "scaleflu keys rotate" in msg
    assert weak.hex() not in msg  # the key itself is never printed
    enr = store.write_enrolment(2, tmp_path / "robot2.json")
    with pytest.raises(WeakKeyError, match="robot2.json.*scaleflu keys rotate"):
        Enrolment.load(enr, 2)
    with pytest.raises(WeakKeyError, match="robot 2"):
        load_keys(save_keys({2: weak}, tmp_path / "robots.json"))


def test_the_fix_works_rotate_reads_the_weak_store_and_replaces_the_key(tmp_path, capsys):
    from scaleflu.cli import main

    store = KeyStore.create([1, 2])
    store.robots[2] = bytes(32)
    path = store.save(tmp_path / "keys.json")
    assert main(["keys", "list", "--store", str(path)]) == 0
    assert "robot 2: enrolled" in capsys.readouterr().out.replace("\n", " ")
    out = tmp_path / "enr"
    assert (
        main(["keys", "rotate", "--store", str(path), "--robot", "2", "--out-dir", str(out)]) == 0
    )
    fixed = KeyStore.load(path)  # no longer refused
    assert weak_key_reason(fixed.robots[2]) is None
    assert fixed.robots[1] == store.robots[1]
    assert Enrolment.load(out / "robot2.json", 2).key == fixed.robots[2]


def test_weak_keys_given_to_the_server_or_a_robot_in_code_are_refused():
    from scaleflu.config import load_config
    from scaleflu.testbed.robot import RobotClient
    from scaleflu.testbed.sessions import Sessions

    with MemoryChannel() as ch:
        with pytest.raises(WeakKeyError, match="robot 3"):
            Sessions(ch.attach(0), {3: bytes(32)}, None, None, None, None, None, {})  # type: ignore[arg-type]
        with pytest.raises(WeakKeyError, match="robot 1"):
            RobotClient(ch.attach(1), 1, b"\x07" * 32, load_config(None, []))


def test_random_keys_are_never_weak():
    assert all(weak_key_reason(secrets.token_bytes(32)) is None for _ in range(2000))
    assert all(
        weak_key_reason(k) is None for k in KeyStore.create(list(range(1, 50))).robots.values()
    )


# --------------------------------------------------------------------------- nonces


def _seal_with_nonce(env: Envelope, key: bytes, nonce: bytes) -> bytes:
    """An envelope sealed exactly as ``seal`` does, but with a nonce the sender chose."""
    meta = json.dumps(env.meta, separators=(",", ":")).encode()
    head = HEADER.pack(MAGIC, VERSION, int(env.type), 0, env.session, env.round, env.sender,
                       env.receiver, env.counter, len(meta), len(env.body))  # fmt: skip
    aead = ChaCha20Poly1305(derive_key(key, "up", env.sender))
    return head + nonce + aead.encrypt(nonce, meta + env.body, head + nonce)


def _upd(counter: int, meta: dict) -> Envelope:
    return Envelope(MsgType.UPDATE, 5, 1, 1, SERVER_ID, counter, meta)


def test_a_reused_nonce_is_refused_and_counted_whatever_its_counter():
    key = secrets.token_bytes(32)
    keys = {1: key}
    guard = ReplayGuard()
    c = CounterSource()
    first = seal(_upd(c.next(), {"a": 1}), key)
    got = open_envelope(first, 1, keys, SERVER_ID, 5, guard)
    assert got.meta == {"a": 1}
    nonce = first[HEADER_SIZE : HEADER_SIZE + 12]
    # an enrolled robot (it holds the key) seals another message under the same nonce, with a
    # fresh counter: authentic, but the keystream is reused; it is never processed
    second = _seal_with_nonce(_upd(c.next(), {"a": 2}), key, nonce)
    with pytest.raises(ProtocolError) as exc:
        open_envelope(second, 1, keys, SERVER_ID, 5, guard)
    assert exc.value.reason == "nonce_reuse"
    # ... and under the same counter as well (its nonce is then its own)
    third = _seal_with_nonce(_upd(got.counter, {"a": 3}), key, nonce)
    with pytest.raises(ProtocolError) as exc:
        open_envelope(third, 1, keys, SERVER_ID, 5, guard)
    assert exc.value.reason == "nonce_reuse"
    assert guard.nonce_reuses == 2
    # the same message again is a replay, not a reuse
    with pytest.raises(ProtocolError, match="replay"):
        open_envelope(first, 1, keys, SERVER_ID, 5, guard)
    assert guard.nonce_reuses == 2
    # a nonce that names no counter of the sender is refused too
    odd = _seal_with_nonce(_upd(c.next(), {"a": 4}), key, secrets.token_bytes(12))
    with pytest.raises(ProtocolError, match="bad_nonce"):
        open_envelope(odd, 1, keys, SERVER_ID, 5, guard)
    # fresh messages still pass
    assert open_envelope(seal(_upd(c.next(), {"a": 5}), key), 1, keys, SERVER_ID, 5, guard)


def test_nonces_begin_with_the_counter():
    key = secrets.token_bytes(32)
    env = _upd(CounterSource().next(), {})
    data = seal(env, key)
    assert struct.unpack_from(">Q", data, HEADER_SIZE)[0] == env.counter
