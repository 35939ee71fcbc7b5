"""FedEraser, PGA and FUSED on the tiny run: forgetting moves the right way, schema, costs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_run_helpers import needs_fmnist, tiny_config

from scaleflu.unlearn.base import UnlearnResult
from scaleflu.unlearn.baselines import METHOD_NAMES, get_method
from scaleflu.unlearn.baselines.pga import l2_distance, project_to_ball

pytestmark = needs_fmnist

COST_KEYS = ("wall_s", "bytes", "link_s", "fl_rounds")


def _check_schema(res: UnlearnResult, method: str) -> dict[str, Any]:
    d = res.to_dict()
    assert d["method"] == method and d["schema"] == 1
    assert UnlearnResult.from_dict(d).to_dict() == d
    for k in ("test_acc", "ra", "fa", "fa_protocol", "fr", "mia_loss_auc"):
        assert k in d["metrics"] and k in d["original"]
    for k in COST_KEYS:
        assert d["cost"][k] is not None
    assert d["cost"]["wall_s"] > 0 and d["cost"]["bytes"] > 0 and d["cost"]["link_s"] > 0
    assert d["details"]["aoi_time_avg_s"] is not None and d["details"]["aoi_time_avg_s"] >= 0
    assert len(d["details"]["aoi_mean_s_trace"]) >= 1
    return d


_RESULTS: dict[tuple[str, str], tuple[Any, UnlearnResult]] = {}


def _run(make_ctx: Any, method: str, request: str) -> tuple[Any, UnlearnResult]:
    key = (method, request)
    if key not in _RESULTS:
        unlearner = get_method(method, tiny_config())
        _RESULTS[key] = (unlearner, unlearner.run(make_ctx(request)))
    return _RESULTS[key]


def test_registry_knows_every_method() -> None:
    """get_method gives an Unlearner with the right name for each of the five methods."""
    for name in METHOD_NAMES:
        m = get_method(name)
        assert m.name == name and callable(m.run)
    assert get_method("FedEraser".replace("Eraser", "eraser")).name == "fedraser"
    with pytest.raises(ValueError, match="unknown unlearning method"):
        get_method("nope")


def test_tiny_run_carries_a_backdoor(make_ctx: Any) -> None:
    """Precondition of the client tests: the trained model obeys the trigger."""
    ctx = make_ctx("client:0")
    assert ctx.request.protocol == "backdoor"
    assert ctx.original_metrics()["backdoor_asr"] > 0.4


@pytest.mark.parametrize("method", ["fedraser", "pga"])
def test_client_unlearning_removes_the_backdoor(make_ctx: Any, method: str) -> None:
    """Client unlearning of the backdoor client: attack success falls well below the original."""
    _, res = _run(make_ctx, method, "client:0")
    d = _check_schema(res, method)
    before, after = d["original"]["backdoor_asr"], d["metrics"]["backdoor_asr"]
    assert after < 0.5 * before, (before, after)
    assert d["metrics"]["fa_protocol"] == after  # FA is measured on *triggered* inputs
    assert d["cost"]["fl_rounds"] >= 1


def test_fedraser_calibrates_on_the_interval(make_ctx: Any) -> None:
    """FedEraser calibrates rounds 1, 1+interval, ...; round t_1 costs no link time."""
    _, res = _run(make_ctx, "fedraser", "client:0")
    det = res.details
    assert det["calibration_rounds"] == [1, 3, 5]
    assert det["calibration_epochs"] == 1  # ceil(0.5 x 2)
    assert res.cost["fl_rounds"] == 2
    assert res.metrics["ra"] > 0.4


def test_fedraser_class_unlearning_forgets_the_class(make_ctx: Any) -> None:
    """Class unlearning (whole federation): test accuracy on the class drops to near zero."""
    _, res = _run(make_ctx, "fedraser", "class:1")
    d = _check_schema(res, "fedraser")
    assert d["original"]["fa_class_test"] > 0.5
    assert d["metrics"]["fa_class_test"] < 0.2


def test_pga_stays_in_the_plain_l2_ball(make_ctx: Any) -> None:
    """PGA's radius is a plain L2 norm and the ascent never leaves the ball (early stop noted)."""
    _, res = _run(make_ctx, "pga", "client:0")
    det = res.details
    assert det["radius_norm"].startswith("plain")
    assert 0 < det["final_distance"] <= det["radius"] * (1 + 1e-5)
    assert det["ascent_steps"] >= 1
    trace = det["forget_acc_trace"]
    assert det["early_stopped"] == (trace[-1] < det["hyper_parameters"]["stop_acc"])


def test_projection_uses_the_plain_norm() -> None:
    """project_to_ball puts a far model at exactly distance r (not sqrt(r), not r^2)."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    center = torch.nn.utils.parameters_to_vector(b.parameters()).detach().clone()
    radius = 0.25
    assert l2_distance(a, b) > radius
    project_to_ball(a, center, radius)
    assert abs(l2_distance(a, b) - radius) < 1e-5


def test_pga_sample_unlearning_fills_the_schema(make_ctx: Any) -> None:
    """Sample unlearning (flipped labels of client 1): FA on the flipped labels does not grow."""
    _, res = _run(make_ctx, "pga", "sample:1:0.3")
    d = _check_schema(res, "pga")
    assert d["protocol"] == "label_flip"
    assert d["metrics"]["fa"] <= d["original"]["fa"] + 0.02


def test_fused_trains_adapters_only_and_is_reversible(make_ctx: Any) -> None:
    """FUSED: adapters on the critical layers only, cheap link, dropping them restores Theta."""
    from scaleflu.unlearn.baselines.fused import drop_adapters

    ctx = make_ctx("client:0")
    fused, res = _run(make_ctx, "fused", "client:0")
    d = _check_schema(res, "fused")
    det = d["details"]
    assert len(det["critical_layers"]) == 2
    assert all(r <= 16 for r in det["ranks"].values())
    theta = ctx.original_state()
    changed = [k for k in theta if not torch.equal(theta[k], fused.state[k])]
    assert changed and set(changed) <= set(det["critical_layers"])
    # Only adapters on the link: less than two full-model rounds of traffic.
    model_bytes = sum(v.numel() * 4 for v in theta.values() if torch.is_floating_point(v))
    assert d["cost"]["bytes"] < 2 * model_bytes * (1 + 5)
    # Reversible: the kept base is Theta exactly, and dropping the adapters gives its outputs.
    for k, v in theta.items():
        assert torch.equal(fused.base_state[k], v)
    x = ctx.test.inputs(slice(0, 256))
    orig = ctx.new_model(theta).eval()
    restored = ctx.new_model(drop_adapters(fused.state, fused.adapters)).eval()
    unlearned = ctx.new_model(fused.state).eval()
    with torch.no_grad():
        assert torch.allclose(restored(x), orig(x), atol=1e-5)
        assert not torch.allclose(unlearned(x), orig(x), atol=1e-5)


def test_fused_forgetting_moves_the_right_way(make_ctx: Any) -> None:
    """FUSED on client unlearning: attack success does not grow, RA holds."""
    _, res = _run(make_ctx, "fused", "client:0")
    assert res.metrics["backdoor_asr"] <= res.original["backdoor_asr"] + 0.02
    assert res.metrics["ra"] >= res.original["ra"] - 0.1
