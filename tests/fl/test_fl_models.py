"""Models: shapes for both image geometries, layer order, parameter groups."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from scaleflu.fl.models import (
    MODEL_NAMES,
    build_model,
    has_batchnorm,
    layer_groups,
    max_pool2,
    parameter_groups,
    sensitivity_layers,
)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize(("channels", "size", "classes"), [(1, 28, 10), (3, 32, 100)])
def test_forward_shapes(name: str, channels: int, size: int, classes: int) -> None:
    model = build_model(name, classes, channels, size)
    out = model(torch.randn(2, channels, size, size))
    assert out.shape == (2, classes)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_head_of_trunk_is_the_model_and_holds_no_batchnorm(name: str) -> None:
    # SCALE's forgetting step moves the head alone on trunk features computed once
    model = build_model(name, 10, 1, 28).eval()
    x = torch.randn(3, 1, 28, 28)
    feats = model.trunk(x)
    assert feats.dim() == 2 and torch.equal(model.head(feats), model(x))
    model.head(feats.detach()).sum().backward()
    reached = {n for n, p in model.named_parameters() if p.grad is not None}
    head_modules = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert reached and all(any(n.startswith(h) for h in head_modules) for n in reached)
    assert not any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        for n, m in model.named_modules()
        if any(n.startswith(r.rsplit(".", 1)[0]) for r in reached)
    )


@pytest.mark.parametrize("shape", [(3, 6, 28, 28), (2, 4, 11, 9), (1, 1, 2, 3)])
def test_max_pool2_is_atens_pooling_bit_for_bit(shape: tuple[int, ...]) -> None:
    x = torch.randn(shape)
    x[0, 0, 0, :2] = float("nan")  # a NaN wins its window in both
    x[-1, -1, -2:, :2] = 1.5  # a tie
    with torch.no_grad():
        fast = max_pool2(x)
    ref = torch.nn.functional.max_pool2d(x, 2)
    assert fast.shape == ref.shape
    assert torch.equal(fast.isnan(), ref.isnan()) and torch.equal(
        fast.nan_to_num(), ref.nan_to_num()
    )
    # recording a gradient, it is ATen's kernel (the gradient goes to the first maximum)
    w = x.nan_to_num().requires_grad_()
    max_pool2(w).sum().backward()
    w2 = x.nan_to_num().requires_grad_()
    torch.nn.functional.max_pool2d(w2, 2).sum().backward()
    assert torch.equal(w.grad, w2.grad)
    with pytest.raises(RuntimeError, match="too small"), torch.no_grad():
        max_pool2(torch.randn(1, 1, 1, 4))


def test_unknown_model_is_clear() -> None:
    with pytest.raises(ValueError, match="unknown model 'vgg'.*lenet"):
        build_model("vgg", 10, 1, 28)


def test_sensitivity_layers_are_conv_linear_weights_in_forward_order() -> None:
    lenet = build_model("lenet", 10, 1, 28)
    assert sensitivity_layers(lenet) == [
        "conv1.weight",
        "conv2.weight",
        "fc1.weight",
        "fc2.weight",
        "fc3.weight",
    ]
    resnet = build_model("resnet18", 10, 3, 32)
    layers = sensitivity_layers(resnet)
    assert len(layers) == 21  # 1 stem + 16 block convs + 3 shortcut convs + fc
    assert layers[0] == "conv1.weight" and layers[-1] == "fc.weight"
    # The shortcut conv of layer2.0 runs after the block's main convs.
    assert layers.index("layer2.0.shortcut.0.weight") > layers.index("layer2.0.conv1.weight")
    state = resnet.state_dict()
    assert all(state[name].dim() in (2, 4) for name in layers)
    mobilenet = build_model("mobilenetv3", 10, 1, 28)
    ml = sensitivity_layers(mobilenet)
    assert ml[0] == "features.0.0.weight" and ml[-1] == "classifier.3.weight"
    assert has_batchnorm(mobilenet) and not has_batchnorm(lenet)


@given(st.integers(1, 5000), st.integers(1, 64))
def test_parameter_groups_cover_contiguously(numel: int, G: int) -> None:
    groups = parameter_groups(numel, G)
    assert len(groups) == min(G, numel)
    assert groups[0][0] == 0 and groups[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:], strict=False))
    sizes = [e - s for s, e in groups]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_parameter_groups_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        parameter_groups(0, 3)
    with pytest.raises(ValueError):
        parameter_groups(10, 0)


def test_layer_groups() -> None:
    groups = layer_groups(build_model("lenet", 10, 1, 28), 8)
    assert groups["conv1.weight"][-1] == (132, 150)
    assert all(len(g) == 8 for g in groups.values())


def test_link_samples_lenet_table_is_the_model():
    """scaleflu.link.samples (torch-free, for link tests and benchmarks) matches the model."""
    from scaleflu.fl.models import build_model
    from scaleflu.link.samples import LENET_SHAPES, lenet_like

    model = build_model("lenet", 10, 1, 28)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == LENET_SHAPES
    assert sum(a.size for a in lenet_like(3).values()) == 61706
