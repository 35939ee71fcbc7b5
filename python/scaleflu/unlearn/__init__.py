"""scaleflu.unlearn: SCALE federated unlearning, the Retrain reference, metrics and audits.

Public API: :class:`UnlearnContext`, :class:`UnlearnResult`, the :class:`Unlearner` protocol,
:class:`ScaleUnlearner`, :class:`RetrainUnlearner`, :func:`parse_request`. No GNU Radio import.
"""

from scaleflu.unlearn.base import UnlearnContext, Unlearner, UnlearnResult
from scaleflu.unlearn.request import RequestError, UnlearnRequest, parse_request
from scaleflu.unlearn.retrain import RetrainUnlearner
from scaleflu.unlearn.scale import ScaleUnlearner

__all__ = [
    "RequestError",
    "RetrainUnlearner",
    "ScaleUnlearner",
    "UnlearnContext",
    "UnlearnRequest",
    "UnlearnResult",
    "Unlearner",
    "parse_request",
]
