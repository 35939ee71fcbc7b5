"""Key material of the testbed: the server's store, robots' enrolment files, model signatures.

Two kinds of file, both JSON, both written 0600 and refused when group/other can read them:

* the **server store** (``keys.json`` on the control PC)::

      {"robots": {"1": "<hex K_1>", ...}, "revoked": [4],
       "server_signing_key": "<hex Ed25519 private key>"}

  ``robots`` is the allow-list: a robot absent from it (revoked or never enrolled) cannot
  authenticate anything. ``revoked`` only records who was removed, for ``scaleflu keys list``.

* a robot's **enrolment file** (``robot3.json``, copied to robot 3 only)::

      {"robots": {"3": "<hex K_3>"}, "server_public_key": "<hex Ed25519 public key>"}

  It holds that robot's key and nothing of any other robot. The server's public key lets the
  robot check that a model (and a grant) was signed by the server, not by someone holding K_3.

``K_r`` is never used directly: :func:`scaleflu.testbed.protocol.derive_key` derives the
per-direction message keys and the link key from it with HKDF-SHA256. Key bytes are never
logged; :func:`describe` prints fingerprints only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from scaleflu.testbed.protocol import KEY_BYTES, MAX_ROBOT_ID, check_key_file_mode, derive_key

log = logging.getLogger(__name__)


def public_bytes(sk: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte Ed25519 public key of ``sk``."""
    return sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(sk: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte Ed25519 private key."""
    return sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def fingerprint(key: bytes) -> str:
    """A short, non-secret name of a key (first 8 hex of SHA-256)."""
    return hashlib.sha256(b"scaleflu-fp" + bytes(key)).hexdigest()[:8]


def _write_private(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2) + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def _read_private(path: Path) -> dict[str, Any]:
    check_key_file_mode(path)
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a key file (expected a JSON object)")
    return raw


def _robot_id(x: Any, path: Path) -> int:
    try:
        rid = int(x)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: robot id {x!r} is not an integer") from None
    if not 1 <= rid <= MAX_ROBOT_ID:
        raise ValueError(f"{path}: robot id {rid} outside 1..{MAX_ROBOT_ID}")
    return rid


@dataclass
class KeyStore:
    """The server's keys: robots' K_r (the allow-list), revoked ids, its Ed25519 identity."""

    robots: dict[int, bytes]
    signing_key: Ed25519PrivateKey
    revoked: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, robot_ids: list[int]) -> KeyStore:
        """Fresh random keys for ``robot_ids`` and a fresh server identity."""
        return cls(
            {int(r): secrets.token_bytes(KEY_BYTES) for r in robot_ids},
            Ed25519PrivateKey.generate(),
        )

    @property
    def public_key(self) -> bytes:
        """The server's raw 32-byte Ed25519 public key."""
        return public_bytes(self.signing_key)

    def save(self, path: str | Path) -> Path:
        """Write the store (0600, atomically)."""
        return _write_private(
            Path(path),
            {
                "robots": {str(r): k.hex() for r, k in sorted(self.robots.items())},
                "revoked": sorted(set(self.revoked)),
                "server_signing_key": private_bytes(self.signing_key).hex(),
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> KeyStore:
        """Read a store; PermissionError for a loose mode, ValueError for a bad file."""
        path = Path(path)
        raw = _read_private(path)
        robots_raw = raw.get("robots")
        if not isinstance(robots_raw, dict):
            raise ValueError(f"{path}: expected {{'robots': {{'<id>': '<hex key>'}}, ...}}")
        robots = {}
        for k, v in robots_raw.items():
            key = bytes.fromhex(str(v))
            if len(key) < 16:
                raise ValueError(f"{path}: key of robot {k} is shorter than 16 bytes")
            robots[_robot_id(k, path)] = key
        sk_hex = raw.get("server_signing_key")
        if not isinstance(sk_hex, str) or len(sk_hex) != 64:
            raise ValueError(f"{path}: no server_signing_key (a server store is needed here)")
        revoked = [_robot_id(x, path) for x in raw.get("revoked", [])]
        return cls(robots, Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sk_hex)), revoked)

    def enrolment(self, robot: int) -> dict[str, Any]:
        """The content of robot ``robot``'s enrolment file (its key, the server's public key)."""
        if robot not in self.robots:
            raise KeyError(f"robot {robot} is not enrolled")
        return {
            "robots": {str(robot): self.robots[robot].hex()},
            "server_public_key": self.public_key.hex(),
        }

    def write_enrolment(self, robot: int, path: str | Path) -> Path:
        """Write robot ``robot``'s enrolment file (0600)."""
        return _write_private(Path(path), self.enrolment(robot))

    def enrol(self, robot: int) -> None:
        """Give a new robot a key (ValueError if it has one: use rotate)."""
        if robot in self.robots:
            raise ValueError(f"robot {robot} is already enrolled; use rotate")
        self.robots[robot] = secrets.token_bytes(KEY_BYTES)
        self.revoked = [r for r in self.revoked if r != robot]

    def rotate(self, robot: int) -> None:
        """Replace a robot's key (its old enrolment file stops working)."""
        if robot not in self.robots:
            raise KeyError(f"robot {robot} is not enrolled")
        self.robots[robot] = secrets.token_bytes(KEY_BYTES)

    def revoke(self, robot: int) -> None:
        """Remove a robot from the allow-list (nothing it sends authenticates any more)."""
        if robot not in self.robots:
            raise KeyError(f"robot {robot} is not enrolled")
        del self.robots[robot]
        self.revoked = sorted(set(self.revoked) | {robot})

    def describe(self) -> list[str]:
        """One line per robot with a key fingerprint (never the key itself)."""
        lines = [f"server public key {self.public_key.hex()}"]
        lines += [
            f"robot {r}: enrolled, key {fingerprint(k)}" for r, k in sorted(self.robots.items())
        ]
        lines += [f"robot {r}: revoked" for r in self.revoked]
        return lines


@dataclass
class Enrolment:
    """What a robot holds: its id, its K_r and the server's public key (None: unchecked)."""

    robot: int
    key: bytes
    server_public_key: bytes | None

    @classmethod
    def load(cls, path: str | Path, robot: int) -> Enrolment:
        """Read robot ``robot``'s enrolment (or a server store, for a local test)."""
        path = Path(path)
        raw = _read_private(path)
        robots = raw.get("robots")
        if not isinstance(robots, dict) or str(robot) not in robots:
            raise ValueError(f"{path}: no key for robot {robot}")
        key = bytes.fromhex(str(robots[str(robot)]))
        if len(key) < 16:
            raise ValueError(f"{path}: key of robot {robot} is shorter than 16 bytes")
        pub = raw.get("server_public_key")
        if pub is None and isinstance(raw.get("server_signing_key"), str):
            sk = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(raw["server_signing_key"]))
            pub = public_bytes(sk).hex()
        return cls(robot, key, bytes.fromhex(pub) if isinstance(pub, str) else None)


# ----------------------------------------------------------------------------- at rest


def history_key(sk: Ed25519PrivateKey) -> bytes:
    """The server's integrity key of its stored history and models (HKDF of its signing key)."""
    return derive_key(private_bytes(sk), "history", 0)


def load_integrity_key(path: str | Path) -> bytes:
    """The integrity key (``scaleflu.fl.integrity``) from a key file, mode 0600 only.

    A server store (``keys.json``) gives :func:`history_key` of its signing key, so
    ``scaleflu unlearn --keys keys.json`` checks a testbed run as its server does; a file
    ``{"integrity_key": "<hex, >= 16 bytes>"}`` gives that key (``scaleflu keys integrity``).
    PermissionError for a loose mode, ValueError for a file holding neither.
    """
    path = Path(path)
    raw = _read_private(path)
    sk_hex = raw.get("server_signing_key")
    if isinstance(sk_hex, str) and len(sk_hex) == 64:
        return history_key(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sk_hex)))
    k = raw.get("integrity_key")
    try:
        key = bytes.fromhex(k) if isinstance(k, str) else b""
    except ValueError:
        key = b""
    if len(key) < 16:
        raise ValueError(
            f"{path}: no server_signing_key and no integrity_key (>= 16 bytes hex) in it"
        )
    return key


def write_integrity_key(path: str | Path) -> Path:
    """Write a fresh random integrity key file (0600) for runs outside the testbed."""
    return _write_private(Path(path), {"integrity_key": secrets.token_bytes(KEY_BYTES).hex()})


# ----------------------------------------------------------------------------- signatures


def _signed_bytes(kind: str, **fields: Any) -> bytes:
    return json.dumps({"kind": kind, **fields}, sort_keys=True, separators=(",", ":")).encode()


def sign(sk: Ed25519PrivateKey, kind: str, **fields: Any) -> str:
    """Hex Ed25519 signature over a canonical JSON of ``kind`` and ``fields``."""
    return sk.sign(_signed_bytes(kind, **fields)).hex()


def verify(public_key: bytes, sig: Any, kind: str, **fields: Any) -> bool:
    """Whether ``sig`` is the server's signature over ``kind`` and ``fields``."""
    if not isinstance(sig, str) or len(sig) != 128:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(
            bytes.fromhex(sig), _signed_bytes(kind, **fields)
        )
    except (InvalidSignature, ValueError):
        return False
    return True
