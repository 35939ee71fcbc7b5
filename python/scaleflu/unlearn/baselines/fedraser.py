"""FedEraser (Liu et al., IWQoS 2021): rebuild the model from the stored history with calibration.

Follows the reference code (Zoybzo/FedEraser-Code): the calibration rounds are every
``interval``-th round of the original run, ``t_1 = 1, t_2 = 1 + interval, ...``. From the
initial model Theta'[t_1] = Theta[1], each calibration round k

* takes the *old* update of the remaining participants of round t_k from the history
  (weighted FedAvg mean of ``Theta_{n,E}[t_k] - Theta[t_k]``),
* has the same participants train from Theta'[t_k] for ``ceil(ratio * E)`` local epochs on
  their remaining data (the *calibration* training), giving the new update,
* and sets, per parameter tensor l, ``Theta'[t_{k+1}]_l = Theta'[t_k]_l + ||old_l|| *
  new_l / ||new_l||``: the old step length, the calibrated direction.

As in the reference code the first interval needs no calibration (Theta'[t_1] = Theta[t_1]),
so its new step is the old update itself. Float buffers (BatchNorm statistics) take the
calibrated clients' mean; integer buffers their maximum.

Class and sample requests (the paper covers client removal only): participants keep their
remaining data for the calibration training, the forget samples are never trained on, and the
old step lengths come from the stored updates (which saw those samples) -- the natural reading
used when FedEraser is compared on these scenarios.

Cost: each calibration round is one broadcast plus one upload per participant (link model of
the run), like a FedAvg round; the old updates come from the server's history (no link).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import torch
from tqdm import tqdm

from scaleflu.fl.aggregation import aggregate
from scaleflu.fl.fedavg import make_trainer
from scaleflu.fl.history import state_bytes
from scaleflu.unlearn.aoi import changed_groups
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.baselines.aoi_trace import annotate
from scaleflu.unlearn.baselines.common import baseline_config, fresh_aoi, param_names, round_link

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def calibrated_step(
    current: Mapping[str, torch.Tensor],
    old_update: Mapping[str, torch.Tensor],
    new_update: Mapping[str, torch.Tensor],
    params: list[str],
    eps: float = 1e-12,
) -> State:
    """FedEraser's update: per tensor, old step length times the unit calibrated direction."""
    out: State = {k: v.detach().clone() for k, v in current.items()}
    for k in params:
        new = new_update[k].float()
        norm_new = float(new.norm())
        if norm_new <= eps:
            continue  # nothing learned in this tensor: keep it
        length = float(old_update[k].float().norm())
        out[k] = (current[k].float() + length * new / norm_new).to(current[k].dtype)
    return out


class FedEraserUnlearner:
    """FedEraser as an :class:`~scaleflu.unlearn.base.Unlearner`."""

    name = "fedraser"

    def __init__(self, **overrides: Any) -> None:
        """Keyword overrides of ``baselines.fedraser`` (interval, calibration_ratio, ...)."""
        self.overrides = overrides

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Calibrated reconstruction from the history; measure the result."""
        hp = baseline_config("fedraser", self.overrides, ctx.cfg)
        interval = int(hp.interval)
        ratio = float(hp.calibration_ratio)
        if interval < 1 or not 0.0 < ratio:
            raise ValueError(f"fedraser: interval must be >= 1 and ratio > 0, got {hp}")
        t0 = time.perf_counter()
        history = ctx.run.history
        T = history.last_completed_round()
        cal_rounds = list(range(1, T + 1, interval))
        E = int(ctx.cfg.fl.local_epochs)
        cal_epochs = max(1, math.ceil(ratio * E))
        local = ctx.local_config(cal_epochs)
        parts = ctx.request.remaining
        sizes = {n: len(p) for n, p in enumerate(parts)}
        strategy = ctx.strategy()  # the run's round: its aggregation and BatchNorm re-estimation
        fl = ctx.cfg.fl
        kind = fl.trainer if fl.backend == "local" else "auto"
        trainer = make_trainer(
            kind, ctx.new_model(), ctx.run.setup.train, parts, local, ctx.seed, device=ctx.device
        )
        params = param_names(ctx)
        aoi, init_s, init_bytes = fresh_aoi(ctx)
        cur = ctx.initial_state()
        model_bytes = state_bytes(cur)
        nbytes, link_s, fl_rounds, skipped = init_bytes, init_s, 0, []
        trace: list[float] = []
        for k, t in enumerate(
            tqdm(cal_rounds, desc="FedEraser", unit="round", disable=not ctx.progress, leave=False)
        ):
            clients = [n for n in history.participants(t) if sizes[n] > 0]
            if not clients or not history.has_updates(t):
                skipped.append(t)
                continue
            ups = history.client_updates(t)
            weights = {n: sizes[n] for n in clients}
            old = aggregate({n: ups[n] for n in clients}, weights)
            if k == 0:
                # Theta'[t_1] = Theta[t_1]: the old step is already calibrated
                nxt = {key: cur[key] + old[key] if key in old else cur[key] for key in cur}
                nxt = strategy.recalibrate(nxt)  # fl.bn_recalibration: as the run's training did
            else:

                def calibrate(new_global: State, cur: State = cur, old: State = old) -> State:
                    """The calibrated step: old length, the aggregate's direction; buffers as
                    aggregated by the calibrated clients."""
                    new = {key: new_global[key] - cur[key] for key in params}
                    out = calibrated_step(cur, old, new, params)
                    for key, v in new_global.items():
                        if key not in params:
                            out[key] = v
                    return out

                states = trainer.train(cur, clients, t)
                nxt = strategy.aggregate_train(t, cur, states, adjust=calibrate).state
            # Round t_1 is computed at the server from the history (no link, no FL round).
            b, s = round_link(ctx, model_bytes, model_bytes, len(clients)) if k else (0, 0.0)
            nbytes += b
            link_s += s
            aoi.full_round(s, changed_groups(cur, nxt, ctx.groups, ctx.link_tol))
            trace.append(float(aoi.total()["aoi_s"]))
            cur = nxt
            fl_rounds += 1 if k else 0
        if skipped:
            log.warning(
                "fedraser: rounds %s skipped (no remaining participant or no updates)", skipped
            )
        wall = time.perf_counter() - t0
        self.state = cur
        res = ctx.make_result(
            "fedraser",
            cur,
            wall_s=wall,
            bytes_=nbytes,
            link_s=link_s,
            fl_rounds=fl_rounds,
            aoi=aoi,
            sum_aoi_trace=trace,
            details={
                "interval": interval,
                "calibration_ratio": ratio,
                "calibration_epochs": cal_epochs,
                "calibration_rounds": cal_rounds,
                "skipped_rounds": skipped,
                "hyper_parameters": hp,
            },
        )
        return annotate(res, aoi)
