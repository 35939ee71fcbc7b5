"""The federation both apps build from the run config: data, partitions, model, training.

Everything comes from the runtime's loaders (``scaleflu.fl``), seeded by the config, so the
server and every client derive the same partitions without exchanging them, and the same run
trained by ``scaleflu train`` gives the same models.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping
from typing import Any

import torch

from scaleflu.config import Config, load_config
from scaleflu.fl.fedavg import LocalConfig, train_client
from scaleflu.fl.models import build_model
from scaleflu.fl.run import build_data


def federation_config(run_config: Mapping[str, Any]) -> Config:
    """The scaleflu config of the federation (``scaleflu-set`` overrides on the defaults)."""
    return _config(str(run_config.get("scaleflu-set", "")))


@functools.cache
def _config(overrides: str) -> Config:
    return load_config(None, shlex.split(overrides))


@functools.cache
def _data(overrides: str) -> tuple[Any, list[Any]]:
    cfg = _config(overrides)
    _clean, train, _test, parts, _poison = build_data(cfg)
    return train, parts


def partition_size(run_config: Mapping[str, Any], client: int) -> int:
    """M_n: the number of training samples of ``client``."""
    _train, parts = _data(str(run_config.get("scaleflu-set", "")))
    return len(parts[client])


def local_train(
    run_config: Mapping[str, Any], client: int, state: dict[str, torch.Tensor], server_round: int
) -> dict[str, torch.Tensor]:
    """E local epochs of minibatch SGD of ``client`` from ``state`` (the runtime's local update,
    seeded by (seed, round, client))."""
    overrides = str(run_config.get("scaleflu-set", ""))
    cfg = _config(overrides)
    train, parts = _data(overrides)
    if int(cfg.fl.threads) > 0:
        torch.set_num_threads(int(cfg.fl.threads))
    model = build_model(str(cfg.model.name), train.num_classes, train.in_channels, train.image_size)
    local = LocalConfig.from_config(cfg.fl)
    return train_client(
        model, state, parts[client], train, local, int(cfg.seed), int(server_round), client
    )
