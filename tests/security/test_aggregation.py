"""Robust aggregation: each strategy resists one scaled update among five; free-riders refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.fl.aggregation import (
    STRATEGIES,
    AggregationConfig,
    aggregate,
    norm,
    robust_aggregate,
    update_of,
)


def _t(state):
    return {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}


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
    return _t(base), {n: _t(s) for n, s in locals_.items()}, _t(direction)


def _dist_to_honest(res, base, locals_):
    honest = [n for n in locals_ if n != 3]
    target = {k: torch.stack([locals_[n][k].double() for n in honest]).mean(0) for k in ("w", "b")}
    return norm({k: res.state[k].double() - target[k] for k in target})


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
    assert res.state["steps"] == 8 and res.state["w"].dtype == torch.float32


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
    locals_[2] = {k: v.clone() for k, v in base.items()}  # the model it was sent, untouched
    sizes = {0: 100, 1: 100, 2: 10_000, 3: 100, 4: 100}
    res = robust_aggregate(base, locals_, sizes, AggregationConfig())
    assert res.refused[2].startswith("free_riding")
    assert 2 not in res.accepted
    expect = robust_aggregate(
        base, {n: s for n, s in locals_.items() if n != 2}, sizes, AggregationConfig()
    )
    assert torch.equal(res.state["w"], expect.state["w"])


def test_fedavg_is_the_fl_runtime_aggregate_bit_for_bit():
    """Screening that refuses nothing leaves FedAvg as the simulation computes it, bit for bit;
    without screening (the simulation's default) it is that aggregate itself."""
    base, locals_, _ = _round(scale=1.0)
    sizes = {0: 50, 1: 70, 2: 90, 3: 110, 4: 130}
    res = robust_aggregate(base, locals_, sizes, AggregationConfig(norm_factor=None))
    ref = aggregate(locals_, sizes)
    plain = robust_aggregate(base, locals_, sizes, None)
    assert plain.accepted == [0, 1, 2, 3, 4] and plain.norms == {}
    for k in ("w", "b", "steps"):
        assert torch.equal(res.state[k], ref[k]) and torch.equal(plain.state[k], ref[k]), k


@pytest.mark.parametrize("m", [3, 4])
def test_median_and_trimmed_mean_match_numpy(m):
    """The torch strategies compute what numpy's median and sorted mean compute (an even count:
    the mean of the two middle values)."""
    rng = np.random.default_rng(m)
    deltas = {n: {"w": rng.normal(size=(5, 7))} for n in range(m)}
    stack = np.stack([deltas[n]["w"] for n in range(m)])
    td = {n: _t(d) for n, d in deltas.items()}
    cfg = AggregationConfig(trim_fraction=0.2)
    med = STRATEGIES["median"](td, dict.fromkeys(td, 1), cfg)["w"].numpy()
    np.testing.assert_array_equal(med, np.median(stack, axis=0))
    tm = STRATEGIES["trimmed_mean"](td, dict.fromkeys(td, 1), cfg)["w"].numpy()
    np.testing.assert_allclose(tm, np.sort(stack, axis=0)[1 : m - 1].mean(axis=0), rtol=1e-15)


def test_a_round_with_only_bad_updates_fails_with_the_reasons():
    base, locals_, _ = _round(scale=1.0)
    only = {0: {k: v.clone() for k, v in base.items()}}
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
    assert update_of({"a": torch.ones(2)}, {"a": torch.zeros(2)})["a"].sum() == 2
    with pytest.raises(ValueError, match=r"fl\.aggregation\.krum_f"):
        AggregationConfig.from_dict({"krum_f": -1}, "fl.aggregation")
