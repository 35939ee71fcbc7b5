"""BatchNorm models (MobileNetV3, ResNet18) with every registered method, at toy size.

One tiny run per model (3 clients, 120 FashionMNIST images, 2 rounds of 1 epoch) and each
method on a client request: it runs, returns a finite state with the model's keys, keeps the
BatchNorm buffers consistent with its method, and is measured. FUSED leaves every BatchNorm
statistic at Theta (frozen base); FedEraser and Retrain carry the clients' aggregated
statistics; SCALE sparsifies conv/linear weights only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from scaleflu.config import load_config
from scaleflu.unlearn.registry import make_method, method_names
from tiny_run_helpers import needs_fmnist

pytestmark = [needs_fmnist, pytest.mark.slow]

TOY = [
    "data.num_clients=3",
    "data.partition=iid",
    "data.train_subset=120",
    "data.test_subset=120",
    "data.poison.backdoor_clients=[0]",
    "data.poison.backdoor_fraction=0.5",
    "data.poison.label_flip_clients=[]",
    "fl.rounds=2",
    "fl.local_epochs=1",
    "fl.lr=0.05",
    "fl.momentum=0.9",
    "fl.clients_per_round=3",
    "fl.batch_size=20",
    "fl.threads=1",
    "fl.device=cpu",
    "scale.val_size=30",
    "scale.ppo.episodes=2",
    "scale.ppo.n_steps=4",
    "scale.ppo.batch_size=4",
    "scale.episode_steps=2",
    "scale.recovery_rounds=1",
    "scale.eval.max_samples=60",
    "scale.eval.mia_samples=30",
    "scale.eval.relearn_max_rounds=0",
    "baselines.fused.rounds=1",
    "baselines.fused.rank=4",
    "baselines.pga.post_rounds=1",
    "baselines.pga.epochs=1",
    "baselines.pga.radius_models=2",
    "baselines.fedraser.interval=1",
]

_RUNS: dict[str, Any] = {}


def _ctx(model: str, tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Any:
    from scaleflu.experiments.cells import RunKey
    from scaleflu.experiments.harness import ensure_run, make_context
    from scaleflu.fl.run import load_run

    name = "-".join([model, *extra])
    if name not in _RUNS:
        cfg = load_config(None, [*TOY, f"model.name={model}", *extra])
        torch.set_num_threads(1)
        key = RunKey("fashion_mnist", model, float(cfg["data"]["alpha"]), 0)
        run = load_run(ensure_run(cfg, key, Path(tmp_path_factory.mktemp(model)), False))
        _RUNS[name] = (cfg, make_context(run, "client:0", cfg, progress=False))
    return _RUNS[name]


def _bn_buffers(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in state if k.endswith(("running_mean", "running_var"))]


@pytest.mark.parametrize("model", ["mobilenetv3", "resnet18"])
@pytest.mark.parametrize(
    "method", ["retrain", "fedraser", "pga", "fused", "scale", "finetune", "finetune_matched"]
)
def test_every_method_on_batchnorm_models(
    model: str, method: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Each method (and the fine-tune controls) unlearns client 0 from a BatchNorm model."""
    assert method in method_names()
    cfg, ctx = _ctx(model, tmp_path_factory)
    theta = ctx.original_state()
    bn = _bn_buffers(theta)
    assert bn, "the model has BatchNorm statistics"
    extra: dict[str, Any] = {"mode": "default"} if method == "scale" else {}
    if method == "finetune_matched":
        extra = {"budget_cpu_s": 0.01}  # the control matched to a (tiny) CPU budget: 1 round
    unlearner = make_method(method, cfg, **extra)
    res = unlearner.run(ctx)
    state = ctx.last_state
    assert set(state) == set(theta)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    assert all(v.device.type == "cpu" for v in state.values())
    assert res.method.split("-")[0] == method and res.metrics["test_acc"] is not None
    assert res.metrics["backdoor_asr"] is not None
    changed_bn = [k for k in bn if not torch.equal(state[k], theta[k])]
    if method == "fused":
        assert not changed_bn  # frozen base: BatchNorm statistics untouched
        assert set(k for k in theta if not torch.equal(state[k], theta[k])) <= set(
            res.details["critical_layers"]
        )
    elif method in ("retrain", "fedraser", "pga", "finetune", "finetune_matched"):
        assert changed_bn  # the clients' aggregated statistics
    else:  # scale: sparsified conv/linear weights (+ a recovery round)
        assert any(not torch.equal(state[k], theta[k]) for k in res.details["sensitivity"]["top"])


RECAL = "fl.bn_recalibration=20"  # of the 30 validation images (scale.val_size)


def _recalibrated(ctx: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from scaleflu.fl.fedavg import recalibrate_bn, server_images

    images = server_images(ctx.run.setup.test, 0, 20)
    return recalibrate_bn(ctx.new_model(), state, images)


@pytest.mark.parametrize("method", ["retrain", "fedraser", "pga", "finetune", "fused", "scale"])
def test_every_method_with_server_bn_recalibration(
    method: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """fl.bn_recalibration: the trained model and every FedAvg-based method's result carry the
    server's re-estimated statistics of their own weights; FUSED keeps Theta's (frozen base)."""
    cfg, ctx = _ctx("mobilenetv3", tmp_path_factory, RECAL)
    theta = ctx.original_state()
    bn = _bn_buffers(theta)
    recal_theta = _recalibrated(ctx, theta)
    assert all(torch.equal(theta[k], recal_theta[k]) for k in bn)  # training re-estimated them
    extra: dict[str, Any] = {"mode": "default"} if method == "scale" else {}
    res = make_method(method, cfg, **extra).run(ctx)
    state = ctx.last_state
    assert set(state) == set(theta) and res.metrics["test_acc"] is not None
    if method == "fused":
        assert all(torch.equal(state[k], theta[k]) for k in bn)
    elif method == "scale":  # sparsified weights; its recovery round re-estimates the statistics
        assert any(not torch.equal(state[k], theta[k]) for k in res.details["sensitivity"]["top"])
    recovered = method != "scale" or (
        res.details["recovery"]["rounds"] > 0 and res.details.get("healing") is None
    )
    if method != "fused" and recovered:  # SCALE: when its last step is a FedAvg round
        want = _recalibrated(ctx, state)
        assert all(torch.equal(state[k], want[k]) for k in bn), method
