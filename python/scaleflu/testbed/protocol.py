"""Testbed protocol: encrypted, authenticated, replay-protected envelopes (server <-> robots).

Every message on the link is one envelope (big-endian)::

    off  size field
    0    4    magic b"SFTB"
    4    1    version (2)
    5    1    type (MsgType)
    6    2    flags (0)
    8    4    session (u32; 0 only in REGISTER)
    12   4    round (u32)
    16   2    sender id (0 = edge server, robots 1..65534)
    18   2    receiver id
    20   8    counter (u64, strictly increasing per sender; starts at the sender's clock in us)
    28   4    meta length J (plaintext)
    32   4    body length B (plaintext)
    36   12   AEAD nonce: the counter (8 bytes, as at offset 20) then 4 random bytes
    48   J+B+16  ChaCha20-Poly1305(direction key, nonce, meta || body, aad = bytes 0..47)

meta is a UTF-8 JSON object (control fields), body a scaleflu.link wire message (tensors) or empty;
both are encrypted, the header is authenticated as associated data. The robot's enrolment key
``K_r`` (32 random bytes, held by the server and by robot r only) is never used directly:
:func:`scaleflu.keys.derive_key` (HKDF-SHA256) gives one key per direction (``up``: robot -> server,
``down``: server -> robot) and one for the link layer (``link``). A receiver accepts an envelope
only when: it parses, the AEAD tag verifies under the direction key of the robot the message
concerns (the claimed sender on the server, itself on a robot), the link source equals the claimed
sender, the session is the current one (REGISTER: the session the server announced, so a REGISTER
recorded before a restart is refused as ``bad_session``), and the counter has not been accepted
before (replay window). Counters are committed only after the tag verified, so forged traffic cannot
advance them. Nothing is ever unpickled: meta is JSON, tensors use the versioned wire format.

**Nonces.** The AEAD nonce begins with the envelope's counter, so a nonce is used once per key.
After the tag verified, a message whose nonce is that of a counter already accepted from its
sender is refused as ``nonce_reuse`` (counted in :attr:`ReplayGuard.nonce_reuses`; the keystream
reused, the second message never processed), as is another message under a counter already
accepted; the same message again is a ``replay``; a nonce that names no counter of the sender
is ``bad_nonce``. The 4 random bytes after the counter keep two sender processes that start
with the same clock reading apart.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import secrets
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from scaleflu.fl.integrity import state_sha256 as state_sha256  # the digest, re-exported
from scaleflu.keys import KEY_BYTES, derive_key

log = logging.getLogger(__name__)

MAGIC = b"SFTB"
VERSION = 3  # 3: the AEAD nonce begins with the counter (2: random nonces)
HEADER = struct.Struct(">4sBBHIIHHQII")
HEADER_SIZE = HEADER.size  # 36
NONCE_SIZE = 12
NONCE_RANDOM = 4  # random bytes of a nonce after its 8-byte counter
TAG_SIZE = 16
MAC_SIZE = NONCE_SIZE + TAG_SIZE  # bytes an envelope adds to meta + body besides the header
MAX_META = 64 * 1024
SERVER_ID = 0
MAX_ROBOT_ID = 0xFFFE


def client_of(robot: int) -> int:
    """The FL client index of robot ``robot``: robot ids 1..N are clients 0..N-1 (0: server)."""
    return int(robot) - 1


def robot_of(client: int) -> int:
    """The robot id of FL client ``client`` (the inverse of :func:`client_of`)."""
    return int(client) + 1


class MsgType(enum.IntEnum):
    """Testbed message types."""

    REGISTER = 1  # robot -> server: join (meta: nonce, num_samples, model, version)
    REGISTER_ACK = 2  # server -> robot: session granted (meta: nonce echo, accepted, reason)
    SERVER_HELLO = 3  # server -> robot: a (re)started server announces its session
    MODEL = 4  # server -> robot: global model (full or delta; meta: purpose, sha256, deadline)
    UPDATE = 5  # robot -> server: local model after training (meta: num_samples, model_sha256)
    UNLEARN_REQUEST = 6  # robot -> server: forget me / my class / my samples
    UNLEARN_ACK = 7  # server -> robot: request accepted or refused (meta: reason)
    EVAL_REPORT = 8  # robot -> server: RA/FA/ASR of a deployed model (meta: metrics, sha256)
    REJECT = 9  # server -> robot: an update or request was refused (meta: reason)
    RESYNC = 10  # robot -> server: delta reference mismatch, send the full model next time
    BYE = 11  # server -> robot: the run is over
    # server -> robot: the signed erasure receipt of the robot's served request (meta:
    # receipt_version, request; body: the receipt's JSON text, scaleflu.unlearn.receipt)
    RECEIPT = 12


class ProtocolError(ValueError):
    """An envelope was refused; ``reason`` is a short machine-readable cause."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Envelope:
    """One protocol message (header fields, JSON meta, tensor body)."""

    type: MsgType
    session: int
    round: int
    sender: int
    receiver: int
    counter: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""


# ----------------------------------------------------------------------------- keys


def generate_keys(robot_ids: list[int]) -> dict[int, bytes]:
    """Fresh random 32-byte pre-shared keys for the given robots."""
    return {int(r): secrets.token_bytes(KEY_BYTES) for r in robot_ids}


def direction_of(sender: int, receiver: int) -> tuple[str, int]:
    """(direction, robot) of a message: ``down`` from the server, ``up`` from a robot."""
    return ("down", receiver) if sender == SERVER_ID else ("up", sender)


# ----------------------------------------------------------------------------- encoding


def seal(env: Envelope, key: bytes) -> bytes:
    """Serialise and encrypt an envelope under the direction key derived from ``key`` (K_r)."""
    meta = json.dumps(env.meta, separators=(",", ":"), allow_nan=False).encode()
    if len(meta) > MAX_META:
        raise ValueError(f"meta of {len(meta)} bytes exceeds {MAX_META}")
    head = HEADER.pack(
        MAGIC,
        VERSION,
        int(env.type),
        0,
        env.session & 0xFFFFFFFF,
        env.round & 0xFFFFFFFF,
        env.sender,
        env.receiver,
        env.counter,
        len(meta),
        len(env.body),
    )
    nonce = struct.pack(">Q", env.counter) + secrets.token_bytes(NONCE_RANDOM)
    direction, robot = direction_of(env.sender, env.receiver)
    aead = ChaCha20Poly1305(derive_key(key, direction, robot))
    return head + nonce + aead.encrypt(nonce, meta + bytes(env.body), head + nonce)


def peek(data: bytes) -> Envelope:
    """Parse an envelope's header without decrypting (meta and body are left empty)."""
    if len(data) < HEADER_SIZE + MAC_SIZE:
        raise ProtocolError("malformed", f"{len(data)} bytes is shorter than header + tag")
    magic, ver, mtype, flags, session, rnd, sender, receiver, counter, jlen, blen = (
        HEADER.unpack_from(data, 0)
    )
    if magic != MAGIC:
        raise ProtocolError("malformed", "bad magic")
    if ver != VERSION:
        raise ProtocolError("malformed", f"unsupported version {ver}")
    if flags:
        raise ProtocolError("malformed", f"unknown flags 0x{flags:04x}")
    try:
        t = MsgType(mtype)
    except ValueError:
        raise ProtocolError("malformed", f"unknown type {mtype}") from None
    if jlen > MAX_META or HEADER_SIZE + jlen + blen + MAC_SIZE != len(data):
        raise ProtocolError("malformed", "length fields do not match the message size")
    return Envelope(t, session, rnd, sender, receiver, counter, {}, b"")


def decrypt(data: bytes, env: Envelope, key: bytes) -> Envelope:
    """Decrypt and authenticate ``data`` (header parsed into ``env``) under K_r ``key``."""
    direction, robot = direction_of(env.sender, env.receiver)
    aead = ChaCha20Poly1305(derive_key(key, direction, robot))
    aad = bytes(data[: HEADER_SIZE + NONCE_SIZE])
    try:
        plain = aead.decrypt(aad[HEADER_SIZE:], bytes(data[HEADER_SIZE + NONCE_SIZE :]), aad)
    except InvalidTag:
        raise ProtocolError(
            "bad_auth", f"AEAD tag of a {env.type.name} claiming sender {env.sender}"
        ) from None
    jlen = HEADER.unpack_from(data, 0)[9]
    try:
        meta = json.loads(plain[:jlen].decode("utf-8")) if jlen else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("malformed", f"meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise ProtocolError("malformed", "meta is not a JSON object")
    env.meta, env.body = meta, bytes(plain[jlen:])
    return env


def now_counter() -> int:
    """The current wall clock in microseconds (counters start there, so restarts stay ahead)."""
    return time.time_ns() // 1000


class CounterSource:
    """Strictly increasing per-sender message counters seeded from the wall clock (thread-safe)."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        """The next counter: max(previous + 1, now in us)."""
        with self._lock:
            self._last = max(self._last + 1, now_counter())
            return self._last


class ReplayGuard:
    """Anti-replay window per peer (as in IPsec): each counter is accepted at most once.

    Counters above the highest one seen are new. Counters within ``window`` below it (the link
    may deliver concurrent messages out of order) are accepted once; older ones are refused.
    Counters are microseconds of the sender's clock, so ``window`` is 120 s by default. Each
    accepted counter keeps a digest of its message, so that a second message under a counter
    (and so a nonce) already used is told apart from a replay: ``nonce_reuse``, counted in
    :attr:`nonce_reuses`.
    """

    def __init__(self, window: int = 120_000_000) -> None:
        self.window = window
        self._max: dict[int, int] = {}
        self._seen: dict[int, dict[int, bytes]] = {}
        self.nonce_reuses = 0

    def check(self, peer: int, counter: int, digest: bytes | None = None) -> None:
        """Raise ProtocolError('replay') for a counter seen before or older than the window
        (``nonce_reuse`` when ``digest``, the message's, differs from the one accepted)."""
        top = self._max.get(peer, 0)
        seen = self._seen.get(peer, {})
        if counter in seen:
            if digest is not None and seen[counter] != digest:
                self.nonce_reuses += 1
                raise ProtocolError(
                    "nonce_reuse", f"another message under counter {counter} (its nonce)"
                )
            raise ProtocolError("replay", f"counter {counter} already accepted")
        if counter <= top - self.window or (counter <= top and peer not in self._seen):
            raise ProtocolError("replay", f"counter {counter} older than the replay window")

    def commit(self, peer: int, counter: int, digest: bytes = b"") -> None:
        """Record an accepted counter and its message's ``digest`` (call only after the AEAD
        tag verified)."""
        top = max(counter, self._max.get(peer, 0))
        self._max[peer] = top
        seen = self._seen.setdefault(peer, {})
        seen[counter] = digest
        if len(seen) > 4096:
            self._seen[peer] = {c: d for c, d in seen.items() if c > top - self.window}

    def accepted(self, peer: int, counter: int) -> bool:
        """Whether ``counter`` of ``peer`` was accepted (within the window kept)."""
        return counter in self._seen.get(peer, {})

    def last(self, peer: int) -> int:
        """Highest accepted counter of ``peer`` (0 when none)."""
        return self._max.get(peer, 0)


def open_envelope(
    data: bytes,
    src: int,
    key_of: Mapping[int, bytes],
    expect_receiver: int,
    session: int | None,
    guard: ReplayGuard,
    peer_of: int | None = None,
    max_skew_s: float = 300.0,
) -> Envelope:
    """Parse, authenticate and replay-check one received message; raise ProtocolError if refused.

    ``key_of`` maps the robot id whose key authenticates the message: on the server, the claimed
    sender; on a robot, its own id (``peer_of``). ``session`` is the current session (None: any
    session is accepted once authenticated: a robot learning a restarted server's session).
    """
    env = peek(data)
    robot = env.sender if peer_of is None else peer_of
    key = key_of.get(robot)
    if key is None:
        raise ProtocolError("unknown_sender", f"no key for robot {robot}")
    if (env.sender == SERVER_ID) == (env.receiver == SERVER_ID):
        raise ProtocolError("malformed", "exactly one end of a message is the server")
    env = decrypt(data, env, key)
    if env.sender != src:
        raise ProtocolError("sender_mismatch", f"claims {env.sender}, link source is {src}")
    if env.receiver != expect_receiver:
        raise ProtocolError("wrong_receiver", f"for {env.receiver}, this is {expect_receiver}")
    if env.type is MsgType.REGISTER and env.session == 0:
        # a robot without a session asks for the challenge; only SERVER_HELLO answers it
        skew = abs(env.counter / 1e6 - time.time())
        if skew > max_skew_s:
            raise ProtocolError("stale_register", f"session {env.session}, clock skew {skew:.0f}s")
    elif session is not None and env.session != session:
        raise ProtocolError("bad_session", f"session {env.session:#x}, current {session:#x}")
    (used,) = struct.unpack_from(">Q", data, HEADER_SIZE)
    if used != env.counter:  # authentic, but its nonce is not its own counter's
        if guard.accepted(env.sender, used):
            guard.nonce_reuses += 1
            raise ProtocolError("nonce_reuse", f"the nonce of counter {used}, already used")
        raise ProtocolError("bad_nonce", f"the nonce does not begin with counter {env.counter}")
    digest = hashlib.sha256(data).digest()[:16]
    guard.check(env.sender, env.counter, digest)
    guard.commit(env.sender, env.counter, digest)
    return env


# ----------------------------------------------------------------------------- tensors


def validate_update(
    update: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    max_norm: float | None = None,
) -> str | None:
    """Reason an uploaded local model is unusable (None when fine).

    Same tensor names, shapes and dtypes as the global model, all floating values finite, and
    (when ``max_norm`` is set) an update norm ``||local - global||_2`` at most ``max_norm``.
    """
    missing = sorted(set(reference) - set(update))
    extra = sorted(set(update) - set(reference))
    if missing or extra:
        return f"wrong_keys: missing {missing[:3]} extra {extra[:3]}"
    sq = 0.0
    for name, ref in reference.items():
        a = np.asarray(update[name])
        if a.shape != ref.shape:
            return f"wrong_shape: {name} {a.shape} != {ref.shape}"
        if a.dtype != ref.dtype:
            return f"wrong_dtype: {name} {a.dtype} != {ref.dtype}"
        if a.dtype.kind == "f":
            if not np.all(np.isfinite(a)):
                return f"non_finite: {name}"
            sq += float(np.sum((a.astype(np.float64) - ref.astype(np.float64)) ** 2))
    if max_norm is not None and sq**0.5 > max_norm:
        return f"norm: ||update|| {sq**0.5:.3g} > {max_norm}"
    return None
