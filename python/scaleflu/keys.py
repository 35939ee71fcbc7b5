"""Key files, key derivation and the integrity key of a run (used by fl, unlearn and testbed).

A key file is a JSON object, written atomically with mode 0600 (:func:`write_key_file`) and
refused when its group or others may read or write it (:func:`read_key_file`). Key bytes are
never logged; :func:`fingerprint` names a key without revealing it.

The **integrity key** authenticates a run folder's stored history and models
(:mod:`scaleflu.fl.integrity`). :func:`load_integrity_key` reads it from either kind of file:

* an integrity key file ``{"integrity_key": "<hex, >= 16 bytes>"}``
  (:func:`write_integrity_key`, ``scaleflu keys integrity``), for runs outside the testbed;
* a testbed server's store (``keys.json``, :class:`scaleflu.testbed.keys.KeyStore`): the key is
  :func:`history_key` of its Ed25519 signing key, so ``scaleflu unlearn --keys keys.json``
  checks a testbed run exactly as its server does.

:func:`derive_key` (HKDF-SHA256) derives every working key from a master key: the testbed's
per-direction message keys and link keys from a robot's key, the history key from the server's
signing key.

**Erasure receipts** (:mod:`scaleflu.unlearn.receipt`) are signed with an Ed25519 key:
:func:`receipt_signer` gives the testbed server's own signing key from its store, or, for an
integrity key file, an Ed25519 key derived from that key (``HKDF(key, "receipt")``);
:func:`receipt_public_key` gives the key that checks them from any of the three files (a robot's
enrolment file holds the server's public key).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

KEY_BYTES = 32
MIN_KEY_BYTES = 16  # the shortest key a link accepts (ArqEndpoint.set_peer_key)
MIN_DISTINCT_BYTES = 8  # 32 random bytes have about 30 distinct values; fewer than 8 is made up
HKDF_SALT = b"scaleflu-testbed-v2"


class WeakKeyError(ValueError):
    """A key that is too short or has a pattern: never generated at random, so guessable."""


def weak_key_reason(key: bytes, min_bytes: int = KEY_BYTES) -> str | None:
    """Why ``key`` is weak (None: it is not): shorter than ``min_bytes``, every byte the same,
    a short pattern repeated, or fewer than :data:`MIN_DISTINCT_BYTES` distinct byte values.

    Keys made by :func:`secrets.token_bytes` (every key this project writes) are never weak:
    32 random bytes repeat a pattern or use fewer than 8 distinct values with a probability
    far below 2**-100.
    """
    key = bytes(key)
    n = len(key)
    if n < min_bytes:
        return f"{n} bytes, shorter than {min_bytes}"
    if len(set(key)) == 1:
        return f"all {n} bytes are 0x{key[0]:02x}"
    for period in range(2, n // 2 + 1):
        if key == (key[:period] * (n // period + 1))[:n]:
            return f"a {period}-byte pattern repeated"
    distinct = len(set(key))
    if distinct < MIN_DISTINCT_BYTES:
        return f"only {distinct} distinct byte values"
    return None


def check_key(key: bytes, what: str, fix: str, min_bytes: int = KEY_BYTES) -> bytes:
    """``key`` when it is not weak; else :class:`WeakKeyError` naming ``what`` and ``fix``."""
    why = weak_key_reason(key, min_bytes)
    if why is not None:
        raise WeakKeyError(f"{what} is weak ({why}); {fix}")
    return bytes(key)


@functools.lru_cache(maxsize=4096)
def derive_key(master: bytes, purpose: str, robot: int) -> bytes:
    """HKDF-SHA256 key for ``purpose`` (``up``, ``down``, ``link``, ``history``) of ``robot``."""
    hk = HKDF(hashes.SHA256(), 32, HKDF_SALT, f"scaleflu/{purpose}/{int(robot)}".encode())
    return hk.derive(bytes(master))


def public_bytes(sk: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte Ed25519 public key of ``sk``."""
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(sk: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte Ed25519 private key."""
    return sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def fingerprint(key: bytes) -> str:
    """A short, non-secret name of a key (first 8 hex of SHA-256)."""
    return hashlib.sha256(b"scaleflu-fp" + bytes(key)).hexdigest()[:8]


# ----------------------------------------------------------------------------- files


def check_key_file_mode(path: str | Path) -> None:
    """Refuse a key file readable or writable by others than its owner (PermissionError)."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(
            f"{path}: key file has mode {mode:04o}; run chmod 600 {path} (owner only)"
        )


def write_key_file(path: str | Path, data: dict[str, Any]) -> Path:
    """Write ``data`` as a key file: JSON, mode 0600, atomically (a temporary file replaced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def read_key_file(path: str | Path) -> dict[str, Any]:
    """A key file's JSON object; PermissionError for a loose mode, ValueError for no object."""
    check_key_file_mode(path)
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a key file (expected a JSON object)")
    return raw


# ----------------------------------------------------------------------------- integrity


def history_key(sk: Ed25519PrivateKey) -> bytes:
    """The server's integrity key of its stored history and models (HKDF of its signing key)."""
    return derive_key(private_bytes(sk), "history", 0)


def load_integrity_key(path: str | Path) -> bytes:
    """The integrity key (:mod:`scaleflu.fl.integrity`) from a key file, mode 0600 only.

    A server store gives :func:`history_key` of its signing key; a file
    ``{"integrity_key": "<hex>"}`` gives that key. PermissionError for a loose mode, ValueError
    for a file holding neither.
    """
    path = Path(path)
    raw = read_key_file(path)
    sk_hex = raw.get("server_signing_key")
    if isinstance(sk_hex, str) and len(sk_hex) == 64:
        return history_key(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sk_hex)))
    k = raw.get("integrity_key")
    try:
        key = bytes.fromhex(k) if isinstance(k, str) else b""
    except ValueError:
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"{path}: no server_signing_key and no integrity_key (>= 16 bytes hex) in it"
        )
    return key


def receipt_signer(path: str | Path) -> Ed25519PrivateKey:
    """The Ed25519 key that signs a run's erasure receipts, from its key file (mode 0600).

    A server store: the server's signing key. An integrity key file: the Ed25519 key derived
    from its key, so ``scaleflu unlearn --keys FILE --erase`` signs with the run's key.
    """
    path = Path(path)
    raw = read_key_file(path)
    sk_hex = raw.get("server_signing_key")
    if isinstance(sk_hex, str) and len(sk_hex) == 64:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sk_hex))
    return Ed25519PrivateKey.from_private_bytes(derive_key(load_integrity_key(path), "receipt", 0))


def receipt_public_key(path: str | Path) -> bytes:
    """The raw Ed25519 public key that checks receipts, from a key file.

    A robot's enrolment file (``server_public_key``), a server store or an integrity key file
    (the public half of :func:`receipt_signer`). ValueError when the file holds none of them.
    """
    path = Path(path)
    raw = read_key_file(path)
    pub = raw.get("server_public_key")
    if isinstance(pub, str):
        try:
            key = bytes.fromhex(pub)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ValueError(f"{path}: server_public_key is not a 32-byte hex key")
        return key
    return public_bytes(receipt_signer(path))


def write_integrity_key(path: str | Path) -> Path:
    """Write a fresh random integrity key file (0600) for runs outside the testbed."""
    return write_key_file(path, {"integrity_key": secrets.token_bytes(KEY_BYTES).hex()})
