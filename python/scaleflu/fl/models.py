"""Models of the paper (LeNet-5, MobileNetV3-Small, ResNet18) in plain torch, and its layers.

All three take ``(B, in_channels, image_size, image_size)`` inputs for any channel and class
count; the stems are sized for 28x28 (FashionMNIST) and 32x32 (CIFAR-100) images:

* LeNet-5: conv5(6)-pool-conv5(16)-pool-fc120-fc84-fc(classes) with ReLU and max pooling; the
  first conv pads by 2 when the image is smaller than 32, so a 28x28 image sees the classic
  32x32 geometry.
* MobileNetV3-Small: the architecture of Howard et al. (2019) with the stem and the first block
  at stride 1 instead of 2 (total downsampling 8 instead of 32), as is usual for small images.
* ResNet18: BasicBlock [2, 2, 2, 2], CIFAR-style stem (3x3 conv, stride 1, no max pool).

Layers in the paper's sense (``W_l``) follow the SCALE authors' code: every Conv/Linear
*weight* tensor, in forward order (:func:`sensitivity_layers`). A layer's flattened weight is
cut into ``G`` contiguous parameter groups ``[start, end)`` of sizes differing by at most one
(:func:`parameter_groups`); ``G`` is capped at the tensor's size so no group is empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from scaleflu import plugins

log = logging.getLogger(__name__)

MODEL_NAMES = ("lenet", "mobilenetv3", "resnet18")


def max_pool2(x: torch.Tensor) -> torch.Tensor:
    """2x2 max pooling, stride 2 (``F.max_pool2d(x, 2)``). Where no gradient is recorded it is
    taken as the maximum of the four strided quarters: the same values bit for bit (a maximum
    rounds nothing), about ten times faster than ATen's single-threaded CPU kernel on NCHW
    tensors (LeNet-5's inference passes spent two thirds of their time pooling). Training keeps
    ATen's kernel and its gradient (to the first maximum of each window)."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    if (torch.is_grad_enabled() and x.requires_grad) or not (h and w):
        return F.max_pool2d(x, 2)  # (and its error for a window larger than the input)
    rows = torch.maximum(x[..., 0:h:2, :w], x[..., 1:h:2, :w])
    return torch.maximum(rows[..., 0::2], rows[..., 1::2])


class LeNet5(nn.Module):
    """LeNet-5 with ReLU and max pooling; pads the first conv for images smaller than 32."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        pad = 2 if image_size < 32 else 0
        self.conv1 = nn.Conv2d(in_channels, 6, kernel_size=5, padding=pad)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        side = ((image_size + 2 * pad - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"LeNet-5 needs images of at least 12x12, got {image_size}")
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutional part: flat features for :meth:`head`."""
        x = max_pool2(F.relu(self.conv1(x)))
        x = max_pool2(F.relu(self.conv2(x)))
        return torch.flatten(x, 1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The fully connected part: logits from :meth:`trunk`'s features."""
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

    def head_layers(self) -> list[nn.Linear]:
        """:meth:`head` as its linear layers: each but the last followed by a ReLU, nothing
        else (what a step that computes the head's gradient itself may rely on)."""
        return [self.fc1, self.fc2, self.fc3]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of images."""
        return self.head(self.trunk(x))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        squeeze = _make_divisible(channels // 4, 8)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


class _ConvBNAct(nn.Sequential):
    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int,
        groups: int = 1,
        act: Callable[[], nn.Module] | None = nn.Hardswish,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class _InvertedResidual(nn.Module):
    def __init__(
        self, cin: int, kernel: int, exp: int, cout: int, se: bool, hs: bool, stride: int
    ) -> None:
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(_ConvBNAct(cin, exp, 1, 1, act=act))
        layers.append(_ConvBNAct(exp, exp, kernel, stride, groups=exp, act=act))
        if se:
            layers.append(_SqueezeExcite(exp))
        layers.append(_ConvBNAct(exp, cout, 1, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.use_res else y


# kernel, expansion, out, squeeze-excite, hard-swish, stride (MobileNetV3-Small, Table 2).
_MNV3_SMALL = [
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
]


class MobileNetV3Small(nn.Module):
    """MobileNetV3-Small; stem and first block at stride 1 when images are 32x32 or smaller."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        image_size: int = 28,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        small = image_size <= 64
        layers: list[nn.Module] = [_ConvBNAct(in_channels, 16, 3, 1 if small else 2)]
        cin = 16
        for i, (k, exp, cout, se, hs, s) in enumerate(_MNV3_SMALL):
            stride = 1 if (small and i == 0) else s
            layers.append(_InvertedResidual(cin, k, exp, cout, se, hs, stride))
            cin = cout
        layers.append(_ConvBNAct(cin, 576, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(576, 1024),
            nn.Hardswish(),
            nn.Dropout(dropout),
            nn.Linear(1024, num_classes),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutional part, pooled: flat features for :meth:`head`."""
        return torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The classifier: logits from :meth:`trunk`'s features."""
        return self.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of images."""
        return self.head(self.trunk(x))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet18 with a CIFAR-style stem (3x3 conv, stride 1, no max pool) for 28/32 px images."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        small = image_size <= 64
        if small:
            self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.pool = nn.Identity() if small else nn.MaxPool2d(3, 2, 1)
        cin = 64
        stages = []
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """The convolutional part, pooled: flat features for :meth:`head`."""
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The classifier: logits from :meth:`trunk`'s features."""
        return self.fc(x)

    def head_layers(self) -> list[nn.Linear]:
        """:meth:`head` as its linear layers (one)."""
        return [self.fc]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of images."""
        return self.head(self.trunk(x))


_BUILDERS: dict[str, type[nn.Module]] = {
    "lenet": LeNet5,
    "mobilenetv3": MobileNetV3Small,
    "resnet18": ResNet18,
}


def build_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Build one of ``MODEL_NAMES``, or a model a plugin registered (:mod:`scaleflu.plugins`),
    for the given class count, channels and square image size."""
    key = name.lower().replace("-", "").replace("_", "")
    aliases = {"lenet5": "lenet", "mobilenetv3small": "mobilenetv3", "mobilenet": "mobilenetv3"}
    key = aliases.get(key, key)
    if key not in _BUILDERS and plugins.model_builder(name) is None:
        names = ", ".join((*MODEL_NAMES, *plugins.model_names()))
        raise ValueError(
            f"unknown model {name!r}; choose one of {names} (or register yours: scaleflu.plugins)"
        )
    if num_classes < 1 or in_channels < 1 or image_size < 1:
        raise ValueError(
            f"bad model shape: num_classes={num_classes}, in_channels={in_channels}, "
            f"image_size={image_size}"
        )
    if key not in _BUILDERS:
        model = build_plugin_model(name, num_classes, in_channels, image_size)
    else:
        model = _BUILDERS[key](
            num_classes=num_classes, in_channels=in_channels, image_size=image_size
        )
    model.input_shape = (in_channels, image_size, image_size)  # type: ignore[assignment]
    return model


def has_batchnorm(model: nn.Module) -> bool:
    """True when the model holds BatchNorm layers (running statistics as buffers)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def sensitivity_layers(model: nn.Module) -> list[str]:
    """State-dict names of every Conv/Linear weight, in forward (call) order: the paper's W_l."""
    layer_types = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
    names = {m: n for n, m in model.named_modules() if isinstance(m, layer_types)}
    registration = [f"{n}.weight" for n in names.values()]
    shape = getattr(model, "input_shape", None)
    if shape is None:
        return registration
    order: list[str] = []
    hooks = [
        m.register_forward_hook(lambda mod, _i, _o: order.append(f"{names[mod]}.weight"))
        for m in names
    ]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            model(torch.zeros((1, *shape), device=device))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    seen: set[str] = set()
    ordered = [n for n in order if not (n in seen or seen.add(n))]
    # Layers not reached by forward (unused) go last, in registration order.
    return ordered + [n for n in registration if n not in seen]


def parameter_groups(numel: int, G: int) -> list[tuple[int, int]]:
    """``G`` contiguous ``[start, end)`` chunks of a flattened tensor, sizes differing by <= 1."""
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    if G < 1:
        raise ValueError(f"G must be >= 1, got {G}")
    G = min(G, numel)
    base, extra = divmod(numel, G)
    groups = []
    start = 0
    for j in range(G):
        end = start + base + (1 if j < extra else 0)
        groups.append((start, end))
        start = end
    return groups


def layer_groups(model: nn.Module, G: int) -> dict[str, list[tuple[int, int]]]:
    """Parameter groups of every sensitivity layer: ``{layer_name: [(start, end), ...]}``."""
    params = dict(model.named_parameters())
    return {name: parameter_groups(params[name].numel(), G) for name in sensitivity_layers(model)}


def build_plugin_model(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """Call the registered builder of ``name`` and check that it returned a module that maps
    one image to ``num_classes`` logits."""
    builder = plugins.model_builder(name)
    if builder is None:
        raise plugins.PluginError(f"no model {name!r} is registered")
    where = f"model {name!r} ({plugins.origin('model', name)})"
    try:
        model = builder(num_classes, in_channels, image_size)
    except Exception as exc:  # noqa: BLE001 - the user's builder: one line
        raise plugins.PluginError(f"{where} failed to build: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise plugins.PluginError(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
    if not any(True for _ in model.parameters()):
        raise plugins.PluginError(f"{where} has no parameters to train")
    try:
        with torch.no_grad():
            was = model.training
            model.eval()
            out = model(torch.zeros(2, in_channels, image_size, image_size))
            model.train(was)
    except Exception as exc:  # noqa: BLE001
        raise plugins.PluginError(
            f"{where} cannot take a batch of {in_channels}x{image_size}x{image_size} images: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise plugins.PluginError(
            f"{where} gives {shape} for 2 images; expected (2, {num_classes}) logits"
        )
    return model
