"""Fast unit tests of the testbed protocol: HMAC, replay window, update validation, messages."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from scaleflu.testbed.common import decode_state, encode_state
from scaleflu.testbed.keys import load_keys, save_keys
from scaleflu.testbed.protocol import (
    SERVER_ID,
    CounterSource,
    Envelope,
    MsgType,
    ProtocolError,
    ReplayGuard,
    generate_keys,
    open_envelope,
    peek,
    seal,
    state_sha256,
    validate_update,
)

KEYS = {1: b"k" * 32, 2: b"q" * 32}
SESSION = 0x1234


def _env(mtype=MsgType.UPDATE, sender=1, counter=None, session=SESSION, meta=None, body=b""):
    return Envelope(
        mtype, session, 3, sender, SERVER_ID, counter or CounterSource().next(), meta or {}, body
    )


def _open(data, src=1, guard=None, session=SESSION):
    return open_envelope(data, src, KEYS, SERVER_ID, session, guard or ReplayGuard())


def test_seal_and_open_roundtrip():
    body = encode_state({"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    data = seal(_env(meta={"num_samples": 5}, body=body), KEYS[1])
    env = _open(data)
    assert env.type is MsgType.UPDATE and env.round == 3 and env.meta == {"num_samples": 5}
    assert np.array_equal(decode_state(env.body)["w"], np.arange(6).reshape(2, 3))


@pytest.mark.parametrize("pos", [0, 5, 9, 20, 40, -1])
def test_any_flipped_byte_is_refused(pos):
    data = bytearray(seal(_env(meta={"a": 1}, body=b"xyz"), KEYS[1]))
    data[pos] ^= 0x01
    with pytest.raises(ProtocolError) as exc:
        _open(bytes(data))
    assert exc.value.reason in ("bad_auth", "malformed", "unknown_sender")


def test_forged_sender_and_wrong_key():
    # robot 2 claims to be robot 1, sealing with its own key
    with pytest.raises(ProtocolError, match="bad_auth"):
        _open(seal(_env(sender=1), KEYS[2]), src=2)
    # a correctly sealed message from robot 1 that arrives from link node 2
    with pytest.raises(ProtocolError, match="sender_mismatch"):
        _open(seal(_env(sender=1), KEYS[1]), src=2)
    with pytest.raises(ProtocolError, match="unknown_sender"):
        _open(seal(_env(sender=7), KEYS[1]), src=7)


def test_replay_and_duplicates_refused():
    guard = ReplayGuard()
    data = seal(_env(counter=1_000_000_000), KEYS[1])
    _open(data, guard=guard)
    with pytest.raises(ProtocolError, match="replay"):
        _open(data, guard=guard)
    # out-of-order delivery inside the window is fine, once
    older = seal(_env(counter=999_000_000), KEYS[1])
    _open(older, guard=guard)
    with pytest.raises(ProtocolError, match="replay"):
        _open(older, guard=guard)
    ancient = seal(_env(counter=1_000_000_000 - guard.window - 1), KEYS[1])
    with pytest.raises(ProtocolError, match="replay"):
        _open(ancient, guard=guard)


def test_forged_traffic_does_not_advance_counters():
    guard = ReplayGuard()
    forged = seal(_env(counter=2**62), KEYS[2])  # claims robot 1, wrong key
    with pytest.raises(ProtocolError):
        _open(forged, guard=guard)
    assert guard.last(1) == 0
    _open(seal(_env(), KEYS[1]), guard=guard)


def test_session_and_register_freshness():
    with pytest.raises(ProtocolError, match="bad_session"):
        _open(seal(_env(session=99), KEYS[1]))
    fresh = seal(_env(MsgType.REGISTER, session=0), KEYS[1])
    assert _open(fresh).type is MsgType.REGISTER
    stale = seal(
        _env(MsgType.REGISTER, session=0, counter=(time.time_ns() // 1000) - 10**9), KEYS[1]
    )
    with pytest.raises(ProtocolError, match="stale_register"):
        _open(stale)


def test_malformed_packets_raise_protocol_error_only():
    rng = np.random.default_rng(0)
    good = seal(_env(meta={"x": [1, 2]}, body=b"abc"), KEYS[1])
    samples = [b"", b"SFTB", bytes(100), good[:-1], good + b"\0", good[:40]]
    samples += [rng.bytes(int(n)) for n in rng.integers(1, 400, 50)]
    for data in samples:
        with pytest.raises(ProtocolError):
            _open(data)
    # valid HMAC but meta that is not a JSON object
    hdr = bytearray(seal(_env(), KEYS[1]))
    assert peek(bytes(hdr)).meta == {}


def test_counters_strictly_increase():
    c = CounterSource()
    vals = [c.next() for _ in range(1000)]
    assert all(b > a for a, b in zip(vals, vals[1:], strict=False))
    assert abs(vals[0] / 1e6 - time.time()) < 5


def test_validate_update_reasons():
    ref = {"w": np.zeros((2, 3), np.float32), "n": np.zeros((), np.int64)}
    ok = {"w": np.ones((2, 3), np.float32), "n": np.zeros((), np.int64)}
    assert validate_update(ok, ref) is None
    nan = {**ok, "w": np.full((2, 3), np.nan, np.float32)}
    inf = {**ok, "w": np.full((2, 3), np.inf, np.float32)}
    assert validate_update(nan, ref).startswith("non_finite")
    assert validate_update(inf, ref).startswith("non_finite")
    assert validate_update({**ok, "w": np.ones((3, 2), np.float32)}, ref).startswith("wrong_shape")
    assert validate_update({**ok, "w": np.ones((2, 3), np.float64)}, ref).startswith("wrong_dtype")
    assert validate_update({"w": ok["w"]}, ref).startswith("wrong_keys")
    assert validate_update({**ok, "x": ok["w"]}, ref).startswith("wrong_keys")
    assert validate_update(ok, ref, max_norm=1.0).startswith("norm")


def test_state_sha256_sensitive_to_every_bit():
    a = {"w": np.arange(10, dtype=np.float32), "b": np.ones(3, np.float32)}
    h = state_sha256(a)
    assert h == state_sha256({k: v.copy() for k, v in reversed(a.items())})
    b = {k: v.copy() for k, v in a.items()}
    b["w"].view(np.uint32)[3] ^= 1
    assert state_sha256(b) != h
    assert state_sha256({**a, "w": a["w"].reshape(2, 5)}) != h


def test_delta_broadcast_is_bit_exact():
    rng = np.random.default_rng(1)
    ref = {"a": rng.standard_normal(1000).astype(np.float32), "b": np.zeros(16, np.float32)}
    new = {k: v.copy() for k, v in ref.items()}
    new["a"][:10] += 1.0
    body = encode_state(new, "raw", reference=ref, groups=8)
    full = encode_state(new, "raw")
    assert len(body) < len(full) / 4
    assert state_sha256(decode_state(body, reference=ref)) == state_sha256(new)


def test_key_file_roundtrip(tmp_path):
    keys = generate_keys([1, 2, 3])
    assert len({k.hex() for k in keys.values()}) == 3
    path = save_keys(keys, tmp_path / "keys.json")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert load_keys(path) == keys
    (tmp_path / "bad.json").write_text(json.dumps({"robots": {"1": "abcd"}}))
    (tmp_path / "bad.json").chmod(0o600)
    with pytest.raises(ValueError, match="shorter"):
        load_keys(tmp_path / "bad.json")
