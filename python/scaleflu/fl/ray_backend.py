"""Ray backend: every selected client of a round trains as one Ray task.

A task that fails (after Ray's own retries of crashed workers) is logged and left out of the
round, like Flower drops failed replies; the history then records only the clients that
answered, and such a round is no longer reproducible from the seed alone.

Tasks run the same :func:`scaleflu.fl.fedavg.train_client` as the sequential trainer, so a
Ray run equals a local one up to float rounding. Models travel as safetensors bytes (never
pickled tensors); the training set is put into the object store once per run and cached in
each worker process. ``fl.ray_address`` null starts a local Ray instance (with this package on
the workers' PYTHONPATH); otherwise the driver joins that cluster, whose workers must have
``scaleflu`` installed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from scaleflu.fl.data import ImageData
from scaleflu.fl.fedavg import LocalConfig, State, train_client
from scaleflu.fl.models import build_model

log = logging.getLogger(__name__)

_WORKER_CACHE: dict[str, Any] = {}


def ray_available() -> bool:
    """Whether the ``ray`` package can be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _client_task(
    model_args: tuple[str, int, int, int],
    global_bytes: bytes,
    indices: np.ndarray,
    data_key: str,
    data_arrays: dict[str, Any],
    local: LocalConfig,
    seed: int,
    t: int,
    n: int,
    threads: int,
) -> bytes:
    """Worker side: rebuild model and data (cached per worker), train client n, return bytes."""
    torch.set_num_threads(max(1, threads))
    if _WORKER_CACHE.get("data_key") != data_key:
        _WORKER_CACHE["data_key"] = data_key
        _WORKER_CACHE["data"] = ImageData(
            torch.from_numpy(np.array(data_arrays["pixels"])),
            torch.from_numpy(np.array(data_arrays["labels"])),
            tuple(data_arrays["mean"]),
            tuple(data_arrays["std"]),
            int(data_arrays["num_classes"]),
            str(data_arrays["name"]),
        )
    key = ("model", *model_args)
    if key not in _WORKER_CACHE:
        _WORKER_CACHE[key] = build_model(*model_args)
    model = _WORKER_CACHE[key]
    state = train_client(
        model, st_load(global_bytes), indices, _WORKER_CACHE["data"], local, seed, t, n
    )
    return st_save(state)


class RayTrainer:
    """Trains each selected client as a Ray task; same results as the sequential trainer."""

    def __init__(
        self,
        model_args: tuple[str, int, int, int],
        data: ImageData,
        parts: Sequence[np.ndarray],
        local: LocalConfig,
        seed: int,
        address: str | None = None,
        num_cpus: int | None = None,
        cpus_per_client: int = 1,
    ) -> None:
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError("fl.backend=ray needs the ray package: pip install ray") from exc
        self._ray = ray
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU-only: no warning
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                pkg_root = str(Path(__file__).resolve().parents[2])
                path = os.pathsep.join(p for p in (pkg_root, os.environ.get("PYTHONPATH")) if p)
                ray.init(
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path}},
                )
            self._owns_ray = True
        else:
            self._owns_ray = False
        self.model_args, self.parts, self.local, self.seed = model_args, parts, local, seed
        self.cpus_per_client = cpus_per_client
        self._task = ray.remote(num_cpus=cpus_per_client)(_client_task)
        arrays = {
            "pixels": data.pixels.numpy(),
            "labels": data.labels.numpy(),
            "mean": list(data.mean),
            "std": list(data.std),
            "num_classes": data.num_classes,
            "name": data.name,
        }
        self._data_ref = ray.put(arrays)
        self._data_key = f"{id(self)}-{os.getpid()}"

    def train(
        self, global_state: Mapping[str, torch.Tensor], clients: Sequence[int], t: int
    ) -> dict[int, State]:
        """Local models of ``clients``, one Ray task each."""
        blob = st_save({k: v.contiguous() for k, v in global_state.items()})
        blob_ref = self._ray.put(blob)
        futures = {
            n: self._task.remote(
                self.model_args,
                blob_ref,
                self.parts[n],
                self._data_key,
                self._data_ref,
                self.local,
                self.seed,
                t,
                n,
                self.cpus_per_client,
            )
            for n in clients
        }
        out: dict[int, State] = {}
        for n, f in futures.items():
            try:
                out[n] = st_load(self._ray.get(f))
            except self._ray.exceptions.RayError as exc:  # failed replies dropped and logged
                log.warning("round %d: client %d failed on Ray and is left out: %s", t, n, exc)
        if not out:
            raise RuntimeError(f"round {t}: every client task failed on Ray")
        return out

    def shutdown(self) -> None:
        """Stop the local Ray instance if this trainer started it."""
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
