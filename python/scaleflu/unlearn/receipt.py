"""Erasure receipts: what a server signs for every unlearning request it served.

A receipt is one JSON object, signed with Ed25519 over its canonical form (keys sorted, no
spaces, UTF-8) without the ``signature`` field::

    {"kind": "scaleflu-erasure-receipt", "version": 1,
     "issued_at": 1767000000.0, "issued_at_utc": "2026-...Z",
     "request": {"text": "client:0", "kind": "client", "targets": [0], "classes": null,
                 "fraction": null, "robot": 1},
     "method": "scale", "mode": "default",
     "model_before": {"sha256": "..."}, "model_after": {"sha256": "..."},
     "changed": {"tensors": [...], "groups": {"conv1.weight": [0, 3]}, "groups_total": 128},
     "erasure": {"clients": [0], "rounds": [1, 2], "updates": [{"round": 1, "client": 0,
                 "sha256": "...", "bytes": 123}], "bytes": 246, "derived_kept_rounds": [1, 2],
                 "version": 14} | null,
     "audit": {"metrics": {...}, "audit": {...}},
     "history": {"store_id": "...", "version": 15, "head": "...", "run": "lab1"},
     "previous": "<sha256 of the previous receipt of this history> | null",
     "signature": {"alg": "ed25519", "public_key": "<hex>", "value": "<hex>"}}

Model hashes are :func:`scaleflu.fl.integrity.state_sha256` (the digest the testbed's MODEL and
EVAL_REPORT messages carry), so a robot compares them with the models it was sent. The hashes
of the erased updates are the same digest over each client's stored update tensors. The
server keeps each receipt in its history store (:meth:`~scaleflu.fl.history.HistoryStore.
append_receipt`, inside the store's digest) and each names its predecessor (``previous``).

:func:`verify_receipt` needs only the receipt, the server's public key and (optionally) the
model one holds: no torch, no run folder. :func:`explain` says in plain words what a valid
receipt proves and what it does not.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from safetensors.numpy import load_file

from scaleflu.fl.integrity import state_sha256
from scaleflu.keys import fingerprint, public_bytes

RECEIPT_KIND = "scaleflu-erasure-receipt"
RECEIPT_VERSION = 1
MAX_RECEIPT_BYTES = 4 << 20  # a receipt file or message larger than this is refused


class ReceiptError(ValueError):
    """A receipt is malformed, does not verify, or is not about the model given (one line)."""


def canonical(receipt: Mapping[str, Any]) -> bytes:
    """The bytes a receipt's signature covers: canonical JSON without ``signature``."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def receipt_sha256(receipt: Mapping[str, Any]) -> str:
    """SHA-256 of a signed receipt's canonical JSON (signature included): its name in a chain."""
    text = json.dumps(dict(receipt), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def receipt_text(receipt: Mapping[str, Any]) -> str:
    """A signed receipt as the text kept in the history and written to files."""
    return json.dumps(dict(receipt), sort_keys=True, indent=1, allow_nan=False) + "\n"


def _plain(value: Any) -> Any:
    """JSON-safe scalars, lists and dicts (non-finite floats become None)."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    try:  # numpy scalars
        return _plain(value.item())
    except AttributeError:
        return str(value)


def changed_parts(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    groups: Mapping[str, Sequence[tuple[int, int]]],
) -> dict[str, Any]:
    """Which tensors and which parameter groups (layer, j) differ between two state dicts."""
    import torch

    tensors: list[str] = []
    changed: dict[str, list[int]] = {}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            tensors.append(name)
            continue
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        if a.shape != b.shape:
            tensors.append(name)
            continue
        if torch.equal(a, b.to(a.dtype)):
            continue
        tensors.append(name)
        if name in groups:
            diff = (a.double() - b.double()).abs().flatten()
            changed[name] = [j for j, (lo, hi) in enumerate(groups[name]) if diff[lo:hi].max() > 0]
    total = sum(len(g) for g in groups.values())
    return {"tensors": tensors, "groups": changed, "groups_total": total}


def audit_scores(result: Mapping[str, Any]) -> dict[str, Any]:
    """The scores a result carries (its metrics and audit) as they go into a receipt."""
    out: dict[str, Any] = {"metrics": _plain(dict(result.get("metrics") or {}))}
    if result.get("audit") is not None:
        out["audit"] = _plain(result["audit"])
    return out


def build_receipt(
    *,
    request: Mapping[str, Any],
    method: str,
    mode: str | None,
    before_sha256: str,
    after_sha256: str,
    changed: Mapping[str, Any],
    erasure: Mapping[str, Any] | None,
    result: Mapping[str, Any],
    history: Mapping[str, Any],
    previous: str | None,
    issued_at: float | None = None,
) -> dict[str, Any]:
    """An unsigned receipt (see the module docstring for the fields)."""
    t = time.time() if issued_at is None else float(issued_at)
    utc = datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    er = None
    if erasure is not None:
        er = {
            "clients": [int(n) for n in erasure.get("clients", [])],
            "rounds": [int(r) for r in erasure.get("rounds", [])],
            "updates": _plain(list(erasure.get("erased_updates", []))),
            "bytes": int(erasure.get("bytes", 0)),
            "derived_kept_rounds": [int(r) for r in erasure.get("derived_kept_rounds", [])],
            "final_model_replaced": bool(erasure.get("final_model_replaced", False)),
            "version": erasure.get("version"),
        }
    return {
        "kind": RECEIPT_KIND,
        "version": RECEIPT_VERSION,
        "issued_at": t,
        "issued_at_utc": utc,
        "request": _plain(dict(request)),
        "method": str(method),
        "mode": mode,
        "model_before": {"sha256": str(before_sha256)},
        "model_after": {"sha256": str(after_sha256)},
        "changed": _plain(dict(changed)),
        "erasure": er,
        "audit": audit_scores(result),
        "history": _plain(dict(history)),
        "previous": previous,
    }


def sign_receipt(receipt: Mapping[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The receipt with its Ed25519 signature (``signature``: alg, public_key, value)."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    sig = key.sign(canonical(body))
    return {
        **body,
        "signature": {"alg": "ed25519", "public_key": public_bytes(key).hex(), "value": sig.hex()},
    }


def issue_receipt(history: Any, key: Ed25519PrivateKey, **fields: Any) -> dict[str, Any]:
    """Build, sign and keep a receipt in ``history`` (a HistoryStore): the signed receipt.

    ``fields`` are :func:`build_receipt`'s except ``history`` and ``previous``, which come from
    the store: its head as of now (after the erasure) and its last receipt.
    """
    head = history.head()
    head["run"] = Path(history.dir).parent.name
    receipt = sign_receipt(
        build_receipt(history=head, previous=history.last_receipt_sha256(), **fields), key
    )
    history.append_receipt(receipt_text(receipt), receipt_sha256(receipt))
    return receipt


# ----------------------------------------------------------------------------- checking


def parse_receipt(data: bytes | str, source: str = "receipt") -> dict[str, Any]:
    """A receipt from its JSON text; ReceiptError (one line naming ``source``) otherwise."""
    if len(data) > MAX_RECEIPT_BYTES:
        raise ReceiptError(f"{source}: {len(data)} bytes is larger than a receipt can be")
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReceiptError(f"{source}: not a receipt (not JSON: {exc})") from None
    if not isinstance(raw, dict) or raw.get("kind") != RECEIPT_KIND:
        raise ReceiptError(f"{source}: not a scaleflu erasure receipt")
    if raw.get("version") != RECEIPT_VERSION:
        raise ReceiptError(
            f"{source}: receipt version {raw.get('version')!r} is not supported "
            f"(this scaleflu reads version {RECEIPT_VERSION})"
        )
    return raw


def read_receipt(path: str | Path) -> dict[str, Any]:
    """A receipt file; ReceiptError for a file that is not one (FileNotFoundError: missing)."""
    path = Path(path)
    if path.stat().st_size > MAX_RECEIPT_BYTES:
        raise ReceiptError(f"{path}: {path.stat().st_size} bytes is larger than a receipt can be")
    return parse_receipt(path.read_bytes(), str(path))


@dataclass(frozen=True)
class Verified:
    """A receipt that verified, and under which key."""

    receipt: dict[str, Any]
    key_fingerprint: str

    @property
    def after(self) -> str:
        """SHA-256 of the model the receipt says replaced the old one."""
        return str(self.receipt["model_after"]["sha256"])

    @property
    def before(self) -> str:
        """SHA-256 of the model it replaced."""
        return str(self.receipt["model_before"]["sha256"])

    @property
    def version(self) -> int:
        """The history version (counter) the receipt was issued at."""
        return int(self.receipt["history"]["version"])


def verify_receipt(
    receipt: Mapping[str, Any],
    public_key: bytes,
    model_sha256: str | None = None,
    source: str = "receipt",
) -> Verified:
    """Check a receipt's signature under the server's ``public_key`` and its fields' shape;
    with ``model_sha256``, that it is about that model (its ``model_after``).

    ReceiptError (one line) when it does not verify: tampered with, signed by another key,
    malformed, or about another model.
    """
    sig = receipt.get("signature")
    if not isinstance(sig, Mapping) or sig.get("alg") != "ed25519":
        raise ReceiptError(f"{source}: receipt INVALID: no Ed25519 signature")
    want = fingerprint(bytes(public_key))
    try:
        value = bytes.fromhex(str(sig.get("value")))
        Ed25519PublicKey.from_public_bytes(bytes(public_key)).verify(value, canonical(receipt))
    except (InvalidSignature, ValueError, TypeError):
        who = str(sig.get("public_key", ""))
        try:
            other = fingerprint(bytes.fromhex(who))
        except ValueError:
            other = "?"
        why = (
            f"signed by another key ({other}, not the server's {want})"
            if other != want
            else "its content was changed after it was signed"
        )
        raise ReceiptError(
            f"{source}: receipt INVALID: the signature does not verify under the server's key "
            f"{want}: {why}"
        ) from None
    try:  # signed by the server; its fields must still be what a receipt holds
        before = str(receipt["model_before"]["sha256"])
        after = str(receipt["model_after"]["sha256"])
        int(receipt["history"]["version"])
        req = receipt["request"]["text"]
        er = receipt.get("erasure")
        if er is not None:
            [(int(u["round"]), int(u["client"])) for u in er["updates"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReceiptError(f"{source}: receipt INVALID: malformed field {exc}") from None
    if len(before) != 64 or len(after) != 64 or not isinstance(req, str):
        raise ReceiptError(f"{source}: receipt INVALID: malformed model hashes or request")
    if model_sha256 is not None and model_sha256 != after:
        hint = " (it is the model before the request)" if model_sha256 == before else ""
        raise ReceiptError(
            f"{source}: receipt is not about this model: it names model {after[:16]}..., the "
            f"model given is {model_sha256[:16]}...{hint}"
        )
    return Verified(dict(receipt), want)


def explain(v: Verified) -> list[str]:
    """What a verified receipt proves and what it does not, in plain words (lines)."""
    r = v.receipt
    req = r["request"]
    who = f" (asked by robot {req['robot']})" if req.get("robot") is not None else ""
    hist = r["history"]
    lines = [
        f"receipt VALID: signed by server key {v.key_fingerprint} on {r.get('issued_at_utc')}",
        "",
        "It proves that this server signed these statements:",
        f"  - for the request {req['text']}{who}, the model {v.before[:16]}... was replaced by "
        f"the model {v.after[:16]}... (method {r.get('method')}"
        f"{', mode ' + str(r['mode']) if r.get('mode') else ''});",
    ]
    ch = r.get("changed") or {}
    groups = ch.get("groups") or {}
    n_groups = sum(len(g) for g in groups.values())
    lines.append(
        f"  - {len(ch.get('tensors') or [])} tensors changed, {n_groups} of "
        f"{ch.get('groups_total', '?')} parameter groups of the sensitivity layers;"
    )
    er = r.get("erasure")
    if er is None:
        lines.append("  - no stored update was erased for this request (erasure was off);")
    else:
        kept = [u for u in er["updates"] if u.get("sha256")]
        lines.append(
            f"  - {len(er['updates'])} stored updates of client(s) {er['clients']} in rounds "
            f"{er['rounds']} were erased from its history ({len(kept)} with the SHA-256 listed, "
            f"{er['bytes']} bytes), and the history's final model is the new one;"
        )
    lines.append(
        f"  - at history {hist.get('run', '')} (store {hist.get('store_id')}) version "
        f"{hist['version']}: a history of this server older than that version is refused;"
    )
    prev = r.get("previous")
    lines.append(
        f"  - it follows receipt {prev[:16]}... of the same history."
        if prev
        else "  - it is the first receipt of that history."
    )
    scores = (r.get("audit") or {}).get("metrics") or {}
    shown = ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
        for k, v in sorted(scores.items())
        if v is not None and not isinstance(v, dict | list)
    )
    lines += [
        "",
        "It does not prove:",
        "  - that the model forgot the data in the statistical sense: that is what the audit's "
        "scores measured on the server say (" + (shown or "none recorded") + ");",
        "  - that no copy exists elsewhere: backups, other machines, or the intermediate global "
        "models and other clients' later updates, computed with the erased ones and kept"
        + (f" (rounds {er['derived_kept_rounds']})" if er else "")
        + ";",
        "  - that the server is honest: only that it committed to the above with its key.",
    ]
    return lines


def model_file_sha256(path: str | Path) -> str:
    """:func:`~scaleflu.fl.integrity.state_sha256` of a safetensors model file (no torch)."""
    return state_sha256(load_file(str(path)))
