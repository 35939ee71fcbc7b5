"""Every unlearning method asks the context for fl.device (checked on the CPU, no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from scaleflu.unlearn.base import UnlearnContext
from scaleflu.unlearn.registry import make_method
from tiny_run_helpers import needs_fmnist, tiny_config

pytestmark = needs_fmnist

# where each method's own computation asks for the device (evaluation asks too, elsewhere)
ASKER = {
    "retrain": ("base.py", "fedavg_rounds"),
    "fedraser": ("fedraser.py", "run"),
    "pga": ("pga.py", "run"),
    "fused": ("fused.py", "run"),
}
CHEAP = {
    "retrain": {"rounds": 1},
    "fedraser": {"interval": 3},
    "pga": {"epochs": 1, "post_rounds": 1},
    "fused": {"rounds": 1},
}


@pytest.mark.parametrize("method", sorted(CHEAP))
def test_methods_compute_on_the_context_device(
    make_ctx: Any, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The method consults ctx.device and returns CPU states (the API contract)."""
    asked: set[tuple[str, str]] = set()

    def device(self: UnlearnContext) -> torch.device:
        caller = sys._getframe(1)
        asked.add((Path(caller.f_code.co_filename).name, caller.f_code.co_name))
        return torch.device("cpu")

    monkeypatch.setattr(UnlearnContext, "device", property(device))
    ctx = make_ctx("client:0")
    res = make_method(method, tiny_config(), **CHEAP[method]).run(ctx)
    assert ASKER[method] in asked, (method, asked)
    assert ("base.py", "evaluate") in asked  # the metrics too
    assert all(v.device.type == "cpu" for v in ctx.last_state.values())
    assert res.metrics["test_acc"] is not None
