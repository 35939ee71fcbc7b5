"""``fl.device``: where training, evaluation and unlearning compute (auto | cpu | cuda[:k]).

The contract that keeps device support correct by construction: every model *state* that
crosses an API (trainers' results, aggregation, the history, unlearning results) is a CPU
tensor dict; a device is used only inside the computation (the trainer's model replica and
its minibatches, an evaluation pass, an unlearning method's optimisation). ``auto`` is CUDA
when torch sees a GPU, else the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from scaleflu.config import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda")

#: Images per inference pass (no gradient) on a CPU. A large pass's activations leave the
#: caches: one thread, milliseconds per image in passes of 1024 / 64, MobileNetV3-Small 3.14 /
#: 0.91, LeNet-5 0.061 / 0.022, ResNet18 14.6 / 10.7 (``benchmarks/infer_batch.py``, which also
#: reports that the logits were the same bit for bit at every pass size from 16 up on the
#: machine that measured it); :func:`infer_slices` keeps every pass of a set above 32 images.
CPU_INFER_BATCH = 64
#: Images per inference pass on a GPU, where a large batch is what it wants.
GPU_INFER_BATCH = 1024

State = dict[str, torch.Tensor]


def resolve_device(name: str | torch.device | None = "auto") -> torch.device:
    """The torch device for ``auto`` / ``cpu`` / ``cuda`` / ``cuda:k`` (ConfigError otherwise)."""
    if isinstance(name, torch.device):
        return name
    text = "auto" if name is None else str(name).strip().lower()
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(f"fl.device is {name!r} but torch sees no CUDA device")
        dev = torch.device(text)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"fl.device {name!r}: only {torch.cuda.device_count()} CUDA device(s)"
            )
        return dev
    raise ConfigError(f"fl.device must be auto, cpu or cuda[:k], got {name!r}")


def config_device(cfg: Mapping[str, Any]) -> torch.device:
    """The device of a config (runs saved before ``fl.device`` existed: ``auto``)."""
    return resolve_device((cfg.get("fl") or {}).get("device", "auto"))


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (or buffer); CPU for an empty model."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def infer_batch(device: torch.device | str, batch_size: int | None = None) -> int:
    """``batch_size``, or where None the pass size for ``device`` (CPU: :data:`CPU_INFER_BATCH`,
    else :data:`GPU_INFER_BATCH`): the config's ``fl.eval_batch_size`` null."""
    if batch_size is not None:
        if int(batch_size) < 1:
            raise ValueError(f"an inference batch must hold at least 1 image, got {batch_size}")
        return int(batch_size)
    return CPU_INFER_BATCH if torch.device(device).type == "cpu" else GPU_INFER_BATCH


def infer_slices(n: int, batch_size: int) -> list[slice]:
    """``[0, n)`` as ``ceil(n / batch_size)`` consecutive slices of near-equal length (their
    lengths differ by at most one; none empty): no short last pass."""
    if n <= 0:
        return []
    k = -(-int(n) // int(batch_size))
    base, extra = divmod(int(n), k)
    out, start = [], 0
    for i in range(k):
        stop = start + base + (1 if i < extra else 0)
        out.append(slice(start, stop))
        start = stop
    return out


def infer(
    model: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    batch_size: int | None = None,
) -> torch.Tensor:
    """``model`` (a module, or a part of one such as its trunk) on ``x`` in passes of
    :func:`infer_slices`, without gradient; the outputs concatenated (on ``x``'s device)."""
    b = infer_batch(x.device, batch_size)
    with torch.no_grad():
        parts = [model(x[s]) for s in infer_slices(len(x), b)]
        return torch.cat(parts) if parts else model(x[:0])


def cpu_state(state: Mapping[str, torch.Tensor]) -> State:
    """Detached CPU copies of a state dict (never aliasing the input)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def state_to(state: Mapping[str, torch.Tensor], device: torch.device | str) -> State:
    """Detached copies of a state dict on ``device``."""
    return {k: v.detach().to(device, copy=True) for k, v in state.items()}
