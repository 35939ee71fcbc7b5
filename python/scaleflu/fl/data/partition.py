"""Client partitions of a training set: IID, Dirichlet label skew, and grown clients.

Partitions (:func:`partition_iid`, :func:`partition_dirichlet`) are deterministic functions of
the seed. Dirichlet: for every class, proportions ``p ~ Dir(alpha * 1_N)`` split that class's
shuffled samples among the N clients. A client left with no sample then takes one sample from
the currently largest client (lowest index on ties), repeatedly, so every client holds at
least one sample and every sample is assigned exactly once. :func:`grow_clients` gives listed
clients a share of the training set taken at random from the others (the evaluation protocol's
``backdoor_share`` / ``label_flip_share``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError, config_section


def partition_iid(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle and split into ``num_clients`` parts of sizes differing by at most one."""
    if num_clients < 1 or num_samples < num_clients:
        raise ConfigError(
            f"cannot give {num_clients} clients at least one sample each from {num_samples}"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    perm = rng.permutation(num_samples)
    return [np.sort(p) for p in np.array_split(perm, num_clients)]


def partition_dirichlet(
    labels: np.ndarray | torch.Tensor, num_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Label-skewed split: per class, Dir(alpha) proportions over clients; >=1 sample each."""
    labels = np.asarray(labels)
    if alpha <= 0:
        raise ConfigError(f"Dirichlet alpha must be > 0, got {alpha}")
    if num_clients < 1 or len(labels) < num_clients:
        raise ConfigError(
            f"cannot give {num_clients} clients at least one sample each from {len(labels)}"
        )
    rng = np.random.default_rng(np.random.SeedSequence([seed, 12]))
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        props = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
        for n, chunk in enumerate(np.split(idx, cuts)):
            parts[n].extend(chunk.tolist())
    # Every client gets >= 1 sample: an empty client takes one from the currently largest.
    for n in range(num_clients):
        if not parts[n]:
            donor = max(range(num_clients), key=lambda k: (len(parts[k]), -k))
            parts[n].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def make_partitions(
    data_cfg: Mapping[str, Any], labels: torch.Tensor, seed: int
) -> list[np.ndarray]:
    """Partitions of the training set for the ``data`` config section.

    ``data.poison.backdoor_share`` / ``label_flip_share`` then grow the listed clients
    (:func:`grow_clients`).
    """
    data = config_section("data", data_cfg)  # partition: the checked choice iid | dirichlet
    n = int(data.num_clients)
    if data.partition == "iid":
        parts = partition_iid(len(labels), n, seed)
    else:
        parts = partition_dirichlet(labels.numpy(), n, float(data.alpha), seed)
    poison = data.poison
    shares: dict[int, float] = {}
    for clients_key, share_key in (
        ("backdoor_clients", "backdoor_share"),
        ("label_flip_clients", "label_flip_share"),
    ):
        share = poison[share_key]
        if share is None:
            continue
        for c in poison[clients_key]:
            shares[int(c)] = float(share)
    return grow_clients(parts, shares, seed) if shares else parts


def grow_clients(
    parts: Sequence[np.ndarray], shares: Mapping[int, float], seed: int
) -> list[np.ndarray]:
    """Give each client ``c`` in ``shares`` ``round(share * total)`` samples (never fewer).

    The extra samples are drawn uniformly at random (seeded) from the clients not in
    ``shares``; every client keeps at least one sample and every sample stays assigned once.
    """
    parts = [np.asarray(p, dtype=np.int64) for p in parts]
    n = len(parts)
    total = sum(len(p) for p in parts)
    bad = [c for c in shares if not 0 <= int(c) < n]
    if bad:
        raise ConfigError(f"data.poison share for clients {bad} outside 0..{n - 1}")
    for c, sh in shares.items():
        if not 0.0 < float(sh) < 1.0:
            raise ConfigError(f"data.poison share of client {c} must be in (0, 1), got {sh}")
    if sum(float(v) for v in shares.values()) >= 1.0:
        raise ConfigError("data.poison shares of the grown clients must sum to less than 1")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 13]))
    donors = [k for k in range(n) if k not in shares]
    if not donors:
        raise ConfigError("data.poison shares leave no other client to take samples from")
    # the donors' samples, minus one kept by each donor, in a seeded random order
    pool = rng.permutation(np.concatenate([parts[k][1:] for k in donors]))
    taken: set[int] = set()
    pos = 0
    for c in sorted(int(k) for k in shares):
        want = int(round(float(shares[c]) * total)) - len(parts[c])
        if want <= 0:
            continue
        if pos + want > len(pool):
            raise ConfigError(f"data.poison share of client {c} needs more samples than exist")
        extra = pool[pos : pos + want]
        pos += want
        taken.update(int(i) for i in extra)
        parts[c] = np.sort(np.concatenate([parts[c], extra]))
    if taken:
        gone = np.fromiter(taken, dtype=np.int64)
        for k in donors:
            parts[k] = np.setdiff1d(parts[k], gone)
    return parts
