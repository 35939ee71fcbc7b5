"""fl.device: resolution, CPU states at every API, trainers and evaluation on a device.

The CUDA tests run wherever torch sees a GPU and are skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from fl_helpers import toy_data

from scaleflu.config import ConfigError, load_config
from scaleflu.fl.data import partition_dirichlet
from scaleflu.fl.device import (
    CPU_INFER_BATCH,
    GPU_INFER_BATCH,
    config_device,
    cpu_state,
    infer,
    infer_batch,
    infer_slices,
    resolve_device,
)
from scaleflu.fl.fedavg import (
    LocalConfig,
    SequentialTrainer,
    VmapTrainer,
    auto_trainer_kind,
    evaluate,
    make_trainer,
)
from scaleflu.fl.models import build_model
from scaleflu.fl.run import validate_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto follows torch's CUDA availability; cpu always works; nonsense is refused."""
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None) == resolve_device("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="auto, cpu or cuda"):
        resolve_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert config_device({"fl": {}}) == torch.device("cuda")  # runs saved before fl.device


def test_config_validates_the_device() -> None:
    """fl.device is checked with the rest of the FL settings; the default is auto."""
    assert load_config()["fl"]["device"] == "auto"
    with pytest.raises(ConfigError, match="fl.device"):
        validate_config(load_config(None, ["fl.device=tpu"]))
    validate_config(load_config(None, ["fl.device=cpu"]))


def test_auto_trainer_batches_clients_on_a_gpu_unless_batchnorm() -> None:
    """trainer auto: vmap on CUDA for LeNet, sequential for BatchNorm models and on the CPU."""
    lenet, mnv3 = build_model("lenet", 10, 1, 28), build_model("mobilenetv3", 10, 1, 28)
    assert auto_trainer_kind(lenet, torch.device("cuda")) == "vmap"
    assert auto_trainer_kind(mnv3, torch.device("cuda")) == "sequential"
    assert auto_trainer_kind(lenet, torch.device("cpu")) == "sequential"


@pytest.mark.parametrize("kind", ["sequential", "vmap"])
def test_trainers_return_independent_cpu_states(kind: str) -> None:
    """Explicit device=cpu is the old behaviour bit for bit; states are CPU copies."""
    data = toy_data()
    parts = partition_dirichlet(data.labels.numpy(), 4, 1.0, seed=1)
    local = LocalConfig(epochs=1, lr=0.05, batch_size=16, momentum=0.9)
    torch.manual_seed(0)
    model = build_model("lenet", 10, 1, 28)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    a = make_trainer(kind, model, data, parts, local, 3).train(start, [0, 2], 1)
    b = make_trainer(kind, model, data, parts, local, 3, device="cpu").train(start, [0, 2], 1)
    for n in (0, 2):
        for k in start:
            assert a[n][k].device.type == "cpu" and torch.equal(a[n][k], b[n][k]), (n, k)
    before = a[0]["fc3.weight"].clone()
    b[0]["fc3.weight"].add_(1.0)  # no aliasing between results, or with the model
    assert torch.equal(a[0]["fc3.weight"], before)
    assert not any(v.data_ptr() == a[0][k].data_ptr() for k, v in model.state_dict().items())


def test_image_data_to_and_cpu_state() -> None:
    """ImageData.to is a no-op on its own device; cpu_state copies."""
    data = toy_data(10)
    assert data.to("cpu") is data and data.device.type == "cpu"
    x = data.inputs(torch.tensor([3, 1]))
    assert x.shape == (2, 1, 28, 28) and x.dtype == torch.float32
    st = {"w": torch.ones(2)}
    out = cpu_state(st)
    out["w"].add_(1)
    assert torch.equal(st["w"], torch.ones(2))


@needs_cuda
@pytest.mark.parametrize("kind", ["sequential", "vmap"])
def test_cuda_trainer_matches_cpu(kind: str) -> None:
    """The same round on CUDA and on the CPU: the same models up to float rounding."""
    data = toy_data()
    parts = partition_dirichlet(data.labels.numpy(), 4, 1.0, seed=1)
    local = LocalConfig(epochs=1, lr=0.05, batch_size=16, momentum=0.9)
    torch.manual_seed(0)
    start = build_model("lenet", 10, 1, 28).state_dict()
    cpu = make_trainer(kind, build_model("lenet", 10, 1, 28), data, parts, local, 3, 1, "cpu")
    gpu = make_trainer(kind, build_model("lenet", 10, 1, 28), data, parts, local, 3, 1, "cuda")
    assert isinstance(gpu, SequentialTrainer | VmapTrainer)
    a, b = cpu.train(start, [0, 1, 3], 1), gpu.train(start, [0, 1, 3], 1)
    for n in a:
        for k in a[n]:
            assert b[n][k].device.type == "cpu"
            assert torch.allclose(a[n][k], b[n][k], atol=1e-4, rtol=1e-3), (n, k)
    model = build_model("lenet", 10, 1, 28).cuda()
    model.load_state_dict(b[0])
    ev_gpu = evaluate(model, data)
    ev_cpu = evaluate(build_model("lenet", 10, 1, 28).eval().requires_grad_(False), data)
    assert 0.0 <= ev_gpu["acc"] <= 1.0 and ev_cpu["loss"] > 0


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 127, 129, 500, 1000, 10000])
@pytest.mark.parametrize("b", [1, 7, 64, 1024])
def test_infer_slices_cover_the_set_in_near_equal_passes(n: int, b: int) -> None:
    """Consecutive, covering [0, n) once, ceil(n / b) passes of at most b whose lengths differ
    by at most one: no short last pass."""
    sl = infer_slices(n, b)
    assert len(sl) == -(-n // b)
    assert [i for s in sl for i in range(s.start, s.stop)] == list(range(n))
    lengths = [s.stop - s.start for s in sl]
    assert all(0 < k <= b for k in lengths)
    assert not lengths or max(lengths) - min(lengths) <= 1


def test_infer_batch_by_device_and_refuses_an_empty_pass() -> None:
    assert infer_batch("cpu") == CPU_INFER_BATCH == 64
    assert infer_batch(torch.device("cuda:0")) == GPU_INFER_BATCH
    assert infer_batch("cpu", 1000) == 1000
    with pytest.raises(ValueError, match="at least 1 image"):
        infer_batch("cpu", 0)


@pytest.mark.parametrize("name", ["lenet", "mobilenetv3"])
def test_infer_gives_the_whole_batchs_logits(name: str) -> None:
    """The model in passes gives what one pass over the set gives, row for row (the order kept;
    equal within float rounding: the kernels a pass size picks may differ on other CPUs), and
    an empty set gives an empty result of the model's width."""
    torch.manual_seed(0)
    model = build_model(name, 10, 1, 28).eval()
    x = torch.randn(150, 1, 28, 28)
    with torch.no_grad():
        whole = model(x)
    got = infer(model, x)
    assert got.shape == whole.shape and not got.requires_grad
    assert torch.allclose(got, whole, rtol=1e-5, atol=1e-6)
    assert torch.equal(infer(model, x, 7).argmax(1), whole.argmax(1))
    assert infer(model, x[:0]).shape == (0, 10)


def test_evaluation_passes_default_to_the_devices_and_a_config_may_set_them() -> None:
    """evaluate() in the CPU's passes scores as one pass does; fl.eval_batch_size is null by
    default (the device's) and refuses 0."""
    data = toy_data(n=130)
    torch.manual_seed(1)
    model = build_model("lenet", 10, 1, 28)
    a, b = evaluate(model, data), evaluate(model, data, 1000)
    assert a["acc"] == b["acc"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert load_config()["fl"]["eval_batch_size"] is None
    validate_config(load_config(None, ["fl.eval_batch_size=128"]))
    with pytest.raises(ConfigError, match="eval_batch_size"):
        validate_config(load_config(None, ["fl.eval_batch_size=0"]))
