"""fl.lr_schedule: the learning rate of round t (constant is today's runtime, bit-exact)."""

from __future__ import annotations

import math

import pytest
import torch
from fl_helpers import toy_data

from scaleflu.config import ConfigError, load_config
from scaleflu.fl.data import partition_iid
from scaleflu.fl.fedavg import LocalConfig, SequentialTrainer, VmapTrainer
from scaleflu.fl.models import build_model
from scaleflu.fl.run import validate_config


def _fl(**kw: object) -> dict:
    fl = {"local_epochs": 2, "lr": 0.1, "batch_size": 32, "momentum": 0.9, "rounds": 5}
    fl.update(kw)
    return fl


def test_lr_at_values() -> None:
    const = LocalConfig.from_config(_fl())
    assert [const.lr_at(t) for t in (1, 3, 99)] == [0.1, 0.1, 0.1]
    exp = LocalConfig.from_config(_fl(lr_schedule="exponential", lr_decay=0.5))
    assert [exp.lr_at(t) for t in (1, 2, 5)] == pytest.approx([0.1, 0.05, 0.1 / 16])
    assert exp.lr_at(9) == exp.lr_at(5)  # after fl.rounds: the last round's rate
    cos = LocalConfig.from_config(_fl(lr_schedule="cosine", lr_min_ratio=0.1))
    assert cos.lr_at(1) == pytest.approx(0.1) and cos.lr_at(5) == pytest.approx(0.01)
    assert cos.lr_at(3) == pytest.approx(0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert cos.lr_at(7) == pytest.approx(0.01)
    # a run config saved before the schedule existed reads as constant
    assert LocalConfig.from_config(_fl()).lr_schedule == "constant"


def test_constant_schedule_is_bit_exact_and_decay_changes_training() -> None:
    data = toy_data()
    parts = partition_iid(len(data), 3, seed=0)
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    old = LocalConfig(2, 0.1, 32, 0.9)  # what the runtime built before fl.lr_schedule
    new = LocalConfig.from_config(_fl(lr_schedule="constant"))
    dec = LocalConfig.from_config(_fl(lr_schedule="exponential", lr_decay=0.5))
    for cls in (SequentialTrainer, VmapTrainer):
        a = cls(model, data, parts, old, seed=1).train(start, [0, 2], 4)
        b = cls(model, data, parts, new, seed=1).train(start, [0, 2], 4)
        c = cls(model, data, parts, dec, seed=1).train(start, [0, 2], 4)
        a1 = cls(model, data, parts, old, seed=1).train(start, [0, 2], 1)
        c1 = cls(model, data, parts, dec, seed=1).train(start, [0, 2], 1)  # round 1: lr itself
        for n in (0, 2):
            assert all(torch.equal(a[n][k], b[n][k]) for k in start)
            assert all(torch.equal(a1[n][k], c1[n][k]) for k in start)
            assert not torch.equal(a[n]["fc3.weight"], c[n]["fc3.weight"])
            # round 4 at lr/8 moves the weights less than round 4 at lr
            da = (a[n]["fc3.weight"] - start["fc3.weight"]).norm()
            dc = (c[n]["fc3.weight"] - start["fc3.weight"]).norm()
            assert dc < da


@pytest.mark.parametrize(
    "override",
    ["fl.lr_schedule=linear", "fl.lr_decay=0", "fl.lr_decay=1.5", "fl.lr_min_ratio=-0.1"],
)
def test_bad_schedule_is_a_config_error(override: str) -> None:
    with pytest.raises(ConfigError):
        validate_config(load_config(None, [override]))
