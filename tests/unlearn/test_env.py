"""Phase II environment on constructed layers: encoding, Sparsify, rewards, budget, AoI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.fl.history import LinkModel
from scaleflu.fl.models import parameter_groups
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.env import EnvSpec, SparsifyEnv

Groups = dict[str, list[tuple[int, int]]]


def _aoi(groups: Groups, ages: dict[tuple[str, int], float]) -> AoITracker:
    keys = [(k, j) for k, g in groups.items() for j in range(len(g))]
    sizes = {(k, j): b - a for k, g in groups.items() for j, (a, b) in enumerate(g)}
    now = 10.0
    last = np.array([now - ages.get(key, 0.0) for key in keys])
    return AoITracker(keys, sizes, last.copy(), last.copy(), now, now, LinkModel(1000.0, 0.0))


def _spec(mode: str, **kw: object) -> EnvSpec:
    w = {"x": torch.arange(1.0, 17.0).view(4, 4), "y": torch.arange(1.0, 9.0) * -0.1}
    groups = {"x": parameter_groups(16, 4), "y": parameter_groups(8, 2)}
    attribution = {"x": torch.zeros(16), "y": torch.zeros(8)}
    attribution["x"][[1, 6, 11]] = torch.tensor([5.0, 4.0, 3.0])
    ages = {("x", 0): 4.0, ("x", 1): 2.0, ("y", 0): 8.0}
    base = dict(
        mode=mode,
        layers=["x", "y"],
        groups=groups,
        weights=w,
        score={"x": 2.0, "y": 1.0},
        aoi=_aoi(groups, ages),
        G=4,
        s_levels=4,
        episode_steps=3,
        attribution=attribution if mode == "default" else {},
    )
    base.update(kw)
    return EnvSpec(**base)  # type: ignore[arg-type]


def test_spaces_and_decode() -> None:
    env = SparsifyEnv(_spec("paper"))
    assert list(env.action_space.nvec) == [2, 2, 2, 2, 2, 4]
    assert env.observation_space.shape == (2 * 4 * 3,)
    layer, groups, s = env.decode([1, 1, 1, 1, 1, 1])
    assert layer == "y" and groups == [0, 1] and s == 0.5  # y has only 2 groups
    obs, _ = env.reset()
    assert obs.shape == (24,) and np.isfinite(obs).all()
    assert SparsifyEnv(_spec("default")).observation_space.shape == (2 * 4 * 6,)


def test_paper_reward_and_magnitude_pruning() -> None:
    env = SparsifyEnv(_spec("paper"))
    env.reset()
    # layer x (S = max), groups 0 and 1, s = 0.5: R_f = 2 * 1 * 0.5; R_c = (4/8 + 2/8)/2 * 0.5
    _, r, term, trunc, info = env.step([0, 1, 1, 0, 0, 1])
    assert info["r_f"] == pytest.approx(1.0)
    assert info["r_c"] == pytest.approx(0.1875)
    assert r == pytest.approx(1.1875)
    x = env.layer_state()["x"].flatten()
    # magnitude pruning: the 2 smallest |w| of each group are zeroed
    assert x[:8].tolist() == [0, 0, 3, 4, 0, 0, 7, 8]
    assert info["changed"] == 2 and not term and not trunc
    # the changed groups are fresh now, the others aged by one step
    a = env._aoi_of(env.aoi.aoi_rounds())
    assert a[("x", 0)] == 0 and a[("y", 0)] == 9
    env.step([0, 0, 0, 0, 0, 0])
    _, _, term, trunc, _ = env.step([0, 0, 0, 0, 0, 0])
    assert trunc and not term and len(env.episode_returns) == 1


def test_paper_step_that_changes_nothing_earns_nothing() -> None:
    env = SparsifyEnv(_spec("paper", episode_steps=4))
    env.reset()
    _, r1, _, _, i1 = env.step([0, 1, 1, 0, 0, 1])  # x groups 0, 1 at s = 0.5: 2 zeros each
    assert r1 > 0 and i1["changed"] == 2
    before = env.layer_state()["x"].clone()
    # the same action again: the 2 smallest |w| of each group are the zeros already there
    _, r2, _, _, i2 = env.step([0, 1, 1, 0, 0, 1])
    assert torch.equal(env.layer_state()["x"], before)
    assert i2["changed"] == 0 and r2 == 0.0 and i2["r_f"] == 0.0 and i2["r_c"] == 0.0
    # a larger s on group 0 only changes group 0 and is paid for it alone, at the paper's rate
    _, r3, _, _, i3 = env.step([0, 1, 1, 0, 0, 3])  # s = 1.0 zeroes all of groups 0 and 1
    assert i3["changed"] == 2 and i3["r_f"] == pytest.approx(2.0)
    _, r4, _, _, i4 = env.step([0, 1, 0, 0, 0, 2])  # s = 0.75 of group 0: all 0 already
    assert i4["changed"] == 0 and r4 == 0.0
    assert len(env.episode_returns) == 1 and env.episode_returns[0] == pytest.approx(r1 + r3)


def test_default_sparsify_follows_attribution_and_budget() -> None:
    env = SparsifyEnv(_spec("default", budget=2 / 24))  # 2 of the 24 top-M parameters
    env.reset()
    assert env.budget_total == 2
    # s = 0.25 of each 4-entry group: the most attributed entry of groups 0..2
    _, _, term, _, info = env.step([0, 1, 1, 1, 0, 0])
    x = env.layer_state()["x"].flatten()
    zeroed = set(torch.nonzero(x == 0).flatten().tolist())
    assert len(zeroed) == 2 and zeroed <= {1, 6, 11}  # cut to the budget
    assert term  # budget spent ends the episode
    assert info["r_f"] == pytest.approx(sum([5.0, 4.0, 3.0][:2]) / 12.0 * 1.0, rel=0.5)


def test_default_reward_counts_only_new_zeros_and_utility() -> None:
    calls = []

    def utility(layers: dict[str, torch.Tensor]) -> float:
        calls.append(1)
        return 1.0 - 0.01 * int((layers["x"] == 0).sum())

    env = SparsifyEnv(_spec("default", utility=utility, w_u=1.0))
    env.reset()
    _, r1, _, _, i1 = env.step([0, 1, 0, 0, 0, 0])
    assert i1["r_f"] == pytest.approx(5.0 / 12.0)
    assert i1["r_u"] == pytest.approx(-0.01)
    _, r2, _, _, i2 = env.step([0, 1, 0, 0, 0, 0])  # same action again: nothing new
    assert r2 == 0.0 and i2["changed"] == 0


def test_subtract_uses_the_contribution_when_attribution_is_a_saliency() -> None:
    # class requests rank entries by a saliency map; `subtract` still removes C_l, not it
    saliency = {"x": torch.zeros(16), "y": torch.zeros(8)}
    saliency["x"][2] = 1.0
    contribution = {"x": torch.full((16,), 0.5), "y": torch.zeros(8)}
    env = SparsifyEnv(
        _spec("default", attribution=saliency, contribution=contribution, op="subtract")
    )
    env.reset()
    env.step([0, 1, 0, 0, 0, 0])  # layer x, group 0, s = 0.25: the most salient entry
    x = env.layer_state()["x"].flatten()
    assert x[2] == pytest.approx(3.0 - 0.5)  # W - C at the salient entry
    assert x[[0, 1, 3]].tolist() == [1.0, 2.0, 4.0]


def test_changed_groups_and_tracker_step() -> None:
    groups = {"x": parameter_groups(8, 2)}
    a = {"x": torch.zeros(8)}
    b = {"x": torch.zeros(8)}
    b["x"][5] = 1.0
    assert changed_groups(a, b, groups) == [("x", 1)]
    tr = _aoi(groups, {("x", 0): 3.0})
    spent = tr.step([("x", 1)])
    assert spent == pytest.approx(4 * 4 / 1000.0)
    assert tr.aoi_rounds().tolist() == [4.0, 0.0]
    assert tr.mean()["aoi_rounds"] == pytest.approx(2.0)


def test_utility_is_memoised_on_the_sparsified_set_and_exact() -> None:
    calls: list[dict[str, torch.Tensor]] = []

    def utility(layers: dict[str, torch.Tensor]) -> float:
        calls.append({k: v.clone() for k, v in layers.items()})
        return 1.0 - 0.01 * float((layers["x"] == 0).sum())  # depends on the state

    env = SparsifyEnv(_spec("default", utility=utility, w_u=1.0, budget=None))
    assert env.utility_evals == 1 and env.utility_hits == 0  # Theta, once
    env.step([0, 1, 1, 0, 0, 3])  # layer x, groups 0-1, s = 1: 8 entries zeroed
    assert env.utility_evals == 2
    env.reset()
    assert env.utility_evals == 2 and env.utility_hits == 1  # Theta again: cached
    _, r, *_ = env.step([0, 1, 1, 0, 0, 3])  # the same state again: cached, same reward
    assert env.utility_evals == 2 and env.utility_hits == 2
    assert np.isfinite(r)
    assert env.util_prev == pytest.approx(1.0 - 0.08)
    # exact: the cached value is what a fresh call on the current layers returns
    assert utility(env.layer_state()) == pytest.approx(env.util_prev)
    env.step([0, 0, 0, 1, 0, 3])  # a new state: evaluated
    assert env.utility_evals == 3 and len(calls) == 4


def test_measured_forgetting_replaces_the_attribution_reward() -> None:
    """Class requests: R_f is the share of the class's validation accuracy a step removes."""

    def forget_acc(layers: dict[str, torch.Tensor]) -> float:
        return 0.8 - 0.05 * float((layers["x"] == 0).sum())  # falls as x is zeroed

    env = SparsifyEnv(_spec("default", forget_utility=forget_acc, budget=None, w_c=0.0))
    assert env.fu0 == pytest.approx(0.8)
    _, r, _, _, info = env.step([0, 1, 0, 0, 0, 1])  # layer x, group 0, s = 0.5: 2 entries
    assert info["r_f"] == pytest.approx(0.1 / 0.8) and r == pytest.approx(0.1 / 0.8)
    assert info["forget_acc"] == pytest.approx(0.7)
    _, r, _, _, info = env.step([1, 1, 0, 0, 0, 3])  # layer y: the class accuracy is unchanged
    assert info["r_f"] == 0.0 and r == 0.0


def test_measure_every_episode_same_return_fewer_passes() -> None:
    def utility(layers: dict[str, torch.Tensor]) -> float:
        return 1.0 - 0.01 * int((layers["x"] == 0).sum()) + 0.003 * int((layers["y"] == 0).sum())

    actions = [[0, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 1], [0, 0, 1, 1, 0, 2]]
    out = {}
    for every in ("step", "episode"):
        env = SparsifyEnv(_spec("default", utility=utility, w_u=1.0, measure_every=every))
        env.reset()
        rs = [env.step(a) for a in actions]
        out[every] = (env, [r[4]["r_u"] for r in rs])
    (es, us), (ee, ue) = out["step"], out["episode"]
    assert es.episode_returns[0] == pytest.approx(ee.episode_returns[0], abs=1e-12)
    assert sum(us) == pytest.approx(ue[-1]) and ue[:-1] == [0.0, 0.0] and ue[-1] != 0.0
    assert torch.equal(es.layer_state()["x"], ee.layer_state()["x"])
    assert es.utility_evals == 4 and ee.utility_evals == 2  # reset + steps / reset + last
    with pytest.raises(ValueError, match="measure_every"):
        _spec("default", measure_every="sometimes")


def test_greedy_search_zeroes_the_top_attribution_entries() -> None:
    from scaleflu.config import ConfigError
    from scaleflu.unlearn.search import greedy_cut

    spec = _spec("default", budget=0.1)  # 24 parameters: 2 entries
    layers, aoi, steps, zeroed = greedy_cut(spec)
    x = layers["x"].flatten()
    want = torch.arange(1.0, 17.0)
    want[[1, 6]] = 0.0  # attribution 5 and 4; entry 11 (3) is left
    assert torch.equal(x, want) and torch.equal(layers["y"], spec.weights["y"])
    assert torch.equal(spec.weights["x"].flatten(), torch.arange(1.0, 17.0))  # Theta untouched
    assert zeroed == pytest.approx(2 / 24)
    assert [(s["layer"], s["changed_groups"]) for s in steps] == [("x", [0, 1])]
    assert aoi.payload_bytes([("x", 0), ("x", 1)]) == 32 and steps[0]["link_s"] > 0
    # never more than the entries with positive attribution
    layers, _, _, zeroed = greedy_cut(_spec("default", budget=0.5))
    assert int((layers["x"] == 0).sum()) == 3 and zeroed == pytest.approx(3 / 24)
    with pytest.raises(ConfigError, match="budget"):
        greedy_cut(_spec("default", budget=None))
