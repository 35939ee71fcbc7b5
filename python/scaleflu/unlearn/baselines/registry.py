"""``get_method(name)``: one Unlearner per method name, hyper-parameters from the config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scaleflu.unlearn.base import Unlearner

METHOD_NAMES = ("retrain", "scale", "fedraser", "pga", "fused", "finetune", "finetune_matched")
ALIASES = {"federaser": "fedraser", "fe": "fedraser", "f-e": "fedraser"}


def get_method(name: str, cfg: Mapping[str, Any] | None = None, **overrides: Any) -> Unlearner:
    """The Unlearner for ``name`` (retrain | scale | fedraser | pga | fused).

    ``cfg`` (a resolved config) supplies ``baselines.<name>``; keyword ``overrides`` win.
    For ``scale`` the keyword ``mode`` (paper | default) is accepted; for ``retrain``
    ``rounds``.
    """
    key = ALIASES.get(name.lower(), name.lower())
    section = dict(((cfg or {}).get("baselines") or {}).get(key) or {})
    section.update(overrides)
    if key == "retrain":
        from scaleflu.unlearn.baselines.aoi_trace import TracedRetrainUnlearner

        rounds = section.get("rounds")
        return TracedRetrainUnlearner(int(rounds) if rounds is not None else None)
    if key == "scale":
        from scaleflu.unlearn.scale import ScaleUnlearner

        return ScaleUnlearner(section.get("mode"))
    if key == "fedraser":
        from scaleflu.unlearn.baselines.fedraser import FedEraserUnlearner

        return FedEraserUnlearner(**section)
    if key == "pga":
        from scaleflu.unlearn.baselines.pga import PGAUnlearner

        return PGAUnlearner(**section)
    if key == "fused":
        from scaleflu.unlearn.baselines.fused import FusedUnlearner

        return FusedUnlearner(**section)
    if key in ("finetune", "finetune_matched"):  # the control (matched: SCALE's CPU time)
        from scaleflu.unlearn.baselines.finetune import make_finetune

        return make_finetune(key, cfg, **overrides)
    raise ValueError(f"unknown unlearning method {name!r}; choose one of {', '.join(METHOD_NAMES)}")
