"""The fine-tune control: k plain FedAvg rounds of the remaining clients from the trained model.

No unlearning at all: the trained global model Theta continues FedAvg with the remaining
clients (D_r: removed clients left out, every client's forgotten samples removed), with the
run's local settings and the run's per-round client selection for rounds T+1..T+k (the same
rounds SCALE's recovery uses). A method whose forgetting (backdoor ASR, FA on learned samples,
calibrated MIA) is no better than this control at equal RA has not shown that it unlearns.

k (``baselines.finetune``):

* ``rounds``: null = SCALE's ``scale.recovery_rounds`` (at least 1); local epochs null =
  ``scale.recovery_local_epochs`` (null there: ``fl.local_epochs``), as SCALE's recovery.
* ``budget_cpu_s`` (the cost-matched control): when set, rounds run one at a time until the
  process CPU time spent reaches the budget (at least one round, at most ``max_rounds``);
  the table harness sets it to SCALE's measured CPU time on the same request (method name
  ``finetune_matched``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from scaleflu.fl.history import state_bytes
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker, annotate
from scaleflu.unlearn.baselines.common import baseline_config

log = logging.getLogger(__name__)


class FinetuneUnlearner:
    """The control: k FedAvg rounds with the remaining clients, starting from Theta."""

    name = "finetune"

    def __init__(self, **overrides: Any) -> None:
        """Keyword overrides of ``baselines.finetune`` (rounds, local_epochs, budget_cpu_s, ...)."""
        self.overrides = overrides
        self.state: dict[str, Any] | None = None

    def settings(self, ctx: UnlearnContext) -> dict[str, Any]:
        """The resolved k, local epochs, CPU budget and round cap for ``ctx``."""
        hp = baseline_config("finetune", self.overrides, ctx.cfg)
        sc = ctx.scale_cfg
        rounds = hp.rounds
        if rounds is None:
            rounds = max(1, int(sc.recovery_rounds or 0))
        epochs = hp.local_epochs
        if epochs is None:
            epochs = sc.recovery_local_epochs
        budget = hp.budget_cpu_s
        cap = hp.max_rounds
        cap = int(cap) if cap is not None else int(ctx.cfg.fl.rounds)
        if int(rounds) < 1 or cap < 1:
            raise ValueError(f"finetune needs at least one round (rounds {rounds}, cap {cap})")
        if budget is not None and float(budget) < 0:
            raise ValueError(f"baselines.finetune.budget_cpu_s must be >= 0, got {budget}")
        return {
            "rounds": int(rounds),
            "local_epochs": None if epochs is None else int(epochs),
            "budget_cpu_s": None if budget is None else float(budget),
            "max_rounds": cap,
        }

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """k plain FedAvg rounds on D_r from Theta; measure."""
        hp = self.settings(ctx)
        t0 = time.perf_counter()
        c0 = time.process_time()
        state = ctx.original_state()
        aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
        local = ctx.local_config(hp["local_epochs"])
        first = ctx.run.history.last_completed_round() + 1
        nbytes, link_s, rounds_done, round_cpu = 0, 0.0, 0, []
        budget = hp["budget_cpu_s"]
        target = hp["rounds"] if budget is None else hp["max_rounds"]
        for i in range(target):
            if budget is not None and rounds_done and time.process_time() - c0 >= budget:
                break
            r0 = time.process_time()
            state, cost = ctx.fedavg_rounds(
                state, 1, first + i, local, aoi=aoi, desc=f"fine-tune {i + 1}"
            )
            round_cpu.append(time.process_time() - r0)
            nbytes += cost.bytes
            link_s += cost.link_s
            rounds_done += cost.rounds
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        self.state = state
        log.info("fine-tune control: %d rounds, %.1f s CPU", rounds_done, cpu)
        res = ctx.make_result(
            "finetune",
            state,
            wall_s=wall,
            bytes_=nbytes,
            link_s=link_s,
            fl_rounds=rounds_done,
            aoi=aoi,
            details={
                "rounds": rounds_done,
                "rounds_requested": hp["rounds"] if budget is None else None,
                "budget_cpu_s": budget,
                "round_cpu_s": round_cpu,
                "local_epochs": local.epochs,
                "first_round": first,
                "model_bytes": state_bytes(state),
            },
            cpu_s=cpu,
        )
        return annotate(res, aoi)


class MatchedFinetuneUnlearner(FinetuneUnlearner):
    """The cost-matched control: as many rounds as fit in ``match_cost_of``'s CPU time.

    The harness (experiments/harness) reads the CPU time of the ``match_cost_of`` method's
    result on the same request and sets ``budget_cpu_s`` before :meth:`run`.
    """

    name = "finetune_matched"
    match_cost_of = "scale"

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """As the control, with the CPU budget required."""
        if baseline_config("finetune", self.overrides, ctx.cfg).budget_cpu_s is None:
            raise ValueError(
                "finetune_matched needs baselines.finetune.budget_cpu_s (the harness sets it "
                f"from the {self.match_cost_of} result of the same request)"
            )
        res = super().run(ctx)
        res.method = self.name
        return res
