"""The one FedAvg round (``scaleflu.fl.strategy.FedAvg``): selection, screening, aggregation,
the acceptance checks, and ``fl.aggregation`` (robust screening in the simulation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fl_helpers import needs_fmnist, toy_data

from scaleflu.config import ConfigError
from scaleflu.fl.aggregation import AggregationConfig, NoUpdateAcceptedError, aggregate
from scaleflu.fl.fedavg import LocalConfig, SequentialTrainer, select_clients
from scaleflu.fl.models import build_model
from scaleflu.fl.run import train, validate_config
from scaleflu.fl.strategy import FedAvg, RoundRejectedError, RoundResult


def _states(n: int = 5, scaled: int | None = None) -> tuple[dict, dict[int, dict]]:
    rng = np.random.default_rng(1)
    base = {"w": torch.from_numpy(rng.normal(size=(6, 4)).astype(np.float32))}
    base["steps"] = torch.tensor(3)
    direction = rng.normal(size=(6, 4)) * 0.1
    out = {}
    for c in range(n):
        d = direction + rng.normal(size=(6, 4)) * 0.02
        if c == scaled:
            d = 100 * d
        out[c] = {"w": base["w"] + torch.from_numpy(d.astype(np.float32)), "steps": torch.tensor(4)}
    return base, out


def test_configure_train_is_the_seeded_selection_less_clients_without_data() -> None:
    sizes = {0: 10, 1: 0, 2: 7, 3: 5, 4: 9}
    s = FedAvg(sizes, seed=3, clients_per_round=3)
    for t in range(1, 20):
        want = [n for n in select_clients(3, t, 5, 3) if n != 1]
        assert s.configure_train(t) == want
        assert s.configure_train(t, available=[0, 4]) == [n for n in want if n in (0, 4)]
    every = FedAvg(sizes, seed=3)  # no clients_per_round: every available client with data
    assert every.configure_train(1) == [0, 2, 3, 4]
    assert every.configure_train(1, available=[4, 1, 2]) == [2, 4]


def test_aggregate_train_is_fedavg_bit_for_bit_and_recalibrates_after_adjust() -> None:
    base, replies = _states()
    sizes = {c: 10 + c for c in replies}
    calls: list[str] = []

    def recal(state):
        calls.append("recal")
        return {**state, "w": state["w"] + 1}

    def adjust(state):
        calls.append("adjust")
        return {**state, "w": state["w"] * 2}

    res = FedAvg(sizes, 0, recalibrate=recal).aggregate_train(1, base, replies, adjust=adjust)
    plain = aggregate(replies, sizes)
    assert calls == ["adjust", "recal"]
    assert torch.equal(res.state["w"], plain["w"] * 2 + 1) and int(res.state["steps"]) == 4
    assert res.clients == [0, 1, 2, 3, 4] and res.refused == {} and res.norms == {}
    assert res.sizes == sizes and set(res.states) == set(replies)


def test_screening_refuses_a_scaled_update_and_fails_a_round_of_bad_ones() -> None:
    base, replies = _states(scaled=2)
    sizes = dict.fromkeys(replies, 10)
    plain = FedAvg(sizes, 0).aggregate_train(1, base, replies)
    robust = FedAvg(sizes, 0, screening=AggregationConfig()).aggregate_train(1, base, replies)
    assert 2 in robust.refused and robust.clients == [0, 1, 3, 4]
    honest = aggregate({c: replies[c] for c in (0, 1, 3, 4)}, sizes)
    assert torch.equal(robust.state["w"], honest["w"])
    assert not torch.equal(plain.state["w"], honest["w"])  # the attacker moved plain FedAvg
    free = {c: {k: v.clone() for k, v in base.items()} for c in range(2)}
    with pytest.raises(NoUpdateAcceptedError, match="free_riding"):
        FedAvg({0: 1, 1: 1}, 0, screening=AggregationConfig()).aggregate_train(1, base, free)


def test_a_small_round_takes_its_bound_from_the_norm_prior() -> None:
    base, replies = _states(n=2, scaled=1)
    seen: list[tuple[int, list[int]]] = []

    def prior(t, b, clients):
        seen.append((t, clients))
        return [float(torch.linalg.vector_norm(replies[0]["w"] - base["w"]))]

    s = FedAvg({0: 10, 1: 10}, 0, screening=AggregationConfig(), norm_prior=prior)
    res = s.aggregate_train(4, base, replies)
    assert seen == [(4, [0, 1])] and res.clients == [0] and res.refused[1].startswith("norm:")


def test_an_acceptance_check_refuses_the_candidate() -> None:
    base, replies = _states()

    def too_far(previous, result: RoundResult) -> str | None:
        step = float((result.state["w"] - previous["w"]).abs().max())
        return f"moved {step:.3g}" if step > 0.01 else None

    s = FedAvg(dict.fromkeys(replies, 1), 0, checks=[too_far])
    with pytest.raises(RoundRejectedError, match="round 2 rejected: moved") as exc:
        s.aggregate_train(2, base, replies)
    assert exc.value.result.clients == [0, 1, 2, 3, 4]
    assert FedAvg(dict.fromkeys(replies, 1), 0).aggregate_train(2, base, replies).clients


def test_fit_round_trains_the_selection_and_aggregates_it() -> None:
    data = toy_data(200)
    parts = [np.arange(i * 40, (i + 1) * 40) for i in range(5)]
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    local = LocalConfig(1, 0.05, 20)
    trainer = SequentialTrainer(model, data, parts, local, seed=5)
    s = FedAvg({n: len(p) for n, p in enumerate(parts)}, 5, 2)
    res = s.fit_round(3, start, trainer)
    assert res is not None and res.clients == select_clients(5, 3, 5, 2)
    again = SequentialTrainer(build_model("lenet", 10, 1, 28), data, parts, local, seed=5)
    states = again.train(start, res.clients, 3)
    want = aggregate(states, {n: 40 for n in res.clients})
    assert all(torch.equal(res.state[k], want[k]) for k in want)
    assert FedAvg({0: 0, 1: 0}, 5, 1).fit_round(1, start, trainer) is None


def test_fl_aggregation_is_checked_where_the_config_is() -> None:
    validate_config({"fl": {"aggregation": {"strategy": "median"}}})
    with pytest.raises(ConfigError, match=r"fl\.aggregation\.strategy 'mean'"):
        validate_config({"fl": {"aggregation": {"strategy": "mean"}}})
    with pytest.raises(ConfigError, match=r"fl\.aggregation: unknown keys \['norm'\]"):
        validate_config({"fl": {"aggregation": {"norm": 1}}})


@needs_fmnist
def test_simulation_with_robust_screening(tmp_path: Path, small_cfg: Any) -> None:
    """``fl.aggregation`` in training: the same selection and local models, another aggregate;
    off by default, and then FedAvg exactly."""
    plain = train(small_cfg("fl.rounds=1"), tmp_path / "plain", progress=False, outputs=False)
    cfg = small_cfg("fl.rounds=1", "fl.aggregation={strategy: median, norm_factor: null}")
    med = train(cfg, tmp_path / "median", progress=False, outputs=False)
    assert med.metrics[0]["participants"] == plain.metrics[0]["participants"]
    h = med.history
    locals_ = {n: h.client_model(1, n) for n in h.participants(1)}
    stacked = torch.stack([locals_[n]["fc3.weight"].double() for n in sorted(locals_)])
    want = (
        h.global_model(1)["fc3.weight"].double()
        + torch.median(stacked - h.global_model(1)["fc3.weight"].double(), dim=0).values
    ).float()  # five clients: the middle value
    got = med.model.state_dict()["fc3.weight"]
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.equal(got, plain.model.state_dict()["fc3.weight"])
