"""Model-sized tensor sets for the link's tests and benchmarks (numpy only, no torch).

``LENET_SHAPES`` is the state dict of ``scaleflu.fl.models`` LeNet-5 on 28x28 grey images
(61,706 parameters, 247 kB as float32); ``tests/fl`` checks that the two agree.
"""

from __future__ import annotations

import numpy as np

LENET_SHAPES: dict[str, tuple[int, ...]] = {
    "conv1.weight": (6, 1, 5, 5),
    "conv1.bias": (6,),
    "conv2.weight": (16, 6, 5, 5),
    "conv2.bias": (16,),
    "fc1.weight": (120, 400),
    "fc1.bias": (120,),
    "fc2.weight": (84, 120),
    "fc2.bias": (84,),
    "fc3.weight": (10, 84),
    "fc3.bias": (10,),
}


def lenet_like(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random float32 arrays shaped like LeNet-5."""
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in LENET_SHAPES.items()}
