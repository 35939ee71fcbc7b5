"""The fine-tune control: k plain FedAvg rounds of D_r from Theta, and its cost-matched variant."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from scaleflu.unlearn.baselines import get_method
from scaleflu.unlearn.baselines.finetune import FinetuneUnlearner, MatchedFinetuneUnlearner
from tiny_run_helpers import needs_fmnist, tiny_config

pytestmark = needs_fmnist


def test_finetune_is_k_fedavg_rounds_of_the_remaining_clients(make_ctx: Any) -> None:
    """Default k = scale.recovery_rounds (1): bit-exact the run's round T+1 on D_r from Theta."""
    ctx = make_ctx("client:0")
    m = get_method("finetune", tiny_config())
    assert isinstance(m, FinetuneUnlearner) and m.name == "finetune"
    res = m.run(ctx)
    T = ctx.run.history.last_completed_round()
    want, cost = ctx.fedavg_rounds(ctx.original_state(), 1, T + 1)
    assert res.method == "finetune" and res.cost["fl_rounds"] == 1 == cost.rounds
    assert res.details["rounds"] == 1 and res.details["first_round"] == T + 1
    for k, v in want.items():
        assert torch.equal(m.state[k], v), k
    assert res.cost["bytes"] == cost.bytes and res.cost["cpu_s"] > 0
    assert res.details["aoi_time_avg_s"] is not None
    # it never saw client 0 again, but the model it starts from did: it is still a trained model
    assert res.metrics["ra"] > 0.5
    assert any(not torch.equal(m.state[k], v) for k, v in ctx.original_state().items())


def test_finetune_rounds_and_epochs_are_configurable(make_ctx: Any) -> None:
    """baselines.finetune.rounds=2 runs rounds T+1, T+2; a bad round count is an error."""
    ctx = make_ctx("sample:1:0.3")
    m = get_method("finetune", tiny_config("baselines.finetune.rounds=2"))
    res = m.run(ctx)
    T = ctx.run.history.last_completed_round()
    want, _ = ctx.fedavg_rounds(ctx.original_state(), 2, T + 1)
    assert res.cost["fl_rounds"] == 2
    assert all(torch.equal(m.state[k], v) for k, v in want.items())
    with pytest.raises(ValueError, match="at least one round"):
        FinetuneUnlearner(rounds=0).run(ctx)


def test_matched_control_spends_the_cpu_budget(make_ctx: Any) -> None:
    """Budget 0: one round; an unreachable budget: max_rounds; no budget: a clear error."""
    ctx = make_ctx("client:0")
    one = MatchedFinetuneUnlearner(budget_cpu_s=0.0).run(ctx)
    assert one.method == "finetune_matched" and one.cost["fl_rounds"] == 1
    many = MatchedFinetuneUnlearner(budget_cpu_s=1e9, max_rounds=3).run(ctx)
    assert many.cost["fl_rounds"] == 3 and len(many.details["round_cpu_s"]) == 3
    with pytest.raises(ValueError, match="budget_cpu_s"):
        get_method("finetune_matched", tiny_config()).run(ctx)
    with pytest.raises(ValueError, match=">= 0"):
        MatchedFinetuneUnlearner(budget_cpu_s=-1).run(ctx)
