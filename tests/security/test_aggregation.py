"""Robust aggregation: each strategy resists one scaled update among five; free-riders refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.fl.aggregation import (
    STRATEGIES,
    AggregationConfig,
    norm,
    robust_aggregate,
    update_of,
)
from scaleflu.fl.fedavg import aggregate


def _round(seed: int = 0, scale: float = 100.0):
    """A global model, four honest local models around a common direction, one scaled."""
    rng = np.random.default_rng(seed)
    base = {
        "w": rng.normal(size=(8, 16)).astype(np.float32),
        "b": rng.normal(size=16).astype(np.float32),
        "steps": np.array(7, dtype=np.int64),
    }
    direction = {k: rng.normal(size=v.shape) * 0.1 for k, v in base.items() if v.dtype.kind == "f"}
    locals_ = {}
    for n in range(5):
        d = {k: direction[k] + rng.normal(size=v.shape) * 0.02 for k, v in direction.items()}
        if n == 3:
            d = {k: v * scale for k, v in d.items()}
        locals_[n] = {k: (base[k] + d[k]).astype(np.float32) for k in d}
        locals_[n]["steps"] = np.array(8, dtype=np.int64)
    return base, locals_, direction


def _dist_to_honest(res, base, locals_):
    honest = [n for n in locals_ if n != 3]
    target = {
        k: np.mean([locals_[n][k].astype(np.float64) for n in honest], axis=0) for k in ("w", "b")
    }
    return norm({k: res.state[k].astype(np.float64) - target[k] for k in target})


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_each_strategy_resists_a_scaled_update(strategy):
    base, locals_, direction = _round()
    sizes = dict.fromkeys(locals_, 100)
    honest_norm = norm(direction)
    # default screening (adaptive bound) on
    res = robust_aggregate(base, locals_, sizes, AggregationConfig(strategy=strategy))
    assert 3 in res.refused and res.refused[3].startswith("norm:")
    assert res.accepted == [0, 1, 2, 4]
    assert _dist_to_honest(res, base, locals_) < 0.5 * honest_norm
    assert res.state["steps"] == 8 and res.state["w"].dtype == np.float32


@pytest.mark.parametrize("strategy", ["median", "trimmed_mean", "krum"])
def test_robust_strategies_resist_without_the_norm_bound(strategy):
    base, locals_, direction = _round()
    sizes = dict.fromkeys(locals_, 100)
    cfg = AggregationConfig(strategy=strategy, norm_factor=None)
    res = robust_aggregate(base, locals_, sizes, cfg)
    assert res.refused == {}
    assert _dist_to_honest(res, base, locals_) < 0.5 * norm(direction)
    # plain FedAvg without the bound is pulled far away by the same attacker (the test can fail)
    bad = robust_aggregate(base, locals_, sizes, AggregationConfig(norm_factor=None))
    assert _dist_to_honest(bad, base, locals_) > 5 * norm(direction)


def test_free_riding_update_is_flagged_with_zero_weight():
    base, locals_, _ = _round(scale=1.0)
    locals_[2] = {k: v.copy() for k, v in base.items()}  # the model it was sent, untouched
    sizes = {0: 100, 1: 100, 2: 10_000, 3: 100, 4: 100}
    res = robust_aggregate(base, locals_, sizes, AggregationConfig())
    assert res.refused[2].startswith("free_riding")
    assert 2 not in res.accepted
    expect = robust_aggregate(
        base, {n: s for n, s in locals_.items() if n != 2}, sizes, AggregationConfig()
    )
    assert np.array_equal(res.state["w"], expect.state["w"])


def test_fedavg_matches_the_fl_runtime_aggregate():
    base, locals_, _ = _round(scale=1.0)
    sizes = {0: 50, 1: 70, 2: 90, 3: 110, 4: 130}
    res = robust_aggregate(base, locals_, sizes, AggregationConfig(norm_factor=None))
    ref = aggregate(
        {n: {k: torch.from_numpy(v) for k, v in s.items()} for n, s in locals_.items()}, sizes
    )
    for k in ("w", "b"):
        np.testing.assert_allclose(res.state[k], ref[k].numpy(), rtol=0, atol=1e-6)


def test_a_round_with_only_bad_updates_fails_with_the_reasons():
    base, locals_, _ = _round(scale=1.0)
    only = {0: {k: v.copy() for k, v in base.items()}}
    with pytest.raises(ValueError, match="free_riding"):
        robust_aggregate(base, only, {0: 1}, AggregationConfig())


def test_config_is_checked():
    with pytest.raises(ValueError, match="strategy"):
        AggregationConfig.from_dict({"strategy": "mean"})
    with pytest.raises(ValueError, match="unknown keys"):
        AggregationConfig.from_dict({"strategy": "krum", "kurm_f": 1})
    with pytest.raises(ValueError, match="norm_factor"):
        AggregationConfig.from_dict({"norm_factor": -1})
    assert AggregationConfig.from_dict({"strategy": "median"}).strategy == "median"
    assert update_of({"a": np.ones(2, np.float32)}, {"a": np.zeros(2, np.float32)})["a"].sum() == 2
