"""FedAvg as in the paper (Sec. II): local minibatch SGD from Theta[t], aggregation weighted by M_n.

Round t: the server samples ``clients_per_round`` clients C[t] (seeded by ``(seed, t)``); each
starts from Theta[t] and runs E local epochs of minibatch SGD (learning rate eta, batch size B,
optional momentum, fresh optimizer state every round; the client's samples are reshuffled every
epoch from a generator seeded by ``(seed, t, n)``, the last batch of an epoch may be smaller).
The server aggregates the local models (:func:`scaleflu.fl.aggregation.aggregate`; the round
around it is :mod:`scaleflu.fl.strategy`).

Two interchangeable local trainers give the same models up to float rounding:

* :class:`SequentialTrainer` trains one client after another with ``torch.optim.SGD``
  (optionally ``workers`` clients at a time in threads). ``fl.trainer: auto`` picks it.
* :class:`VmapTrainer` trains the selected clients together: their parameters are stacked and
  one ``torch.func.vmap(grad(...))`` call makes the SGD step of minibatch k for every client
  that has a k-th minibatch. Clients are sorted by number of minibatches, so the active ones
  are a prefix of the stack; short last batches are padded and masked out of the loss. Models
  with BatchNorm are refused (padding would leak into batch statistics).

On a CPU vmap turns each convolution into a grouped convolution whose kernels are slow for
small groups, so ``auto`` means sequential there; ``vmap`` stays available (and tested equal)
for accelerators or tiny batches (measurements of both: docs/results/table2.md).

BatchNorm statistics (``fl.bn_recalibration``): averaging the clients' running statistics gives
statistics of *their* models, each an exponential average (momentum 0.1) over a few local steps
that lags its weights; early in training the averaged model's eval-mode forward pass can then
collapse onto one class (docs/reproducing.md, "MobileNetV3 on the CPU"). With
``fl.bn_recalibration: k > 0`` the server re-estimates them after every aggregation from ``k``
of its own validation images (:func:`recalibrate_bn`, :func:`server_images`: unlabelled, the
slice the unlearning methods validate on, never scored as test data); the one FedAvg round
(:class:`scaleflu.fl.strategy.FedAvg`) applies it wherever rounds run, through
:class:`BNRecalibrator`.

Every random choice derives from ``(seed, round, client)``, never from a running generator, so
a run resumed at round k gives the same model as an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from scaleflu.config import config_section
from scaleflu.fl.data import ImageData
from scaleflu.fl.device import cpu_state, infer_batch, infer_slices, model_device, resolve_device
from scaleflu.fl.models import has_batchnorm

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalConfig:
    """Local training settings: E epochs, learning rate eta, batch size B, momentum.

    ``batch_size=None`` is full-batch gradient descent: E steps on the client's whole data
    set, the paper's local update equation taken literally.
    """

    epochs: int
    lr: float
    batch_size: int | None
    momentum: float = 0.0
    lr_schedule: str = "constant"  # constant | exponential | cosine (LR_SCHEDULES)
    lr_decay: float = 1.0  # exponential: lr x decay^(t-1)
    lr_min_ratio: float = 0.0  # cosine: floor as a fraction of lr
    lr_rounds: int = 0  # T of the schedule (fl.rounds); rounds t > T keep round T's lr

    def lr_at(self, t: int) -> float:
        """Learning rate of round ``t`` (1-based); ``constant``: ``lr`` itself, bit-exact.

        Rounds after the schedule's T (fine-tuning, recovery, PGA's post rounds continue the
        run's round numbers) keep round T's rate: the trained model's final rate.
        """
        if self.lr_schedule == "constant" or self.lr_rounds < 1:
            return self.lr
        k = min(max(int(t), 1), self.lr_rounds) - 1  # 0 .. T-1
        if self.lr_schedule == "exponential":
            return self.lr * self.lr_decay**k
        if self.lr_schedule == "cosine":
            floor = self.lr * self.lr_min_ratio
            span = max(self.lr_rounds - 1, 1)
            return floor + (self.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * k / span))
        raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}; choose {LR_SCHEDULES}")

    @classmethod
    def from_config(cls, fl: Mapping[str, Any], epochs: int | None = None) -> LocalConfig:
        """The ``fl`` config section's local settings and lr schedule (``epochs`` overrides E;
        ``batch_size`` null: full batch). A plain mapping gets default.yaml's other keys."""
        fl = config_section("fl", fl)
        return cls(
            int(epochs if epochs is not None else fl.local_epochs),
            float(fl.lr),
            None if fl.batch_size is None else int(fl.batch_size),
            float(fl.momentum),
            str(fl.lr_schedule),
            float(fl.lr_decay),
            float(fl.lr_min_ratio),
            int(fl.rounds),  # T of the schedule
        )


LR_SCHEDULES = ("constant", "exponential", "cosine")


def derive_seed(*keys: int) -> int:
    """A 63-bit seed derived from integer keys (e.g. seed, purpose, round, client)."""
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def select_clients(seed: int, t: int, num_clients: int, per_round: int) -> list[int]:
    """Clients C[t] of round t: ``per_round`` distinct clients, seeded by (seed, t), sorted."""
    if not 1 <= per_round <= num_clients:
        raise ValueError(f"clients_per_round {per_round} must be in 1..{num_clients}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1, t]))
    return sorted(int(n) for n in rng.choice(num_clients, size=per_round, replace=False))


def client_batches(
    num_samples: int, epochs: int, batch_size: int | None, seed: int, t: int, n: int
) -> list[np.ndarray]:
    """Minibatches (positions into the client's sample list) for all E epochs of round t."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2, t, n]))
    batch_size = batch_size or num_samples  # None: full batch
    out = []
    for _ in range(epochs):
        perm = rng.permutation(num_samples)
        out.extend(perm[i : i + batch_size] for i in range(0, num_samples, batch_size))
    return out


class LocalTrainer(Protocol):
    """Trains the selected clients of one round from the same global model."""

    def train(
        self, global_state: Mapping[str, torch.Tensor], clients: Sequence[int], t: int
    ) -> dict[int, State]:
        """Local models Theta_{n,E}[t] of ``clients`` after E epochs from ``global_state``."""
        ...


def train_client(
    model: nn.Module,
    global_state: Mapping[str, torch.Tensor],
    indices: np.ndarray,
    data: ImageData,
    local: LocalConfig,
    seed: int,
    t: int,
    n: int,
) -> State:
    """E local epochs of minibatch SGD for client n (the paper's local update) on ``model``.

    Computes on ``model``'s device (``data`` should live there too); returns a CPU state.
    """
    model.load_state_dict(global_state)
    model.train()
    dev = model_device(model)
    torch.manual_seed(derive_seed(seed, 3, t, n))  # seeds every device's generator
    opt = torch.optim.SGD(model.parameters(), lr=local.lr_at(t), momentum=local.momentum)
    idx_all = torch.as_tensor(indices, dtype=torch.int64, device=data.device)
    for pos in client_batches(len(indices), local.epochs, local.batch_size, seed, t, n):
        idx = idx_all[torch.as_tensor(pos, device=data.device)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(data.inputs(idx).to(dev)), data.labels[idx].to(dev))
        loss.backward()
        opt.step()
    return cpu_state(model.state_dict())


class SequentialTrainer:
    """Loop over clients with ``torch.optim.SGD`` (the reference; BatchNorm and dropout safe).

    ``workers > 1`` trains clients in that many threads, each with its own model replica
    (torch ops release the GIL, so two threads use two cores). Each client's result does not
    depend on which thread trains it; models with dropout stay on one thread, because dropout
    draws from torch's process-wide generator. ``device``: where the replicas and the data
    live (states in and out stay on the CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        data: ImageData,
        parts: Sequence[np.ndarray],
        local: LocalConfig,
        seed: int,
        workers: int = 1,
        device: torch.device | str | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else model_device(model)
        model.to(self.device)
        data = data.to(self.device)
        self.model, self.data, self.parts, self.local, self.seed = model, data, parts, local, seed
        has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
        if workers > 1 and has_dropout:
            log.info("model uses dropout: training clients on one thread for determinism")
            workers = 1
        self.workers = max(1, workers)
        self._replicas = [model] + [copy.deepcopy(model) for _ in range(self.workers - 1)]
        self._pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None

    def _train_many(
        self,
        replica: nn.Module,
        global_state: Mapping[str, torch.Tensor],
        clients: list[int],
        t: int,
    ) -> dict[int, State]:
        return {
            n: train_client(
                replica, global_state, self.parts[n], self.data, self.local, self.seed, t, n
            )
            for n in clients
        }

    def train(
        self, global_state: Mapping[str, torch.Tensor], clients: Sequence[int], t: int
    ) -> dict[int, State]:
        """Local models of ``clients`` trained one after another (or ``workers`` at a time)."""
        clients = list(clients)
        if self._pool is None:
            return self._train_many(self.model, global_state, clients, t)
        # Balance threads by sample count (largest first onto the least loaded thread).
        loads = [0] * self.workers
        shares: list[list[int]] = [[] for _ in range(self.workers)]
        for n in sorted(clients, key=lambda n: -len(self.parts[n])):
            w = loads.index(min(loads))
            shares[w].append(n)
            loads[w] += len(self.parts[n])
        futures = [
            self._pool.submit(self._train_many, rep, global_state, share, t)
            for rep, share in zip(self._replicas, shares, strict=True)
        ]
        out: dict[int, State] = {}
        for f in futures:
            out.update(f.result())
        return {n: out[n] for n in clients}

    def shutdown(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class VmapTrainer:
    """All selected clients in one vmapped SGD step per minibatch index (no BatchNorm)."""

    def __init__(
        self,
        model: nn.Module,
        data: ImageData,
        parts: Sequence[np.ndarray],
        local: LocalConfig,
        seed: int,
        device: torch.device | str | None = None,
    ) -> None:
        if has_batchnorm(model):
            raise ValueError("VmapTrainer does not support BatchNorm models; use SequentialTrainer")
        self.device = torch.device(device) if device is not None else model_device(model)
        model.to(self.device)
        data = data.to(self.device)
        self.model, self.data, self.parts, self.local, self.seed = model, data, parts, local, seed
        self._param_names = [k for k, _ in model.named_parameters()]

        def loss_fn(
            params: State, buffers: State, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
        ) -> torch.Tensor:
            out = functional_call(self.model, (params, buffers), (x,))
            per = F.cross_entropy(out, y, reduction="none")
            return (per * mask).sum() / mask.sum()

        self._step_grad = vmap(grad(loss_fn), in_dims=(0, None, 0, 0, 0), randomness="different")

    def train(
        self, global_state: Mapping[str, torch.Tensor], clients: Sequence[int], t: int
    ) -> dict[int, State]:
        """Local models of ``clients`` trained together with vmap."""
        local, data = self.local, self.data
        lr = local.lr_at(t)
        batches = {
            n: client_batches(len(self.parts[n]), local.epochs, local.batch_size, self.seed, t, n)
            for n in clients
        }
        order = sorted(clients, key=lambda n: (-len(batches[n]), n))
        C = len(order)
        B = max(len(b) for n in order for b in batches[n])
        steps = len(batches[order[0]])
        dev = self.device
        params = {
            k: global_state[k]
            .detach()
            .to(dev)
            .float()
            .unsqueeze(0)
            .repeat(C, *[1] * global_state[k].dim())
            for k in self._param_names
        }
        buffers = {k: v.detach() for k, v in self.model.named_buffers()}
        for k in buffers:
            buffers[k] = global_state[k].detach().to(dev)
        momentum = {k: torch.zeros_like(v) for k, v in params.items()} if local.momentum else {}
        parts = [torch.as_tensor(self.parts[n], dtype=torch.int64) for n in order]
        n_batches = [len(batches[n]) for n in order]
        self.model.train()
        torch.manual_seed(derive_seed(self.seed, 4, t))
        for k in range(steps):
            a = sum(1 for nb in n_batches if nb > k)  # active clients: a prefix of ``order``
            idx = torch.zeros((a, B), dtype=torch.int64)
            mask = torch.zeros((a, B), dtype=torch.float32)
            for i in range(a):
                sel = parts[i][torch.as_tensor(batches[order[i]][k])]
                idx[i, : len(sel)] = sel
                mask[i, : len(sel)] = 1.0
            flat = idx.flatten().to(data.device)
            x = data.inputs(flat).view(a, B, *data.pixels.shape[1:]).to(dev)
            y = data.labels[flat].view(a, B).to(dev)
            mask = mask.to(dev)
            sub = {name: p[:a] for name, p in params.items()}
            grads = self._step_grad(sub, buffers, x, y, mask)
            with torch.no_grad():
                for name, g in grads.items():
                    if local.momentum:
                        buf = momentum[name][:a]
                        if k == 0:
                            buf.copy_(g)
                        else:
                            buf.mul_(local.momentum).add_(g)
                        g = buf
                    params[name][:a].sub_(lr * g)
        out: dict[int, State] = {}
        for i, n in enumerate(order):
            state = cpu_state(global_state)
            for name in self._param_names:
                state[name] = params[name][i].to("cpu", copy=True)
            out[n] = state
        return {n: out[n] for n in clients}


def auto_trainer_kind(model: nn.Module, device: torch.device) -> str:
    """``fl.trainer: auto``: vmap (the round's clients batched) on a GPU unless the model has
    BatchNorm, else sequential (the faster on CPU, see the module docstring)."""
    return "vmap" if device.type == "cuda" and not has_batchnorm(model) else "sequential"


def make_trainer(
    kind: str,
    model: nn.Module,
    data: ImageData,
    parts: Sequence[np.ndarray],
    local: LocalConfig,
    seed: int,
    workers: int = 1,
    device: torch.device | str | None = "cpu",
) -> LocalTrainer:
    """``auto``, ``vmap`` or ``sequential`` on ``device`` (auto | cpu | cuda, see fl.device).

    ``auto``: on a GPU, vmap (all clients of a round batched) unless the model has BatchNorm;
    on the CPU, sequential (the faster there, see the module docstring).
    """
    dev = resolve_device(device)
    if kind == "auto":
        kind = auto_trainer_kind(model, dev)
    if kind == "vmap":
        return VmapTrainer(model, data, parts, local, seed, dev)
    if kind == "sequential":
        return SequentialTrainer(model, data, parts, local, seed, workers, dev)
    raise ValueError(f"unknown trainer {kind!r}; choose auto, vmap or sequential")


def server_val_permutation(num_test: int, seed: int) -> np.ndarray:
    """The seeded permutation of the test set whose head is the server's validation slice."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 41]))
    return rng.permutation(num_test)


def server_images(test: ImageData, seed: int, k: int) -> ImageData:
    """The first ``k`` images of the server's validation slice (``scale.val_size`` of them are
    the unlearning methods' validation set, ``unlearn.base``), in test-set order."""
    perm = server_val_permutation(len(test), seed)
    return test.subset(np.sort(perm[: min(int(k), len(test))]))


@torch.no_grad()
def recalibrate_bn(
    model: nn.Module, state: Mapping[str, torch.Tensor], data: ImageData, batch_size: int = 250
) -> State:
    """``state`` with every BatchNorm running mean/var re-estimated on ``data``.

    The model is loaded with ``state`` and run in train mode over ``data`` (no gradient,
    dropout off) with cumulative averaging (``momentum=None``): the statistics of the state's
    own weights. Every other entry, ``num_batches_tracked`` included, is returned unchanged
    (the same tensors' values); a model without BatchNorm gets ``state`` back as a copy.
    """
    out = {k: v.detach().clone() for k, v in state.items()}
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns or len(data) == 0:
        return out
    was_training = model.training
    model.load_state_dict(state)
    momenta = [m.momentum for m in bns]
    dev = model_device(model)
    try:
        model.eval()
        for m in bns:
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the batches
            m.train()
        for start in range(0, len(data), batch_size):
            model(data.inputs(slice(start, start + batch_size)).to(dev))
    finally:
        for m, mom in zip(bns, momenta, strict=True):
            m.momentum = mom
        model.train(was_training)
    names = {m: n for n, m in model.named_modules()}
    for m in bns:
        prefix = f"{names[m]}." if names[m] else ""
        out[prefix + "running_mean"] = m.running_mean.detach().to("cpu", copy=True)
        out[prefix + "running_var"] = m.running_var.detach().to("cpu", copy=True)
    return out


class BNRecalibrator:
    """The server's BatchNorm re-estimation after an aggregation (``fl.bn_recalibration``).

    Built from a model of the run's architecture, the test set and the config: ``k`` =
    ``fl.bn_recalibration`` server images (0, or a model without BatchNorm: a no-op that returns
    the state itself). Call it on every aggregated global state.
    """

    def __init__(self, model: nn.Module, test: ImageData, seed: int, k: int) -> None:
        k = min(int(k), len(test) // 2)  # the validation slice's cap (unlearn.base)
        self.active = k > 0 and has_batchnorm(model)
        self.model = model
        self.data = server_images(test, seed, k) if self.active else None
        if self.active:
            self.data = self.data.to(model_device(model))

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], model: nn.Module, test: ImageData
    ) -> BNRecalibrator:
        """From ``fl.bn_recalibration`` and ``seed`` (a config saved before the key: off)."""
        k = int(cfg["fl"].get("bn_recalibration") or 0)
        return cls(model, test, int(cfg["seed"]), k)

    def __call__(self, state: State) -> State:
        """The aggregated ``state`` with re-estimated running statistics (when active)."""
        if not self.active:
            return state
        assert self.data is not None
        return recalibrate_bn(self.model, state, self.data)


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageData, batch_size: int | None = None) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``data`` (eval mode; passes of
    ``batch_size`` images, None: the device's, :func:`scaleflu.fl.device.infer_batch`)."""
    was_training = model.training
    model.eval()
    dev = model_device(model)
    correct, loss_sum = 0, 0.0
    for sl in infer_slices(len(data), infer_batch(dev, batch_size)):
        out = model(data.inputs(sl).to(dev))
        y = data.labels[sl].to(dev)
        loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    model.train(was_training)
    n = max(len(data), 1)
    return {"acc": correct / n, "loss": loss_sum / n}


@torch.no_grad()
def attack_success_rate(model: nn.Module, triggered: ImageData, target_label: int) -> float:
    """Fraction of triggered inputs (true label != target) classified as the target label."""
    model.eval()
    dev = model_device(model)
    hits = 0
    for sl in infer_slices(len(triggered), infer_batch(dev)):
        out = model(triggered.inputs(sl).to(dev))
        hits += int((out.argmax(1) == target_label).sum())
    return hits / max(len(triggered), 1)
