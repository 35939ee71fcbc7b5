"""Key material of the testbed: the server's store, robots' enrolment files, model signatures.

Two kinds of file, both key files (:mod:`scaleflu.keys`: JSON, written 0600, refused when
group/other can read them):

* the **server store** (``keys.json`` on the control PC)::

      {"robots": {"1": "<hex K_1>", ...}, "revoked": [4],
       "server_signing_key": "<hex Ed25519 private key>"}

  ``robots`` is the allow-list: a robot absent from it (revoked or never enrolled) cannot
  authenticate anything. ``revoked`` only records who was removed, for ``scaleflu keys list``.

* a robot's **enrolment file** (``robot3.json``, copied to robot 3 only)::

      {"robots": {"3": "<hex K_3>"}, "server_public_key": "<hex Ed25519 public key>"}

  It holds that robot's key and nothing of any other robot. The server's public key lets the
  robot check that a model (and a grant) was signed by the server, not by someone holding K_3.

``K_r`` is never used directly: :func:`scaleflu.keys.derive_key` derives the per-direction
message keys and the link key from it with HKDF-SHA256. Key bytes are never logged;
:meth:`KeyStore.describe` prints fingerprints only. A robots-only key file (``{"robots": ...}``,
:func:`save_keys`) serves the tests and benchmarks that start robots without a server store.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from scaleflu.keys import (
    KEY_BYTES,
    check_key,
    fingerprint,
    private_bytes,
    public_bytes,
    read_key_file,
    weak_key_reason,
    write_key_file,
)
from scaleflu.testbed.protocol import MAX_ROBOT_ID, generate_keys

log = logging.getLogger(__name__)


def rotate_hint(robot: int, store: str | Path = "keys.json") -> str:
    """The fix of a weak robot key: the command that gives the robot a new one."""
    return (
        f"give robot {robot} a new key: scaleflu keys rotate --store {store} --robot {robot} "
        f"--out-dir DIR, then copy DIR/robot{robot}.json to robot {robot}"
    )


def check_robot_key(
    robot: int, key: bytes, where: str = "", store: str | Path = "keys.json"
) -> bytes:
    """``key`` of robot ``robot`` unless it is weak (:func:`scaleflu.keys.weak_key_reason`:
    shorter than 32 bytes, all bytes equal, a repeated pattern): then a
    :class:`~scaleflu.keys.WeakKeyError` naming ``where`` (the key file) and the fix."""
    what = f"{where}: key of robot {robot}" if where else f"the key of robot {robot}"
    return check_key(key, what, rotate_hint(robot, store))


def _hex_key(v: Any, path: Path, robot: Any) -> bytes:
    try:
        return bytes.fromhex(str(v))
    except ValueError:
        raise ValueError(f"{path}: key of robot {robot} is not hex") from None


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
        return cls(generate_keys(robot_ids), Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> bytes:
        """The server's raw 32-byte Ed25519 public key."""
        return public_bytes(self.signing_key)

    def save(self, path: str | Path) -> Path:
        """Write the store (0600, atomically)."""
        return write_key_file(
            path,
            {
                "robots": {str(r): k.hex() for r, k in sorted(self.robots.items())},
                "revoked": sorted(set(self.revoked)),
                "server_signing_key": private_bytes(self.signing_key).hex(),
            },
        )

    @classmethod
    def load(cls, path: str | Path, allow_weak: bool = False) -> KeyStore:
        """Read a store; PermissionError for a loose mode, ValueError for a bad file.

        A weak robot key (:func:`check_robot_key`) is refused with the file and the command
        that replaces it; ``allow_weak`` reads it anyway (``scaleflu keys rotate`` itself).
        """
        path = Path(path)
        raw = read_key_file(path)
        robots_raw = raw.get("robots")
        if not isinstance(robots_raw, dict):
            raise ValueError(f"{path}: expected {{'robots': {{'<id>': '<hex key>'}}, ...}}")
        robots = {}
        for k, v in robots_raw.items():
            rid = _robot_id(k, path)
            key = _hex_key(v, path, rid)
            if not allow_weak:
                check_robot_key(rid, key, str(path), path)
            robots[rid] = key
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
        return write_key_file(path, self.enrolment(robot))

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
        for r, k in sorted(self.robots.items()):
            why = weak_key_reason(k)
            weak = f" WEAK ({why}): scaleflu keys rotate --robot {r}" if why else ""
            lines.append(f"robot {r}: enrolled, key {fingerprint(k)}{weak}")
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
        raw = read_key_file(path)
        robots = raw.get("robots")
        if not isinstance(robots, dict) or str(robot) not in robots:
            raise ValueError(f"{path}: no key for robot {robot}")
        key = check_robot_key(robot, _hex_key(robots[str(robot)], path, robot), str(path))
        pub = raw.get("server_public_key")
        if pub is None and isinstance(raw.get("server_signing_key"), str):
            sk = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(raw["server_signing_key"]))
            pub = public_bytes(sk).hex()
        return cls(robot, key, bytes.fromhex(pub) if isinstance(pub, str) else None)


# ----------------------------------------------------------------------------- robots only


def save_keys(keys: Mapping[int, bytes], path: str | Path) -> Path:
    """Write robots' keys as ``{"robots": {"1": "<hex>"}}`` (a key file, 0600)."""
    return write_key_file(path, {"robots": {str(k): v.hex() for k, v in sorted(keys.items())}})


def load_keys(path: str | Path) -> dict[int, bytes]:
    """Every robot's key of a key file (:func:`save_keys`, an enrolment file or a store)."""
    path = Path(path)
    raw = read_key_file(path)
    robots = raw.get("robots")
    if not isinstance(robots, dict) or not robots:
        raise ValueError(f"{path}: expected {{'robots': {{'<id>': '<hex key>'}}}}")
    out: dict[int, bytes] = {}
    for k, v in robots.items():
        rid = _robot_id(k, path)
        out[rid] = check_robot_key(rid, _hex_key(v, path, rid), str(path))
    return out


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
