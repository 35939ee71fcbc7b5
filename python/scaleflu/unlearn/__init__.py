"""scaleflu.unlearn: SCALE federated unlearning, the Retrain reference, metrics and audits.

Public API: :class:`UnlearnContext`, :class:`UnlearnResult`, the :class:`Unlearner` protocol,
:class:`ScaleUnlearner`, :class:`RetrainUnlearner`, :func:`parse_request`. No GNU Radio import.
Names resolve lazily, so ``scaleflu --help`` does not pay for torch/stable-baselines3 imports.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "UnlearnContext": "scaleflu.unlearn.base",
    "UnlearnResult": "scaleflu.unlearn.base",
    "Unlearner": "scaleflu.unlearn.base",
    "UnlearningFailedError": "scaleflu.unlearn.base",
    "RequestError": "scaleflu.unlearn.request",
    "UnlearnRequest": "scaleflu.unlearn.request",
    "parse_request": "scaleflu.unlearn.request",
    "RetrainUnlearner": "scaleflu.unlearn.retrain",
    "ScaleUnlearner": "scaleflu.unlearn.scale",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the exported name on first use."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'scaleflu.unlearn' has no attribute {name!r}")
