"""Unlearning requests U = (C_u, D_u, tau): parsing, validation, resolution to index sets.

Text forms (the ``--request`` argument):

* ``client:7`` / ``client:3,7``: the clients leave the federation (D_u,n = D_n).
* ``class:3`` / ``class:3,5``: the classes are removed from the *whole* federation (a Retrain
  FA near zero is only possible when no other client keeps the class);
  ``class:3@7`` removes class 3 from client 7 only (the paper's literal case).
* ``sample:7:0.1``: a fraction of client 7's samples. The forget set is the client's poisoned
  samples first -- its membership canaries (every copy of a canary together, never split), then
  its triggered or label-flipped samples in index order -- then, when the fraction asks for
  more, a seeded random choice of its other samples.
* ``sample:7:poisoned``: exactly client 7's poisoned samples (canaries with all their copies,
  triggered and flipped samples), whatever their share of its data.

The text is parsed once, where it enters (the command line, a config); everything after works
on the typed :class:`UnlearnRequest`. Resolution gives, per client, the global training-sample
indices to forget and to keep.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError

log = logging.getLogger(__name__)

KINDS = ("client", "class", "sample")


class RequestError(ConfigError):
    """An unlearning request is malformed or cannot be satisfied by the run."""


class NothingToUnlearnError(RequestError):
    """A request touches nothing the run learned (an empty forget set, or clients that took part
    in no recorded round)."""


@dataclass(frozen=True)
class UnlearnRequest:
    """A request: kind tau, clients C_u (empty: whole federation), classes, fraction.

    Built from its text by :func:`parse_request` (the command line, configs) or directly from
    typed fields (the edge server, from a robot's request); either way it is checked here, and
    ``text`` is the canonical text form when none is given.
    """

    kind: str
    clients: tuple[int, ...] = ()
    classes: tuple[int, ...] = ()
    fraction: float | None = None
    text: str = ""
    poisoned_only: bool = False  # sample:N:poisoned

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", tuple(int(c) for c in self.clients))
        object.__setattr__(self, "classes", tuple(int(c) for c in self.classes))
        what = self.text or f"{self.kind} request"
        if self.kind not in KINDS:
            raise RequestError(f"{what}: unknown kind {self.kind!r}; choose from {KINDS}")
        if self.kind != "class" and not self.clients:
            raise RequestError(f"{what}: no client ids given")
        if self.kind == "class" and not self.classes:
            raise RequestError(f"{what}: no class ids given")
        if self.kind == "sample" and not self.poisoned_only:
            f = self.fraction
            if f is None or not 0.0 < float(f) <= 1.0:
                raise RequestError(f"{what}: fraction must be in (0, 1], got {f}")
        if not self.text:
            object.__setattr__(self, "text", self.canonical())

    @property
    def whole_class(self) -> bool:
        """A class removed from the whole federation (``class:c`` without ``@clients``)."""
        return self.kind == "class" and not self.clients

    def canonical(self) -> str:
        """The text form: ``client:3,7``, ``class:3[@7]``, ``sample:7:0.1`` or ``:poisoned``."""
        clients = ",".join(map(str, self.clients))
        if self.kind == "client":
            return f"client:{clients}"
        if self.kind == "class":
            classes = ",".join(map(str, self.classes))
            return f"class:{classes}@{clients}" if clients else f"class:{classes}"
        return f"sample:{clients}:{'poisoned' if self.poisoned_only else self.fraction}"

    @property
    def slug(self) -> str:
        """A file-name-safe form of the request (``client-7``, ``class-3``, ``sample-7-0.1``)."""
        return re.sub(r"[^A-Za-z0-9.\-]+", "-", self.text).strip("-") or self.kind


def _ints(text: str, what: str, full: str) -> tuple[int, ...]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise RequestError(f"request {full!r}: no {what} given")
    try:
        return tuple(int(s) for s in items)
    except ValueError as exc:
        raise RequestError(f"request {full!r}: {what} must be integers, got {text!r}") from exc


def parse_request(text: str) -> UnlearnRequest:
    """Parse ``client:7``, ``client:3,7``, ``class:3``, ``class:3@7`` or ``sample:7:0.1``."""
    full = text.strip()
    kind, _, rest = full.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise RequestError(
            f"request {text!r}: unknown kind {kind!r}; use client:N[,N..], class:C[,C..][@N] "
            "or sample:N:FRACTION"
        )
    if kind == "client":
        return UnlearnRequest("client", clients=_ints(rest, "client ids", full), text=full)
    if kind == "class":
        cls_text, _, who = rest.partition("@")
        classes = _ints(cls_text, "class ids", full)
        clients = _ints(who, "client ids", full) if who else ()
        return UnlearnRequest("class", clients=clients, classes=classes, text=full)
    parts = rest.split(":")
    if len(parts) != 2:
        raise RequestError(f"request {text!r}: sample requests look like sample:CLIENT:FRACTION")
    clients = _ints(parts[0], "client ids", full)
    if parts[1].strip().lower() == "poisoned":
        return UnlearnRequest("sample", clients=clients, text=full, poisoned_only=True)
    try:
        frac = float(parts[1])
    except ValueError as exc:
        raise RequestError(f"request {text!r}: fraction {parts[1]!r} is not a number") from exc
    if not 0.0 < frac <= 1.0:
        raise RequestError(f"request {text!r}: fraction must be in (0, 1], got {frac}")
    return UnlearnRequest("sample", clients=clients, fraction=frac, text=full)


@dataclass
class ResolvedRequest:
    """A request bound to a run: forget and remaining global indices per client."""

    request: UnlearnRequest
    forget: dict[int, np.ndarray]  # client -> global indices of D_u,n (only non-empty entries)
    remaining: list[np.ndarray]  # client -> global indices of D_n minus D_u,n
    protocol: str  # backdoor | label_flip | canary | class | clean: what the forget set carries
    notes: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """tau: client, class or sample."""
        return self.request.kind

    @property
    def targets(self) -> list[int]:
        """C_u: clients holding data to forget, ascending."""
        return sorted(self.forget)

    @property
    def forget_indices(self) -> np.ndarray:
        """D_u as sorted global training indices."""
        if not self.forget:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(list(self.forget.values())))

    @property
    def remaining_indices(self) -> np.ndarray:
        """D_r as sorted global training indices."""
        kept = [r for r in self.remaining if len(r)]
        return np.sort(np.concatenate(kept)) if kept else np.empty(0, np.int64)

    @property
    def removed_clients(self) -> list[int]:
        """Clients left with no data (they no longer take part)."""
        return [n for n, r in enumerate(self.remaining) if len(r) == 0]

    def forget_share(self, n: int, data_size: int) -> float:
        """|D_u,n| / |D_n|: the share of client n's contribution attributed to the forget set."""
        return len(self.forget.get(n, ())) / max(int(data_size), 1)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary (sizes, not index lists)."""
        r = self.request
        return {
            "text": r.text,
            "kind": r.kind,
            "clients": list(r.clients),
            "classes": list(r.classes),
            "fraction": r.fraction,
            "targets": self.targets,
            "forget_size": int(sum(len(v) for v in self.forget.values())),
            "forget_per_client": {str(n): len(v) for n, v in self.forget.items()},
            "remaining_size": int(sum(len(v) for v in self.remaining)),
            "removed_clients": self.removed_clients,
            "protocol": self.protocol,
            "notes": list(self.notes),
        }


def _check_clients(req: UnlearnRequest, n_clients: int) -> None:
    bad = [c for c in req.clients if not 0 <= c < n_clients]
    if bad:
        raise RequestError(
            f"request {req.text!r}: unknown client(s) {bad}; the run has clients 0..{n_clients - 1}"
        )
    if len(set(req.clients)) != len(req.clients):
        raise RequestError(f"request {req.text!r}: a client is listed twice")


def resolve_request(
    req: UnlearnRequest,
    parts: Sequence[np.ndarray],
    labels: torch.Tensor | np.ndarray,
    num_classes: int,
    backdoor_indices: np.ndarray | None = None,
    flipped_indices: np.ndarray | None = None,
    seed: int = 0,
    canary_copies: np.ndarray | None = None,
) -> ResolvedRequest:
    """Bind ``req`` to a run's partitions and labels (as the clients hold them).

    ``canary_copies``: one row per membership canary, the training indices of its copies
    (:class:`scaleflu.fl.data.PoisonInfo`); a sample request takes them as whole rows.
    """
    n_clients = len(parts)
    _check_clients(req, n_clients)
    labels = np.asarray(labels)
    backdoor = np.asarray(backdoor_indices if backdoor_indices is not None else [], np.int64)
    flipped = np.asarray(flipped_indices if flipped_indices is not None else [], np.int64)
    poisoned = np.union1d(backdoor, flipped)
    canaries = (
        np.asarray(canary_copies, np.int64)
        if canary_copies is not None and len(canary_copies)
        else np.empty((0, 1), np.int64)
    )
    forget: dict[int, np.ndarray] = {}
    notes: list[str] = []
    if req.kind == "client":
        for n in req.clients:
            forget[n] = np.asarray(parts[n], np.int64)
    elif req.kind == "class":
        bad = [c for c in req.classes if not 0 <= c < num_classes]
        if bad:
            raise RequestError(
                f"request {req.text!r}: class(es) {bad} outside 0..{num_classes - 1}"
            )
        scope = list(req.clients) if req.clients else list(range(n_clients))
        for n in scope:
            idx = np.asarray(parts[n], np.int64)
            sel = idx[np.isin(labels[idx], req.classes)]
            if len(sel):
                forget[n] = sel
        if not forget:
            where = f"client(s) {list(req.clients)}" if req.clients else "the federation"
            raise RequestError(
                f"request {req.text!r}: class(es) {list(req.classes)} not present in {where}"
            )
        missing = [
            c for c in req.classes if not any(np.any(labels[v] == c) for v in forget.values())
        ]
        if missing:
            raise RequestError(
                f"request {req.text!r}: class(es) {missing} not present in the requested scope"
            )
    else:
        frac = float(req.fraction or 0.0)
        for n in req.clients:
            idx = np.asarray(parts[n], np.int64)
            # the client's canaries (rows whose original it holds), every copy together
            rows = canaries[np.isin(canaries[:, 0], idx)] if len(canaries) else canaries[:0]
            bad = idx[np.isin(idx, poisoned) & ~np.isin(idx, rows)]
            if req.poisoned_only:
                k = len(bad) + rows.size
                if k == 0:
                    raise RequestError(
                        f"request {req.text!r}: client {n} holds no poisoned sample or canary"
                    )
            else:
                k = int(round(frac * len(idx)))
            if k == 0:
                raise RequestError(
                    f"request {req.text!r}: fraction {frac} of client {n}'s {len(idx)} samples "
                    "is an empty forget set"
                )
            n_rows = min(len(rows), k // max(rows.shape[1], 1)) if len(rows) else 0
            if n_rows < len(rows):
                notes.append(f"client {n}: {len(rows) - n_rows} canaries stay (fraction {frac})")
            picked = rows[:n_rows].ravel()
            chosen = np.concatenate([picked, bad[: k - len(picked)]])
            bad = np.concatenate([picked, bad])
            if len(chosen) < k:
                rest = idx[~np.isin(idx, chosen)]
                rng = np.random.default_rng(np.random.SeedSequence([seed, 31, n]))
                extra = rng.choice(rest, size=k - len(chosen), replace=False)
                chosen = np.concatenate([chosen, extra])
                notes.append(
                    f"client {n}: {len(bad)} poisoned samples, {len(extra)} clean samples added "
                    "to reach the requested fraction"
                )
            elif len(bad) > k:
                notes.append(f"client {n}: {len(bad) - k} poisoned samples stay (fraction {frac})")
            forget[n] = np.sort(chosen.astype(np.int64))
    remaining = [
        np.setdiff1d(np.asarray(p, np.int64), forget.get(n, np.empty(0, np.int64)))
        for n, p in enumerate(parts)
    ]
    if all(len(r) == 0 for r in remaining):
        raise RequestError(f"request {req.text!r}: nothing would remain to train on")
    all_forget = np.concatenate(list(forget.values()))
    if req.kind == "class":
        protocol = "class"
    elif np.isin(all_forget, backdoor).any():
        protocol = "backdoor"
    elif np.isin(all_forget, flipped).any():
        protocol = "label_flip"
    elif len(canaries) and np.isin(all_forget, canaries).any():
        protocol = "canary"  # FA (held labels) on canaries: their memorised random labels
    else:
        protocol = "clean"
    if protocol == "clean":
        notes.append("the forget set carries no trigger or flipped label: FA stays near RA")
    res = ResolvedRequest(req, forget, remaining, protocol, notes)
    log.info(
        "request %s: |D_u|=%d over clients %s, protocol %s",
        req.text,
        len(all_forget),
        res.targets,
        protocol,
    )
    return res
