"""Baselines behind the :class:`~scaleflu.unlearn.base.Unlearner` interface and the registry.

``get_method(name, cfg, **hyper_parameters)`` (the one registry,
:func:`scaleflu.unlearn.registry.make_method`) gives an Unlearner for any registered method:
``retrain``, ``scale``, ``fedraser`` (FedEraser), ``pga`` (projected gradient ascent), ``fused``
(FUSED adapters), ... Hyper-parameters default to ``baselines.<name>`` in the config.
"""

from scaleflu.unlearn.baselines.fedraser import FedEraserUnlearner
from scaleflu.unlearn.baselines.fused import FusedUnlearner, drop_adapters, merge_adapters
from scaleflu.unlearn.baselines.pga import PGAUnlearner
from scaleflu.unlearn.registry import make_method as get_method
from scaleflu.unlearn.registry import method_names

METHOD_NAMES = method_names()

__all__ = [
    "METHOD_NAMES",
    "FedEraserUnlearner",
    "FusedUnlearner",
    "PGAUnlearner",
    "drop_adapters",
    "get_method",
    "merge_adapters",
]
