"""``fl.device``: where training, evaluation and unlearning compute (auto | cpu | cuda[:k]).

The contract that keeps device support correct by construction: every model *state* that
crosses an API (trainers' results, aggregation, the history, unlearning results) is a CPU
tensor dict; a device is used only inside the computation (the trainer's model replica and
its minibatches, an evaluation pass, an unlearning method's optimisation). ``auto`` is CUDA
when torch sees a GPU, else the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from scaleflu.config import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda")

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


def cpu_state(state: Mapping[str, torch.Tensor]) -> State:
    """Detached CPU copies of a state dict (never aliasing the input)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def state_to(state: Mapping[str, torch.Tensor], device: torch.device | str) -> State:
    """Detached copies of a state dict on ``device``."""
    return {k: v.detach().to(device, copy=True) for k, v in state.items()}
