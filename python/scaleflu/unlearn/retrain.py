"""Retrain: FedAvg from the initial model on the remaining data only (the reference method).

Same config, seed, initial model Theta[1] and per-round client selection as the original run;
clients left without data are skipped in the rounds that selected them, and every client
trains on D_n minus D_u,n. With ``seed`` set it is an *independent* Retrain instead: a fresh
initial model, client selection and batch order drawn from that seed (two such models are
equally valid references; how far apart they lie is the noise floor of any "within x of
Retrain" target, measured by ``benchmarks/unlearn_bench.py --sweep --noise-floor``).
Training uses the FL runtime's trainer and aggregation (:meth:`UnlearnContext.fedavg_rounds`).
AoI is tracked from a fresh start (every group last updated by the initial broadcast) with a
recording tracker, so ``details`` carries the AoI trace and its time average wherever Retrain
runs (CLI, table2, testbed, benchmarks).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from scaleflu.fl.fedavg import derive_seed
from scaleflu.fl.history import state_bytes
from scaleflu.fl.models import build_model
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker, annotate

log = logging.getLogger(__name__)


class RetrainUnlearner:
    """Train from scratch on D_r with the run's FL settings."""

    name = "retrain"

    def __init__(self, rounds: int | None = None, seed: int | None = None) -> None:
        """``rounds``: FedAvg rounds (None: the run's ``fl.rounds``); ``seed``: see the module."""
        self.rounds = rounds
        self.seed = seed

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Retrain and measure."""
        t0 = time.perf_counter()
        c0 = time.process_time()
        rounds = int(self.rounds if self.rounds is not None else ctx.cfg.fl.rounds)
        if self.seed is None:
            init = ctx.initial_state()
        else:
            import torch

            with torch.random.fork_rng(devices=[]):  # the caller's RNG stays as it was
                torch.manual_seed(derive_seed(int(self.seed), 17))
                model = build_model(*ctx.run.setup.model_args())
            init = {k: v.detach().clone() for k, v in model.state_dict().items()}
        aoi = self.make_tracker(ctx)
        initial_s = ctx.link.seconds(state_bytes(init))
        aoi.last_round = np.zeros_like(aoi.last_round)
        aoi.last_s = np.full_like(aoi.last_s, initial_s)
        aoi.now_round, aoi.now_s = 0.0, initial_s
        state, cost = ctx.fedavg_rounds(init, rounds, 1, aoi=aoi, desc="Retrain", seed=self.seed)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        self.state = state
        result = ctx.make_result(
            "retrain",
            state,
            wall_s=wall,
            bytes_=cost.bytes + state_bytes(init),
            link_s=cost.link_s + initial_s,
            fl_rounds=cost.rounds,
            aoi=aoi,
            details={"rounds": rounds, "seed": self.seed},
            cpu_s=cpu,
        )
        return self.finish(result, aoi)

    def make_tracker(self, ctx: UnlearnContext) -> AoITracker:
        """The AoI tracker the retraining updates (recording its trace)."""
        return RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))

    def finish(self, result: UnlearnResult, aoi: AoITracker) -> UnlearnResult:
        """Add the recorded trace and its time-average AoI to ``details``."""
        return annotate(result, aoi)
