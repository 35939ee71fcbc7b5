"""MomentumSGD and Adam: torch.optim's updates, bit for bit, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from scaleflu.fl.optim import Adam, MomentumSGD


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(48, 4)
    )


def _step_both(
    mine: torch.nn.Module,
    ref: torch.nn.Module,
    opt: Any,
    ref_opt: Any,
    seed: int,
    no_grad: Callable[[int], list[str]],
) -> None:
    """Six steps of both optimisers on the same batches, the parameters ``no_grad(step)`` names
    without a gradient; the parameters equal bit for bit after every step."""
    gen = torch.Generator().manual_seed(seed)
    for step in range(6):
        x, y = torch.randn(8, 1, 6, 6, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        for model, o in ((mine, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for name in no_grad(step):
                dict(model.named_parameters())[name].grad = None
            o.step()
        for (name, a), b in zip(mine.named_parameters(), ref.parameters(), strict=True):
            assert torch.equal(a, b), (step, name)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda p: MomentumSGD(p, lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
        (
            lambda p: MomentumSGD(p, lr=0.05, momentum=0.9),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        ),
        (lambda p: Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01, foreach=False)),
    ],
    ids=["sgd", "sgd-momentum", "adam"],
)
def test_same_parameters_as_torch_optim_after_every_step(ours, theirs) -> None:
    mine, ref = _model(0), _model(0)
    frozen = "3.bias"  # a parameter without a gradient is left alone by both
    opt, ref_opt = ours(mine.parameters()), theirs(ref.parameters())
    _step_both(mine, ref, opt, ref_opt, 1, lambda step: [frozen])
    assert torch.equal(
        dict(mine.named_parameters())[frozen], dict(_model(0).named_parameters())[frozen]
    )


def test_adam_with_parameters_that_join_late_is_torchs_bit_for_bit() -> None:
    # the parameters of the first step share one flat state; one that gets its first gradient
    # later has its own (and its own step count): both as torch.optim.Adam
    mine, ref = _model(0), _model(0)
    opt = Adam(mine.parameters(), lr=0.01)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, foreach=False)

    def no_grad(step: int) -> list[str]:
        return ["0.bias"] * (step < 2) + ["3.weight"] * (step == 4)

    _step_both(mine, ref, opt, ref_opt, 2, no_grad)
    assert opt._flat is not None and len(opt._flat[0]) == 3  # the three of the first step


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="lr >= 0"):
        MomentumSGD(_model(0).parameters(), lr=-0.1)
    for kw in ({"lr": -0.1}, {"lr": 0.1, "betas": (1.0, 0.9)}, {"lr": 0.1, "eps": 0.0}):
        with pytest.raises(ValueError, match="Adam needs"):
            Adam(_model(0).parameters(), **kw)


def test_steps_do_not_import_the_compiler() -> None:
    code = (
        "import sys, torch\n"
        "from scaleflu.fl.optim import Adam, MomentumSGD\n"
        "m = torch.nn.Linear(3, 2); o = MomentumSGD(m.parameters(), lr=0.1, momentum=0.9)\n"
        "for _ in range(2):\n"
        "    o.zero_grad(); m(torch.ones(1, 3)).sum().backward(); o.step()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
