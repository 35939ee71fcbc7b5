"""Baselines behind the :class:`~scaleflu.unlearn.base.Unlearner` interface and the registry.

``get_method(name, **hyper_parameters)`` gives an Unlearner for ``retrain``, ``scale``,
``fedraser`` (FedEraser), ``pga`` (projected gradient ascent) or ``fused`` (FUSED adapters).
Hyper-parameters default to ``baselines.<name>`` in the config (the papers' values).
"""

from scaleflu.unlearn.baselines.fedraser import FedEraserUnlearner
from scaleflu.unlearn.baselines.fused import FusedUnlearner, drop_adapters, merge_adapters
from scaleflu.unlearn.baselines.pga import PGAUnlearner
from scaleflu.unlearn.baselines.registry import METHOD_NAMES, get_method

__all__ = [
    "METHOD_NAMES",
    "FedEraserUnlearner",
    "FusedUnlearner",
    "PGAUnlearner",
    "drop_adapters",
    "get_method",
    "merge_adapters",
]
