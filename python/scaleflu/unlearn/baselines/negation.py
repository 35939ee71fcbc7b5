"""NoT (Khalil et al., "NoT: Federated Unlearning via Weight Negation", CVPR 2025).

Storage-free and without the target's data: the server multiplies the weights of the model's
first layer(s) by -1, which breaks the co-adaptation between that layer and the next ones (the
model's outputs become near-random) while the negated parameters stay as far from the origin
as they were and the rest of the network keeps its features, so that a few rounds of ordinary
FedAvg fine-tuning on the retained data restore the task but not what only the forgotten data
taught. The target client takes no part in the fine-tuning when it leaves (client request);
for a class or sample request every client fine-tunes on its data less D_u.

Here (``baselines.not``):

* ``layers`` (1): how many of the first Conv/Linear layers (forward order,
  :func:`scaleflu.fl.models.sensitivity_layers`) have their weights negated; ``negate_bias``
  (false) negates their biases as well.
* ``rounds`` (5): fine-tuning FedAvg rounds on D_r (:meth:`UnlearnContext.fedavg_rounds`: the
  run's selection for rounds T+1.., local epochs ``local_epochs`` (null: ``fl.local_epochs``)).
* Link cost: the negated model's broadcast is the first fine-tuning round's broadcast (the
  clients cannot negate on their own without being told which layers), so the cost is the
  rounds' traffic. No history is read (storage-free) and no D_u sample is touched.

Differences from the paper are listed in docs/reproducing.md ("Baselines against their
reference code"): no public reference code; the number of fine-tuning rounds is fixed here
(the paper reports accuracy over fine-tuning rounds), and the fine-tuning uses the run's local
settings, not a separate learning rate.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from scaleflu.fl.history import state_bytes
from scaleflu.fl.models import sensitivity_layers
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker, annotate
from scaleflu.unlearn.baselines.common import baseline_config

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def negate_layers(
    state: dict[str, torch.Tensor], layers: list[str], bias: bool = False
) -> tuple[State, list[str]]:
    """A copy of ``state`` with the weights of ``layers`` (and their biases) multiplied by -1."""
    out = {k: v.detach().clone() for k, v in state.items()}
    done = []
    for name in layers:
        keys = [name]
        if bias:
            b = name.rsplit(".", 1)[0] + ".bias"
            if b in out:
                keys.append(b)
        for k in keys:
            out[k] = -out[k]
            done.append(k)
    return out, done


class NoTUnlearner:
    """Weight negation of the first layer(s), then FedAvg fine-tuning on the retained data."""

    name = "not"

    def __init__(self, **overrides: Any) -> None:
        """Keyword overrides of ``baselines.not`` (layers, negate_bias, rounds, local_epochs)."""
        self.overrides = overrides
        self.state: State | None = None

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Negate, fine-tune, measure."""
        hp = baseline_config("not", self.overrides, ctx.cfg)
        t0, c0 = time.perf_counter(), time.process_time()
        order = sensitivity_layers(ctx.new_model())
        n = int(hp.layers)
        if not 1 <= n <= len(order):
            raise ValueError(f"baselines.not.layers must be in 1..{len(order)}, got {n}")
        negated, keys = negate_layers(ctx.original_state(), order[:n], bool(hp.negate_bias))
        aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
        first = ctx.run.history.last_completed_round() + 1
        local = ctx.local_config(None if hp.local_epochs is None else int(hp.local_epochs))
        state, cost = ctx.fedavg_rounds(
            negated, int(hp.rounds), first, local, aoi=aoi, desc="NoT fine-tune"
        )
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        self.state = state
        log.info("NoT: negated %s, %d fine-tuning rounds, %.1f s CPU", keys, cost.rounds, cpu)
        res = ctx.make_result(
            "not",
            state,
            wall_s=wall,
            bytes_=cost.bytes,
            link_s=cost.link_s,
            fl_rounds=cost.rounds,
            aoi=aoi,
            details={
                "negated": keys,
                "rounds": cost.rounds,
                "local_epochs": local.epochs,
                "first_round": first,
                "model_bytes": state_bytes(state),
                "hyper_parameters": hp,
            },
            cpu_s=cpu,
        )
        return annotate(res, aoi)
