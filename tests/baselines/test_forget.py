"""SCALE's calibrated forgetting step (unlearn/forget.py) on the tiny run: what it promises.

It only lowers the margins of D_u's samples whose held label the model no longer predicts, it
never pushes one below its target, and an epoch that costs more selection accuracy than
``scale.forget_val_tol`` is undone (the state comes back bit-exact).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from scaleflu.config import ConfigError
from scaleflu.experiments.harness import make_context
from scaleflu.unlearn.forget import calibrated_forget, wrong_label_margins
from scaleflu.unlearn.heal import split_selection_and_heal
from tiny_run_helpers import needs_fmnist, tiny_config

pytestmark = needs_fmnist


def _ctx(tiny_run: Any, *sets: str) -> Any:
    return make_context(tiny_run, "client:0", tiny_config(*sets), progress=False)


def test_wrong_label_margins_cover_every_other_label(tiny_run: Any) -> None:
    ctx = _ctx(tiny_run)
    val = ctx.val_retain.subset(np.arange(20))
    phi = wrong_label_margins(ctx.new_model(ctx.original_state()), val)
    assert phi.shape == (20 * 9,) and np.isfinite(phi).all()
    # a trained model gives wrong labels mostly negative margins
    assert np.median(phi) < 0


def test_forgetting_lowers_selected_margins_within_its_bound(tiny_run: Any) -> None:
    ctx = _ctx(tiny_run, "scale.forget_epochs=2", "scale.forget_val_tol=1.0")
    select, _ = split_selection_and_heal(ctx)
    start = ctx.original_state()  # D_u of client 0 holds samples Theta does not predict
    new, info = calibrated_forget(ctx, start, select)
    assert info["selected"] > 0 and info["above_target"] > 0 and info["epochs_run"] >= 1
    assert info["margin_after"] < info["margin_before"] - 0.1
    assert any(not torch.equal(new[k], start[k]) for k in start)


def test_an_epoch_that_costs_accuracy_is_undone(tiny_run: Any) -> None:
    # a step size that wrecks the model: with no tolerance the epoch is undone, bit-exact
    ctx = _ctx(tiny_run, "scale.forget_epochs=1", "scale.forget_val_tol=0.0", "scale.forget_lr=5.0")
    select, _ = split_selection_and_heal(ctx)
    start = ctx.original_state()
    new, info = calibrated_forget(ctx, start, select)
    trace = info["select_acc_trace"]
    assert info["above_target"] > 0 and info["epochs_run"] == 0 and trace[1] < trace[0]
    assert all(torch.equal(new[k], start[k]) for k in start)


def test_bad_settings_are_named(tiny_run: Any) -> None:
    select = _ctx(tiny_run).val_retain
    for bad, key in (
        ("scale.forget_val_tol=-0.1", "forget_val_tol"),
        ("scale.forget_quantiles=1", "forget_quantiles"),
        ("scale.forget_anchor_weight=-1", "forget_anchor_weight"),
    ):
        ctx = _ctx(tiny_run, "scale.forget_epochs=1", bad)
        with pytest.raises(ConfigError, match=key):
            calibrated_forget(ctx, ctx.original_state(), select)
