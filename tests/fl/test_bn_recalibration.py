"""The server's BatchNorm re-estimation (``fl.bn_recalibration``) and the defect it fixes.

FedAvg of the clients' running statistics leaves a MobileNetV3 global model whose eval-mode
forward pass predicts one class for every image early in training, while its weights, with
statistics re-estimated on the server's validation images, are well above chance
(docs/reproducing.md, "MobileNetV3 on the CPU"). The end-to-end test trains a tiny MobileNetV3
run both ways through the product's ``fl.run.train``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fl_helpers import needs_fmnist
from torch import nn

from scaleflu.config import ConfigError, load_config
from scaleflu.fl.data import load_fashion_mnist
from scaleflu.fl.fedavg import (
    BNRecalibrator,
    evaluate,
    recalibrate_bn,
    server_images,
    server_val_permutation,
)
from scaleflu.fl.models import build_model

pytestmark = needs_fmnist


@pytest.fixture(scope="module")
def test_set():
    _, test = load_fashion_mnist()
    return test.subset(np.arange(400))


def test_recalibrate_bn_is_the_batch_statistics_and_leaves_the_rest(test_set) -> None:
    torch.manual_seed(0)
    model = build_model("mobilenetv3", 10, 1, 28)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    data = test_set.subset(np.arange(100))
    out = recalibrate_bn(model, state, data, batch_size=40)  # 3 batches: cumulative average
    # the first BatchNorm sees the stem conv's output: its statistics, computed directly
    with torch.no_grad():
        conv = model.features[0][0]
        conv.weight.copy_(state["features.0.0.weight"])
        y = conv(data.inputs())
    # momentum None: the running statistics are the mean over the batches of each batch's
    # mean and unbiased variance (batches 0-39, 40-79, 80-99)
    chunks = y.split(40)
    mean = torch.stack([c.mean(dim=(0, 2, 3)) for c in chunks]).mean(0)
    var = torch.stack([c.var(dim=(0, 2, 3), unbiased=True) for c in chunks]).mean(0)
    torch.testing.assert_close(out["features.0.1.running_mean"], mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["features.0.1.running_var"], var, rtol=1e-3, atol=1e-5)
    for k, v in state.items():
        if k.endswith(("running_mean", "running_var")):
            assert not torch.equal(out[k], v), k  # every BatchNorm layer re-estimated
        else:
            assert torch.equal(out[k], v), k  # weights and num_batches_tracked bit-exact
    # the model's own settings are restored (momentum, mode)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(m.momentum == 0.1 for m in bns)


def test_no_batchnorm_or_zero_is_a_no_op(test_set) -> None:
    lenet = build_model("lenet", 10, 1, 28)
    state = lenet.state_dict()
    assert not BNRecalibrator(lenet, test_set, 0, 100).active
    out = recalibrate_bn(lenet, state, test_set)
    assert all(torch.equal(out[k], v) for k, v in state.items())
    mnv3 = build_model("mobilenetv3", 10, 1, 28)
    off = BNRecalibrator(mnv3, test_set, 0, 0)
    s = mnv3.state_dict()
    assert not off.active and off(s) is s


def test_server_images_are_the_head_of_the_validation_slice(test_set) -> None:
    perm = server_val_permutation(len(test_set), 3)
    imgs = server_images(test_set, 3, 50)
    want = test_set.subset(np.sort(perm[:50]))
    assert torch.equal(imgs.pixels, want.pixels)
    # the cap of the validation slice: at most half of the test set
    assert (
        len(BNRecalibrator(build_model("mobilenetv3", 10, 1, 28), test_set, 3, 10**6).data) == 200
    )


def test_config_checks() -> None:
    assert load_config(None, ["fl.bn_recalibration=200"]).fl.bn_recalibration == 200
    with pytest.raises(ConfigError, match="bn_recalibration"):
        load_config(None, ["fl.bn_recalibration=-1"])
    with pytest.raises(ConfigError, match="exceeds scale.val_size"):
        load_config(None, ["fl.bn_recalibration=600", "scale.val_size=500"])
    with pytest.raises(ConfigError, match="bn_recalibration"):
        load_config(None, ["fl.bn_recalibration=1.5"])


TINY = [
    "model.name=mobilenetv3",
    "data.num_clients=4",
    "data.partition=iid",
    "data.train_subset=800",
    "data.test_subset=1000",
    "fl.clients_per_round=4",
    "fl.rounds=3",
    "fl.local_epochs=1",
    "fl.batch_size=16",
    "fl.lr=0.02",
    "fl.momentum=0.9",
    "fl.threads=1",
    "fl.device=cpu",
    "scale.val_size=500",
]


def _train(k: int, out) -> tuple:
    from scaleflu.fl.run import build_setup, train

    torch.set_num_threads(1)
    cfg = load_config(None, [*TINY, f"fl.bn_recalibration={k}"])
    run = train(cfg, out, progress=False, outputs=False)
    return run, server_images(build_setup(run.cfg).test, 0, 500)


def _top_share(model: nn.Module, val) -> float:
    with torch.no_grad():
        model.eval()
        pred = model(val.inputs()).argmax(1)
    return float(torch.bincount(pred, minlength=10).max()) / len(val)


@pytest.fixture(scope="module")
def recal_run(tmp_path_factory):
    return _train(200, tmp_path_factory.mktemp("recal"))


@pytest.mark.slow
def test_fedavg_mobilenet_learns_with_server_recalibration(recal_run) -> None:
    """A tiny MobileNetV3 run through ``fl.run.train`` with ``fl.bn_recalibration``: above
    chance on the server's validation images in eval mode, and not one class for all.
    (Without it the same weights score 0.096: one class, the next test.)"""
    run, val = recal_run
    acc = evaluate(run.model, val)["acc"]
    assert acc >= 0.17, acc  # chance: 0.10
    assert _top_share(run.model, val) < 0.8


@pytest.mark.slow
def test_averaged_statistics_collapse_on_the_same_weights(recal_run, tmp_path) -> None:
    """The defect: the same run with FedAvg of the clients' statistics (bn_recalibration 0) has
    bit-identical weights (statistics do not enter train-mode steps) and is far below."""
    run, val = recal_run
    off, _ = _train(0, tmp_path / "off")
    ours, theirs = run.model.state_dict(), off.model.state_dict()
    for k, v in ours.items():
        if not k.endswith(("running_mean", "running_var")):
            assert torch.equal(v, theirs[k]), k
    acc, acc_off = evaluate(run.model, val)["acc"], evaluate(off.model, val)["acc"]
    assert acc >= acc_off + 0.05, (acc, acc_off)
    assert _top_share(off.model, val) > 0.8  # one class for (nearly) every image
