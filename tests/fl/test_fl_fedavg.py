"""FedAvg: aggregation weights, client selection, vmap and sequential trainers agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fl_helpers import toy_data

from scaleflu.fl.aggregation import aggregate
from scaleflu.fl.data import partition_dirichlet
from scaleflu.fl.fedavg import (
    LocalConfig,
    SequentialTrainer,
    VmapTrainer,
    client_batches,
    evaluate,
    make_trainer,
    select_clients,
)
from scaleflu.fl.models import build_model


def test_aggregate_weights_by_data_size() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = aggregate({0: a, 1: b}, {0: 1, 1: 3})
    assert torch.allclose(out["w"], torch.tensor([2.5, 5.0]))
    assert int(out["n"]) == 5


def test_select_clients_deterministic() -> None:
    first = select_clients(3, 7, 100, 10)
    assert first == select_clients(3, 7, 100, 10)
    assert len(set(first)) == 10 and first == sorted(first)
    assert first != select_clients(3, 8, 100, 10)
    with pytest.raises(ValueError):
        select_clients(0, 1, 5, 6)


def test_client_batches_cover_each_epoch() -> None:
    batches = client_batches(70, 2, 32, seed=0, t=1, n=4)
    assert [len(b) for b in batches] == [32, 32, 6, 32, 32, 6]
    assert sorted(np.concatenate(batches[:3]).tolist()) == list(range(70))
    again = client_batches(70, 2, 32, seed=0, t=1, n=4)
    assert all(np.array_equal(x, y) for x, y in zip(batches, again, strict=True))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_vmap_equals_sequential(momentum: float) -> None:
    data = toy_data(600)
    parts = partition_dirichlet(data.labels.numpy(), 6, 0.5, seed=1)  # unequal batch counts
    local = LocalConfig(epochs=2, lr=0.05, batch_size=16, momentum=momentum)
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    clients = [0, 2, 3, 5]
    seq = SequentialTrainer(model, data, parts, local, seed=4).train(start, clients, 1)
    vm = VmapTrainer(model, data, parts, local, seed=4).train(start, clients, 1)
    assert set(seq) == set(vm) == set(clients)
    for n in clients:
        for k in start:
            assert torch.allclose(seq[n][k], vm[n][k], atol=1e-5, rtol=1e-4), (n, k)
        assert not torch.equal(seq[n]["fc3.weight"], start["fc3.weight"])
    agg_s = aggregate(seq, {n: len(parts[n]) for n in clients})
    agg_v = aggregate(vm, {n: len(parts[n]) for n in clients})
    assert max(float((agg_s[k] - agg_v[k]).abs().max()) for k in agg_s) < 1e-5


def test_batchnorm_model_uses_sequential_and_averages_buffers() -> None:
    data = toy_data(40)
    parts = [np.arange(0, 20), np.arange(20, 40)]
    model = build_model("mobilenetv3", 10, 1, 28)
    trainer = make_trainer("auto", model, data, parts, LocalConfig(1, 0.01, 20), seed=0)
    assert isinstance(trainer, SequentialTrainer)
    with pytest.raises(ValueError, match="BatchNorm"):
        VmapTrainer(model, data, parts, LocalConfig(1, 0.01, 20), seed=0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    states = trainer.train(start, [0, 1], 1)
    key = "features.0.1.running_mean"
    assert not torch.equal(states[0][key], start[key])
    agg = aggregate(states, {0: 20, 1: 20})
    assert torch.allclose(agg[key], (states[0][key] + states[1][key]) / 2)
    assert int(agg["features.0.1.num_batches_tracked"]) == 1


def test_evaluate_reports_accuracy_and_loss() -> None:
    data = toy_data(50)
    out = evaluate(build_model("lenet", 10, 1, 28), data, batch_size=16)
    assert 0.0 <= out["acc"] <= 1.0 and out["loss"] > 0


def test_threaded_sequential_equals_single_thread() -> None:
    data = toy_data(600)
    parts = partition_dirichlet(data.labels.numpy(), 6, 0.5, seed=2)
    local = LocalConfig(epochs=1, lr=0.05, batch_size=16)
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    one = SequentialTrainer(model, data, parts, local, seed=1).train(start, range(6), 3)
    threaded = SequentialTrainer(model, data, parts, local, seed=1, workers=2)
    assert threaded.workers == 2
    two = threaded.train(start, range(6), 3)
    threaded.shutdown()
    assert list(two) == list(range(6))
    for n in range(6):
        assert all(torch.equal(one[n][k], two[n][k]) for k in start)
    dropout_model = build_model("mobilenetv3", 10, 1, 28)
    assert SequentialTrainer(dropout_model, data, parts, local, seed=1, workers=2).workers == 1


def test_full_batch_is_paper_gradient_descent() -> None:
    """batch_size=None: E full-gradient steps Theta <- Theta - eta * grad F_n (paper's Eq.)."""
    data = toy_data(40)
    parts = [np.arange(0, 15), np.arange(15, 40)]
    local = LocalConfig(epochs=2, lr=0.1, batch_size=None)
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    assert [len(b) for b in client_batches(15, 2, None, 0, 1, 0)] == [15, 15]
    seq = SequentialTrainer(model, data, parts, local, seed=0).train(start, [0, 1], 1)
    vm = VmapTrainer(model, data, parts, local, seed=0).train(start, [0, 1], 1)
    ref = build_model("lenet", 10, 1, 28)
    ref.load_state_dict(start)
    idx = torch.as_tensor(parts[1])
    for _ in range(2):
        ref.zero_grad()
        torch.nn.functional.cross_entropy(ref(data.inputs(idx)), data.labels[idx]).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p -= 0.1 * p.grad
    for k, v in ref.state_dict().items():
        assert torch.allclose(seq[1][k], v, atol=1e-6)
        assert torch.allclose(vm[1][k], v, atol=1e-5)
