"""Images in memory: raw ``uint8`` tensors ``(M, C, H, W)`` with labels, normalised on access.

Holding raw bytes and normalising per batch (:meth:`ImageData.inputs`) means a trigger patch is
written on the pixel scale and CIFAR-100 needs 150 MB rather than 600 MB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class ImageData:
    """Images as raw ``uint8`` ``(M, C, H, W)`` with int64 labels; normalised on access."""

    pixels: torch.Tensor
    labels: torch.Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]
    num_classes: int
    name: str = ""
    _mean_t: torch.Tensor = field(init=False, repr=False)
    _std_t: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pixels.dtype != torch.uint8 or self.pixels.dim() != 4:
            raise ValueError("pixels must be a uint8 tensor of shape (M, C, H, W)")
        if self.labels.shape != (self.pixels.shape[0],):
            raise ValueError("labels must have one entry per image")
        self.labels = self.labels.to(torch.int64)
        c = self.pixels.shape[1]
        dev = self.pixels.device
        self._mean_t = torch.tensor(self.mean, dtype=torch.float32, device=dev).view(1, c, 1, 1)
        self._std_t = torch.tensor(self.std, dtype=torch.float32, device=dev).view(1, c, 1, 1)
        self._mean_t, self._std_t = self._mean_t * 255.0, self._std_t * 255.0

    def __len__(self) -> int:
        return int(self.pixels.shape[0])

    @property
    def in_channels(self) -> int:
        """Number of image channels."""
        return int(self.pixels.shape[1])

    @property
    def image_size(self) -> int:
        """Side of the (square) images."""
        return int(self.pixels.shape[2])

    def inputs(self, idx: torch.Tensor | np.ndarray | slice | None = None) -> torch.Tensor:
        """Normalised float32 images at ``idx`` (all when None), on the data's device."""
        if isinstance(idx, torch.Tensor) and idx.device != self.pixels.device:
            idx = idx.to(self.pixels.device)
        px = self.pixels if idx is None else self.pixels[idx]
        return (px.to(torch.float32) - self._mean_t) / self._std_t

    @property
    def device(self) -> torch.device:
        """Where the pixels and labels are held."""
        return self.pixels.device

    def to(self, device: torch.device | str) -> ImageData:
        """The same data set on ``device`` (``self`` when it is already there)."""
        device = torch.device(device)
        if self.pixels.device == device:
            return self
        out = ImageData(
            self.pixels.to(device),
            self.labels.to(device),
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )
        return out

    def subset(self, idx: torch.Tensor | np.ndarray) -> ImageData:
        """A new data set holding the samples at ``idx`` (copies)."""
        idx_t = torch.as_tensor(np.asarray(idx), dtype=torch.int64)
        if idx_t.dim() == 1 and not bool((idx_t < 0).any()):
            # index_select copies the rows indexing would (once, without a second clone)
            pixels, labels = self.pixels.index_select(0, idx_t), self.labels.index_select(0, idx_t)
        else:
            pixels, labels = self.pixels[idx_t].clone(), self.labels[idx_t].clone()
        return ImageData(
            pixels,
            labels,
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )

    def copy(self) -> ImageData:
        """A deep copy (poisoning works on copies)."""
        return ImageData(
            self.pixels.clone(),
            self.labels.clone(),
            self.mean,
            self.std,
            self.num_classes,
            self.name,
        )
