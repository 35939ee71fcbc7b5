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
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

if TYPE_CHECKING:  # torch is imported when a model is saved or loaded, not for the error type
    import torch

MAC_SUFFIX = ".mac"
_TRUSTED: dict[Path, bytes] = {}


class IntegrityError(RuntimeError):
    """A stored file fails its authenticated digest (tampered, foreign or undigested)."""


class CorruptFileError(ValueError):
    """A stored file cannot be read as what it must be (truncated, damaged, not that format);
    the message starts with the file's path."""


def _norm(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def trust(run_dir: str | Path, key: bytes) -> None:
    """Check (and write) digests under ``key`` for everything stored below ``run_dir``."""
    if len(key) < 16:
        raise ValueError("integrity key shorter than 16 bytes")
    _TRUSTED[_norm(run_dir)] = bytes(key)


def untrust(run_dir: str | Path) -> None:
    """Forget the key registered for ``run_dir`` (tests; a process serving several runs)."""
    _TRUSTED.pop(_norm(run_dir), None)


def key_for(path: str | Path) -> bytes | None:
    """The key registered for ``path`` or the closest of its parent folders (None: none)."""
    p = _norm(path)
    for folder in (p, *p.parents):
        if folder in _TRUSTED:
            return _TRUSTED[folder]
    return None


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
