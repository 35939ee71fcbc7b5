"""Membership canaries (``data.poison.canaries``): memorised samples with held-out twins.

:func:`insert_canaries` relabels pairs of a client's clean same-class samples: one of each pair
is held many times by the client (the canary the model memorises), the other leaves every
partition (its matched non-member). The membership audit compares the two
(:mod:`scaleflu.unlearn.metrics`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError, config_section
from scaleflu.fl.data.images import ImageData
from scaleflu.fl.data.poison import PoisonInfo

log = logging.getLogger(__name__)


def insert_canaries(
    clean: ImageData,
    train: ImageData,
    parts: Sequence[np.ndarray],
    poison_cfg: Mapping[str, Any] | None,
    poison: PoisonInfo,
    seed: int,
) -> tuple[ImageData, ImageData, list[np.ndarray], PoisonInfo]:
    """Membership canaries (``data.poison.canaries``): memorised samples with held-out twins.

    For each client in ``canary_clients``: ``canaries`` pairs of its clean (not triggered, not
    flipped) samples *of the same true class* are drawn (seeded). One of each pair becomes a
    canary: a uniformly random wrong label, held ``canary_copies`` times by the client (copies
    appended to the training set, so the model memorises it, as in Carlini et al.'s Secret
    Sharer and the mislabelled canaries of Steinke et al. 2023); the other gets *the same*
    wrong label and leaves the client's partition: trained on by nobody, it is the canary's
    matched non-member (same true class, same label: a model that saw neither scores the two
    alike, so the audit's null is tight). Returns (clean, train, parts, poison) extended;
    ``canaries: 0`` returns the inputs unchanged (bit-exact runs without canaries).
    """
    cfg = config_section("data.poison", poison_cfg)
    k = int(cfg.canaries)
    copies = int(cfg.canary_copies)
    who = [int(c) for c in cfg.canary_clients]
    if k < 0 or copies < 1:
        raise ConfigError("data.poison.canaries must be >= 0 and canary_copies >= 1")
    if k == 0 or not who:
        return clean, train, list(parts), poison
    n_clients = len(parts)
    bad = [c for c in who if not 0 <= c < n_clients]
    if bad or len(set(who)) != len(who):
        raise ConfigError(
            f"data.poison.canary_clients {who} must be distinct clients in 0..{n_clients - 1}"
        )
    used = np.union1d(poison.backdoor_indices, poison.flipped_indices)
    true = clean.labels.numpy()
    C = train.num_classes
    members: list[int] = []
    held: list[int] = []
    for c in who:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 23, c]))
        cand = rng.permutation(np.setdiff1d(np.asarray(parts[c], np.int64), used))
        pending: dict[int, int] = {}
        got = 0
        for i in cand:  # pair each sample with the next unpaired one of its class
            y = int(true[i])
            if y in pending:
                members.append(pending.pop(y))
                held.append(int(i))
                got += 1
                if got == k:
                    break
            else:
                pending[y] = int(i)
        if got < k:
            raise ConfigError(
                f"data.poison.canaries: client {c} has only {got} same-class pairs of clean "
                f"samples, {k} asked"
            )
    m_idx = np.asarray(members, np.int64)
    h_idx = np.asarray(held, np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 24]))
    both = np.concatenate([m_idx, h_idx])
    shift = torch.as_tensor(rng.integers(1, C, size=len(both))[: len(m_idx)])
    train = train.copy()
    mt, ht = torch.as_tensor(m_idx), torch.as_tensor(h_idx)
    train.labels[mt] = (clean.labels[mt] + shift) % C
    train.labels[ht] = train.labels[mt]  # the twin: same true class, same wrong label
    # the copies: appended to both sets (clean keeps the true label)
    M = len(train)
    extra = np.repeat(m_idx, copies - 1)
    et = torch.as_tensor(extra)
    new_idx = np.arange(M, M + len(extra), dtype=np.int64).reshape(len(m_idx), copies - 1)
    if len(extra):
        train.pixels = torch.cat([train.pixels, train.pixels[et]])
        train.labels = torch.cat([train.labels, train.labels[et]])
        clean = clean.copy()
        clean.pixels = torch.cat([clean.pixels, clean.pixels[et]])
        clean.labels = torch.cat([clean.labels, clean.labels[et]])
    table = np.concatenate([m_idx[:, None], new_idx], axis=1)
    out_parts = [np.asarray(p, np.int64) for p in parts]
    for j, c in enumerate(who):
        rows = slice(j * k, (j + 1) * k)
        out_parts[c] = np.sort(
            np.concatenate([np.setdiff1d(out_parts[c], h_idx[rows]), table[rows, 1:].ravel()])
        )
    poison = PoisonInfo(
        poison.backdoor_indices,
        poison.flipped_indices,
        poison.target_label,
        poison.trigger_size,
        {**poison.original_labels, **{int(i): int(true[i]) for i in both}},
        poison.flip_mode,
        poison.flip_marker,
        table,
        h_idx,
    )
    log.info("%d canaries x %d copies on clients %s", len(m_idx), copies, who)
    return clean, train, out_parts, poison
