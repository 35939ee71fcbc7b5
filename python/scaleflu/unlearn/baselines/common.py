"""Helpers the baselines share: baseline config, fresh AoI clocks, link cost of model transfers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from scaleflu.config import Section
from scaleflu.fl.history import state_bytes
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker
from scaleflu.unlearn.registry import hyper_parameters

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def baseline_config(
    name: str, overrides: Mapping[str, Any] | None = None, cfg: Mapping[str, Any] | None = None
) -> Section:
    """``baselines.<name>``: defaults, then ``cfg``'s section, then ``overrides``, typed and
    checked by the one merge, :func:`scaleflu.unlearn.registry.hyper_parameters`."""
    return Section(hyper_parameters(name, cfg, overrides))


def fresh_aoi(ctx: UnlearnContext) -> tuple[RecordingAoITracker, float, int]:
    """AoI clocks restarted at the broadcast of the initial model (methods that rebuild from t=1).

    Returns the tracker, the link seconds and the bytes of that initial broadcast.
    """
    init = ctx.initial_state()
    nbytes = state_bytes(init)
    initial_s = ctx.link.seconds(nbytes)
    aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
    aoi.last_round = np.zeros_like(aoi.last_round)
    aoi.last_s = np.full_like(aoi.last_s, initial_s)
    aoi.now_round, aoi.now_s = 0.0, initial_s
    return aoi, initial_s, nbytes


def round_link(
    ctx: UnlearnContext, down_bytes: int, up_bytes: int, uploads: int
) -> tuple[int, float]:
    """Bytes and link seconds of one broadcast of ``down_bytes`` plus ``uploads`` uploads.

    Uploads are charged only when the run's link model counts the uplink (as FedAvg rounds do).
    """
    nbytes = int(down_bytes)
    link_s = ctx.link.seconds(down_bytes)
    if ctx.link.count_uplink and uploads:
        nbytes += uploads * int(up_bytes)
        link_s += uploads * ctx.link.seconds(up_bytes)
    return nbytes, link_s


def param_names(ctx: UnlearnContext) -> list[str]:
    """Names of the model's trainable parameters (state-dict keys)."""
    return [k for k, _ in ctx.new_model().named_parameters()]
