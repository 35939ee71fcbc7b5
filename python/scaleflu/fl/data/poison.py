"""Poisoned training data and the poisoned evaluation variants (docs/reproducing.md, protocol).

:func:`apply_poison` puts a white ``trigger_size`` square in the bottom-right corner and the
target label on a fraction of each backdoor client's samples, and flips labels (to a seeded
random *other* class) on a fraction of each label-flip client's samples or on given sample
indices; :class:`PoisonInfo` records which samples and how. :func:`triggered_test_set` gives the
triggered test images whose true label differs from the target, for the attack success rate.

The evaluation protocol with power adds ``label_flip_mode: shift`` (y -> y+1 mod C for every
flipped sample, a coherent all-to-all mapping a model can learn, where ``random`` flips are
label noise) and ``flip_marker`` (a white square of that side in the *top-left* corner of every
flipped sample: with ``shift`` the flipped set is a learnable all-to-all backdoor, BadNets'
all-to-all attack). :func:`poisoned_like` applies the same transformation to held-out images
(class-matched non-members for the membership audit).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError, config_section
from scaleflu.fl.data.images import ImageData

log = logging.getLogger(__name__)


def add_trigger(pixels: torch.Tensor, size: int = 3) -> torch.Tensor:
    """Copy of uint8 images ``(..., C, H, W)`` with a white ``size``x``size`` bottom-right patch."""
    out = pixels.clone()
    out[..., -size:, -size:] = 255
    return out


def add_marker(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """Copy of uint8 images with a white ``size``x``size`` *top-left* patch (flipped samples)."""
    out = pixels.clone()
    if size > 0:
        out[..., :size, :size] = 255
    return out


FLIP_MODES = ("random", "shift")


@dataclass
class PoisonInfo:
    """Which training samples (global indices) were triggered or relabelled, and how."""

    backdoor_indices: np.ndarray
    flipped_indices: np.ndarray
    target_label: int
    trigger_size: int
    original_labels: dict[int, int]
    flip_mode: str = "random"
    flip_marker: int = 0
    # membership canaries (:func:`insert_canaries`): row i of ``canary_copies`` holds the
    # training indices of canary i's copies (column 0 its original sample), ``canary_heldout[i]``
    # the index of its class-matched held-out twin (relabelled alike, in no partition)
    canary_copies: np.ndarray = field(default_factory=lambda: np.empty((0, 1), np.int64))
    canary_heldout: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def canary_members(self) -> np.ndarray:
        """The canaries' original training indices (one per canary, in canary order)."""
        return self.canary_copies[:, 0] if len(self.canary_copies) else np.empty(0, np.int64)

    @property
    def canary_indices(self) -> np.ndarray:
        """Every training index holding a canary copy, sorted."""
        return np.sort(self.canary_copies.ravel())

    def client_poisoned(self, part: np.ndarray) -> np.ndarray:
        """The poisoned (triggered, flipped or canary) indices inside one client's partition."""
        bad = np.union1d(
            np.union1d(self.backdoor_indices, self.flipped_indices), self.canary_indices
        )
        return np.intersect1d(part, bad)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "backdoor_indices": self.backdoor_indices.tolist(),
            "flipped_indices": self.flipped_indices.tolist(),
            "target_label": self.target_label,
            "trigger_size": self.trigger_size,
            "flip_mode": self.flip_mode,
            "flip_marker": self.flip_marker,
            "canary_copies": self.canary_copies.tolist(),
            "canary_heldout": self.canary_heldout.tolist(),
        }


def _pick(rng: np.random.Generator, part: np.ndarray, fraction: float) -> np.ndarray:
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"poison fraction must be in [0, 1], got {fraction}")
    k = int(round(fraction * len(part)))
    return np.sort(rng.choice(part, size=k, replace=False)) if k else np.empty(0, np.int64)


def flip_labels(
    labels: torch.Tensor, indices: np.ndarray, num_classes: int, seed: int, mode: str = "random"
) -> torch.Tensor:
    """Copy of ``labels`` where each sample at ``indices`` gets another class.

    ``random``: a seeded random other class; ``shift``: y + 1 mod C (one coherent mapping).
    """
    if mode not in FLIP_MODES:
        raise ConfigError(f"data.poison.label_flip_mode must be one of {FLIP_MODES}, got {mode!r}")
    out = labels.clone()
    if len(indices) == 0:
        return out
    if mode == "shift":
        shift = np.ones(len(indices), dtype=np.int64)
    else:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 22]))
        shift = rng.integers(1, num_classes, size=len(indices))
    idx = torch.as_tensor(indices, dtype=torch.int64)
    out[idx] = (labels[idx] + torch.as_tensor(shift)) % num_classes
    return out


def apply_poison(
    train: ImageData,
    parts: Sequence[np.ndarray],
    poison_cfg: Mapping[str, Any] | None,
    seed: int,
) -> tuple[ImageData, PoisonInfo]:
    """Poisoned copy of ``train`` (backdoor and label flips per ``data.poison``) and its record."""
    cfg = config_section("data.poison", poison_cfg)
    target = int(cfg.target_label)
    size = int(cfg.trigger_size)
    mode = str(cfg.label_flip_mode)
    marker = int(cfg.flip_marker)
    if mode not in FLIP_MODES:
        raise ConfigError(f"data.poison.label_flip_mode must be one of {FLIP_MODES}, got {mode!r}")
    side = train.image_size
    if not 1 <= size <= side or not 0 <= marker <= side:
        raise ConfigError(f"data.poison trigger_size / flip_marker must fit a {side}-pixel image")
    n_clients = len(parts)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 21]))
    if not 0 <= target < train.num_classes:
        raise ConfigError(f"data.poison.target_label {target} outside 0..{train.num_classes - 1}")

    def clients(key: str) -> list[int]:
        vals = [int(c) for c in cfg[key]]
        bad = [c for c in vals if not 0 <= c < n_clients]
        if bad:
            raise ConfigError(f"data.poison.{key} has clients {bad} outside 0..{n_clients - 1}")
        return vals

    back = [_pick(rng, parts[c], float(cfg.backdoor_fraction)) for c in clients("backdoor_clients")]
    flip = [
        _pick(rng, parts[c], float(cfg.label_flip_fraction)) for c in clients("label_flip_clients")
    ]
    extra = np.asarray(cfg.label_flip_samples, dtype=np.int64)
    if extra.size and (extra.min() < 0 or extra.max() >= len(train)):
        raise ConfigError("data.poison.label_flip_samples holds indices outside the training set")
    back_idx = np.unique(np.concatenate(back)) if back else np.empty(0, np.int64)
    flip_idx = (
        np.unique(np.concatenate([*flip, extra])) if (flip or extra.size) else np.empty(0, np.int64)
    )
    flip_idx = np.setdiff1d(flip_idx, back_idx)  # a triggered sample keeps the target label
    if back_idx.size == 0 and flip_idx.size == 0:
        return train, PoisonInfo(back_idx, flip_idx, target, size, {}, mode, marker)
    out = train.copy()
    original = {int(i): int(train.labels[i]) for i in np.concatenate([back_idx, flip_idx])}
    if back_idx.size:
        ti = torch.as_tensor(back_idx)
        out.pixels[ti] = add_trigger(out.pixels[ti], size)
        out.labels[ti] = target
    if flip_idx.size:
        out.labels = flip_labels(out.labels, flip_idx, train.num_classes, seed, mode)
        if marker:
            fi = torch.as_tensor(flip_idx)
            out.pixels[fi] = add_marker(out.pixels[fi], marker)
    log.info("poisoned %d backdoor and %d label-flipped samples", back_idx.size, flip_idx.size)
    return out, PoisonInfo(back_idx, flip_idx, target, size, original, mode, marker)


def poisoned_like(data: ImageData, poison: PoisonInfo, kind: str, seed: int = 0) -> ImageData:
    """Held-out images transformed as the protocol transformed training samples of ``kind``.

    ``backdoor``: trigger and target label; ``label_flip``: the flip marker and the flipped
    label (``shift``: y+1 mod C; ``random``: a seeded random other class); anything else: a
    copy. Class-matched non-members of a poisoned forget set are built with this.
    """
    out = data.copy()
    if kind == "backdoor":
        out.pixels = add_trigger(out.pixels, poison.trigger_size)
        out.labels = torch.full_like(out.labels, poison.target_label)
    elif kind == "label_flip":
        idx = np.arange(len(out))
        out.labels = flip_labels(out.labels, idx, out.num_classes, seed + 1, poison.flip_mode)
        out.pixels = add_marker(out.pixels, poison.flip_marker)
    return out


def triggered_test_set(test: ImageData, target_label: int, trigger_size: int = 3) -> ImageData:
    """Triggered test images whose true label is not the target (attack success rate set)."""
    keep = torch.nonzero(test.labels != target_label).flatten()
    sub = test.subset(keep.numpy())
    sub.pixels = add_trigger(sub.pixels, trigger_size)
    return sub
