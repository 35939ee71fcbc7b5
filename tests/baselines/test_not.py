"""NoT (weight negation, CVPR 2025) on the tiny run: what its paper says it does.

Negating the first layer's weights breaks the network (near-chance accuracy) without moving the
parameters' magnitudes; FedAvg fine-tuning on the retained data then restores the task. It reads
no stored update (storage-free) and no sample of D_u.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from scaleflu.unlearn.baselines import get_method
from scaleflu.unlearn.baselines.negation import negate_layers
from scaleflu.unlearn.metrics import accuracy_from_probs, predict
from tiny_run_helpers import needs_fmnist, tiny_config

pytestmark = needs_fmnist


def test_negation_flips_the_first_layer_only() -> None:
    state = {
        "conv1.weight": torch.ones(2, 1, 3, 3),
        "conv1.bias": torch.ones(2),
        "fc.weight": torch.ones(3, 2),
    }
    out, keys = negate_layers(state, ["conv1.weight"])
    assert keys == ["conv1.weight"] and torch.equal(out["conv1.weight"], -state["conv1.weight"])
    assert torch.equal(out["conv1.bias"], state["conv1.bias"])
    assert torch.equal(out["fc.weight"], state["fc.weight"])
    out, keys = negate_layers(state, ["conv1.weight"], bias=True)
    assert keys == ["conv1.weight", "conv1.bias"] and torch.equal(
        out["conv1.bias"], -state["conv1.bias"]
    )


def test_not_negates_then_fine_tunes_back_without_storage_or_forget_data(
    make_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = make_ctx("client:0")
    history = ctx.run.history
    for name in ("client_update", "client_updates", "client_model"):

        def refuse(*_a: Any, _n: str = name, **_k: Any) -> Any:
            raise AssertionError(f"NoT read the history ({_n}): it is storage-free")

        monkeypatch.setattr(history, name, refuse)
    seen: list[Any] = []
    real_rounds = ctx.fedavg_rounds

    def spy(state: Any, rounds: int, first: int, *a: Any, **k: Any) -> Any:
        seen.append((dict(state), rounds, first))
        return real_rounds(state, rounds, first, *a, **k)

    monkeypatch.setattr(ctx, "fedavg_rounds", spy)
    theta = ctx.original_state()
    unlearner = get_method("not", tiny_config(), rounds=2)
    res = unlearner.run(ctx)
    assert res.method == "not" and res.details["negated"] == ["conv1.weight"]
    # what the fine-tuning started from: Theta with conv1's weights negated, nothing else
    (start, rounds, first) = seen[0]
    assert rounds == 2 and first == history.last_completed_round() + 1
    assert torch.equal(start["conv1.weight"], -theta["conv1.weight"])
    assert all(torch.equal(start[k], theta[k]) for k in theta if k != "conv1.weight")
    # the negation alone breaks the model; the retained clients' rounds restore the task
    test = ctx.test
    broken = accuracy_from_probs(predict(ctx.new_model(start), test), test.labels)
    before = ctx.original_metrics()["test_acc"]
    after = res.metrics["test_acc"]
    print(f"test acc: trained {before:.3f}, negated {broken:.3f}, after NoT {after:.3f}")
    assert broken < before - 0.3
    assert after > broken + 0.3
    assert res.cost["fl_rounds"] == 2 and res.cost["bytes"] > 0 and res.cost["cpu_s"] > 0
