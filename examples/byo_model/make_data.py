#!/usr/bin/env python3
"""Write a small image data set as .npz files: 16x16 grey shapes in 6 classes.

    python examples/byo_model/make_data.py [--out examples/byo_model/data] [--seed 0]

``train.npz`` and ``test.npz`` each hold ``images`` (uint8, (M, 16, 16)) and ``labels``
(int64, (M,)): a filled square, an empty square, a disc, a ring, a plus and a cross, at random
positions and sizes, with noise. Plain arrays (saved without pickles).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SIDE = 16
CLASSES = ("square", "frame", "disc", "ring", "plus", "cross")


def draw(kind: int, rng: np.random.Generator) -> np.ndarray:
    r = rng.integers(3, 6)
    cy, cx = rng.integers(r + 1, SIDE - r - 1, size=2)
    yy, xx = np.mgrid[:SIDE, :SIDE]
    dy, dx = yy - cy, xx - cx
    d = np.hypot(dy, dx)
    box = np.maximum(abs(dy), abs(dx))
    mask = [
        box <= r,
        (box <= r) & (box >= r - 1),
        d <= r,
        (d <= r) & (d >= r - 1.2),
        ((abs(dy) <= 1) & (abs(dx) <= r)) | ((abs(dx) <= 1) & (abs(dy) <= r)),
        ((abs(dy - dx) <= 1) | (abs(dy + dx) <= 1)) & (box <= r),
    ][kind]
    img = rng.normal(30, 15, (SIDE, SIDE)) + mask * rng.uniform(150, 220)
    return np.clip(img, 0, 255).astype(np.uint8)


def make(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, len(CLASSES), size=n)
    images = np.stack([draw(int(k), rng) for k in labels])
    return images, labels.astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    ap.add_argument("--train", type=int, default=3000)
    ap.add_argument("--test", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", args.train), ("test", args.test)):
        images, labels = make(n, rng)
        np.savez_compressed(args.out / f"{name}.npz", images=images, labels=labels)
    print(f"wrote {args.out}/train.npz ({args.train}) and test.npz ({args.test}), {SIDE}x{SIDE}")


if __name__ == "__main__":
    main()
