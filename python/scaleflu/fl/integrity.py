"""Integrity at rest: authenticated digests (HMAC-SHA256) of stored models and history files.

A file ``X`` that is protected has a sidecar ``X.mac`` holding ``HMAC-SHA256(key, name(X) || 0
|| bytes(X))`` in hex. The key is held by the server only (the testbed's edge server derives it
from its Ed25519 signing key, :func:`scaleflu.keys.load_integrity_key`), so whoever can
write the run folder but not read the server's key store cannot produce a file the server
accepts. A file whose digest is missing or does not match is refused with
:class:`IntegrityError` (one line: the path and what is wrong).

The key of a run folder is registered once per process with :func:`trust`; every
:class:`scaleflu.fl.history.HistoryStore` opened on that folder and every :func:`load_model`
under it then checks (and every :func:`save_model` writes) the digests, also when the store is
opened by code that does not know about keys (the unlearning methods' ``load_run``).

**Freshness.** A digest proves who wrote a store, not that it is the latest one: a whole copy
put back later carries valid digests. :class:`HistoryHeads` is the other half: a sealed file
kept beside the key store (``keys.heads.json`` beside ``keys.json``, :func:`heads_path`), outside
the run folder, holding for every history store the last version (a counter that grows with
every committed change) and head (the metadata digest at that version) its server wrote. A
store whose version is below the recorded one, or equal with another head, is refused on open
(:class:`RollbackError`); a deliberate restore of a backup goes through
``scaleflu history restore`` (recorded in the store and in the heads file). :func:`trust`
registers the heads file of a run folder beside its key, and the signing key of its erasure
receipts (:mod:`scaleflu.unlearn.receipt`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import struct
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

if TYPE_CHECKING:  # torch is imported when a model is saved or loaded, not for the error type
    import torch

log = logging.getLogger(__name__)

MAC_SUFFIX = ".mac"
HEADS_FORMAT = "scaleflu-history-heads"
_TRUSTED: dict[Path, bytes] = {}
_HEADS: dict[Path, HistoryHeads] = {}
_SIGNERS: dict[Path, Any] = {}  # run folder -> Ed25519 private key of its erasure receipts


class IntegrityError(RuntimeError):
    """A stored file fails its authenticated digest (tampered, foreign or undigested)."""


class RollbackError(IntegrityError):
    """A history store is older than the last version its server signed (put back, forked)."""


class CorruptFileError(ValueError):
    """A stored file cannot be read as what it must be (truncated, damaged, not that format);
    the message starts with the file's path."""


def _norm(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def trust(
    run_dir: str | Path,
    key: bytes,
    heads: HistoryHeads | None = None,
    signer: Any = None,
) -> None:
    """Check (and write) digests under ``key`` for everything stored below ``run_dir``.

    ``heads``: the sealed record of the history stores' last signed versions (freshness: a
    store older than its record is refused on open); ``signer``: the Ed25519 private key that
    signs the run's erasure receipts. None: none (a previous registration of the folder is
    replaced).
    """
    if len(key) < 16:
        raise ValueError("integrity key shorter than 16 bytes")
    folder = _norm(run_dir)
    _TRUSTED[folder] = bytes(key)
    for table, value in ((_HEADS, heads), (_SIGNERS, signer)):
        if value is None:
            table.pop(folder, None)
        else:
            table[folder] = value


def untrust(run_dir: str | Path) -> None:
    """Forget the key registered for ``run_dir`` (tests; a process serving several runs)."""
    folder = _norm(run_dir)
    for table in (_TRUSTED, _HEADS, _SIGNERS):
        table.pop(folder, None)


def _registered(table: Mapping[Path, Any], path: str | Path) -> Any:
    p = _norm(path)
    for folder in (p, *p.parents):
        if folder in table:
            return table[folder]
    return None


def key_for(path: str | Path) -> bytes | None:
    """The key registered for ``path`` or the closest of its parent folders (None: none)."""
    return _registered(_TRUSTED, path)


def heads_for(path: str | Path) -> HistoryHeads | None:
    """The heads file registered with the key of ``path`` (None: freshness unchecked)."""
    return _registered(_HEADS, path)


def signer_for(path: str | Path) -> Any:
    """The Ed25519 private key that signs the erasure receipts of ``path``'s run (or None)."""
    return _registered(_SIGNERS, path)


# ----------------------------------------------------------------------------- model digests


def state_sha256(tensors: Mapping[str, Any]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes of a state dict (sorted by name).

    Values are numpy arrays or torch tensors (moved to the CPU). The testbed's MODEL and
    EVAL_REPORT hashes, the served model's name and the erasure receipts all use this digest, so
    a robot can compare what it holds with what a receipt names.
    """
    h = hashlib.sha256()
    for name in sorted(tensors):
        v = tensors[name]
        if not isinstance(v, np.ndarray):
            v = v.detach().cpu().numpy()
        a = np.ascontiguousarray(v)
        h.update(name.encode())
        h.update(
            a.dtype.newbyteorder("<").str.encode() if a.dtype.itemsize > 1 else a.dtype.str.encode()
        )
        h.update(struct.pack(f">{a.ndim + 1}I", a.ndim, *a.shape))
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------- freshness


def heads_path(key_file: str | Path) -> Path:
    """Where the heads file of a key file lives: ``keys.json`` -> ``keys.heads.json`` beside it."""
    p = Path(key_file)
    return p.with_name(f"{p.stem}.heads.json")


class HistoryHeads:
    """The sealed record of the last version and head of each history store (freshness).

    One JSON file (mode 0600, replaced atomically, under a lock shared by the processes that
    write it) sealed with an HMAC-SHA256 under the integrity key::

        {"format": "scaleflu-history-heads", "stores": {"<store id>": {"version": 12,
         "head": "<metadata digest>", "run": "<folder>", "updated_at": ..., "erasures": [...],
         "restores": [...]}}, "mac": "<hex>"}

    It lives beside the key store, outside the run folder: whoever can put an old copy of the
    run folder back cannot also move this record back without write access to the key store's
    folder. A missing file is an empty record (a new server); a file that fails its seal is
    refused (:class:`IntegrityError`).
    """

    def __init__(self, path: str | Path, key: bytes) -> None:
        self.path = Path(path)
        self._key = hmac.new(bytes(key), b"scaleflu-history-heads", hashlib.sha256).digest()

    def _seal(self, stores: Mapping[str, Any]) -> str:
        body = json.dumps({"format": HEADS_FORMAT, "stores": stores}, sort_keys=True)
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def read(self) -> dict[str, Any]:
        """Every store's record (an empty dict when the file does not exist yet)."""
        if not self.path.is_file():
            return {}
        try:
            raw = json.loads(self.path.read_text())
            stores, mac = raw["stores"], raw["mac"]
            ok = raw.get("format") == HEADS_FORMAT and isinstance(stores, dict)
        except (ValueError, KeyError, TypeError):
            ok, stores, mac = False, {}, ""
        if not ok or not hmac.compare_digest(str(mac), self._seal(stores)):
            raise IntegrityError(
                f"{self.path}: the history heads file fails its seal (modified, or written "
                "under another key); refusing it"
            )
        return stores

    def get(self, store_id: str) -> dict[str, Any] | None:
        """The record of one store (None: never recorded)."""
        return self.read().get(store_id)

    @contextlib.contextmanager
    def _update(self) -> Iterator[dict[str, Any]]:
        """Read, change and write the record under an exclusive lock (other processes wait)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            stores = self.read()
            yield stores
            data = {"format": HEADS_FORMAT, "stores": stores, "mac": self._seal(stores)}
            tmp = self.path.with_name(self.path.name + ".tmp")
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(out, "w") as fh:
                fh.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        finally:
            os.close(fd)

    def advance(
        self,
        store_id: str,
        version: int,
        head: str,
        run: str,
        erasure: Mapping[str, Any] | None = None,
        restore: Mapping[str, Any] | None = None,
    ) -> None:
        """Record that store ``store_id`` is now at ``version`` with ``head``.

        A version below the recorded one is refused (:class:`RollbackError`): the store being
        written is older than one this server already signed. ``erasure``: an erasure committed
        at this version (kept so that a deliberate restore can apply it again); ``restore``: a
        deliberate restore of an older copy, recorded with its reason.
        """
        with self._update() as stores:
            rec = stores.setdefault(store_id, {"version": 0, "erasures": [], "restores": []})
            if int(version) < int(rec["version"]):
                raise RollbackError(
                    f"{run}: history store {store_id} writes version {version} but version "
                    f"{rec['version']} was already signed; refusing it"
                )
            rec.update(version=int(version), head=str(head), run=str(run), updated_at=time.time())
            if erasure is not None:
                rec["erasures"].append({"version": int(version), **dict(erasure)})
            if restore is not None:
                rec["restores"].append({"version": int(version), **dict(restore)})


def mac_path(path: str | Path) -> Path:
    """The sidecar holding the digest of ``path``."""
    return Path(str(path) + MAC_SUFFIX)


def file_mac(key: bytes, path: str | Path, name: str | None = None) -> str:
    """HMAC-SHA256 under ``key`` of a file's name (default: its own) and bytes (hex)."""
    path = Path(path)
    h = hmac.new(key, (name if name is not None else path.name).encode() + b"\0", hashlib.sha256)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_mac(key: bytes, path: str | Path, name: str | None = None) -> Path:
    """Write ``path``'s digest (``name``: the final name when ``path`` is a temporary file)."""
    path = Path(path)
    final = path if name is None else path.with_name(name)
    out = mac_path(final)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(file_mac(key, path, final.name))
    tmp.replace(out)
    return out


def check_mac(key: bytes, path: str | Path, what: str = "file") -> None:
    """Raise IntegrityError unless ``path`` carries a valid digest under ``key``."""
    path = Path(path)
    side = mac_path(path)
    want = side.read_text().strip() if side.is_file() else None
    if want is None:
        raise IntegrityError(
            f"{path}: {what} has no authenticated digest ({side.name} missing); refusing it"
        )
    if not hmac.compare_digest(want, file_mac(key, path)):
        raise IntegrityError(
            f"{path}: {what} fails its authenticated digest (modified, or written under "
            "another key); refusing it"
        )


def save_model(
    state: Mapping[str, torch.Tensor], path: str | Path, key: bytes | None = None
) -> Path:
    """Save a state dict as safetensors (atomically) with its digest (``key`` or trusted)."""
    path = Path(path)
    key = key if key is not None else key_for(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    if key is not None:  # the digest first, then the file: a crash leaves no undigested model
        write_mac(key, tmp, path.name)
    tmp.replace(path)
    return path


def load_tensors(
    path: str | Path, what: str = "file", prefix: str | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (``prefix``: only keys starting with it, without it).

    Reading never executes anything from the file. A missing file is FileNotFoundError; one
    that is not a whole safetensors file is :class:`CorruptFileError` naming it.
    """
    path = Path(path)
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if prefix is None:
                    out[name] = fh.get_tensor(name)
                elif name.startswith(prefix):
                    out[name[len(prefix) :]] = fh.get_tensor(name)
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CorruptFileError(
            f"{path}: {what} is not a readable safetensors file (truncated or damaged: {exc})"
        ) from None
    return out


def load_model(path: str | Path, key: bytes | None = None) -> dict[str, torch.Tensor]:
    """Load a safetensors state dict, checking its digest first (``key`` or trusted)."""
    key = key if key is not None else key_for(path)
    if key is not None:
        check_mac(key, path, "model")
    return load_tensors(path, "model")
