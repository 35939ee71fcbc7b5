"""FUSED (Zhong et al., CVPR 2025): reversible unlearning by knowledge overwriting with adapters.

1. Critical-layer identification: per Conv/Linear weight l, how much clients change it, from the
   history's stored client updates: ``score_l = mean_n ||Delta_{n,l}|| / ||Theta[t]_l||``
   (relative change, so large layers do not win by size). With ``layer_choice: request`` only
   the clients holding the data to forget count (weighted by their forget share), over the
   last ``cli_rounds`` rounds they took part in: the layers this request's data moved most.
   The ``num_layers`` highest-scoring layers get adapters.
2. Sparse low-rank adapters on those layers only: ``W_l' = W_l + (alpha / r) * B_l A_l`` with
   ``A_l`` of shape (r, fan_in) initialised as in LoRA and ``B_l`` (fan_out, r) zero, so training
   starts at Theta. Conv weights are viewed as (out, in * kh * kw). The base model is frozen
   (BatchNorm statistics too: the forward pass runs in eval mode).
3. The adapters are trained with FedAvg by the remaining clients on their remaining data
   (``rounds`` rounds, default ``fl.rounds`` as in the reference code; the run's client
   sampling, ``local_epochs`` epochs of SGD on the adapter parameters only); only adapter
   tensors go over the link.
4. Reversible: the base model is untouched; :func:`drop_adapters` removes the merged adapters
   and gives Theta back (``FusedUnlearner.base_state`` keeps it exactly).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from scaleflu.fl.fedavg import client_batches, derive_seed
from scaleflu.fl.models import sensitivity_layers
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker, annotate
from scaleflu.unlearn.baselines.common import baseline_config, round_link

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def _relative_changes(
    ctx: UnlearnContext, layers: list[str], rounds: list[int], clients: set[int] | None
) -> dict[int, dict[str, list[float]]]:
    """Per client: ``||Delta_{n,l}[t]|| / ||Theta[t]_l||`` over ``rounds`` (``clients``: only)."""
    history = ctx.run.history
    out: dict[int, dict[str, list[float]]] = {}
    for t in rounds:
        glob = history.global_model(t)
        for n, upd in history.client_updates(t).items():
            if clients is not None and n not in clients:
                continue
            acc = out.setdefault(n, {k: [] for k in layers})
            for k in layers:
                acc[k].append(float(upd[k].norm()) / max(float(glob[k].norm()), 1e-12))
    return out


def critical_layers(
    ctx: UnlearnContext, num_layers: int, cli_rounds: int, choice: str = "history"
) -> tuple[list[str], dict[str, float], dict[str, Any]]:
    """The ``num_layers`` Conv/Linear weights with the highest scores, all scores, and how.

    ``choice="history"``: ``score_l = mean_n ||Delta_{n,l}|| / ||Theta[t]_l||`` over every
    client update of the last ``cli_rounds`` rounds with stored updates (the same layers for
    every request). ``choice="request"``: the same relative change, but only of the clients
    holding the data to forget (C_u), weighted by their forget share ``|D_u,n| / |D_n|``, over
    the last ``cli_rounds`` rounds in which one of them took part -- the layers the data to
    forget moved most. Falls back to ``history`` when no such update is stored.
    """
    history = ctx.run.history
    layers = sensitivity_layers(ctx.new_model())
    stored = [t for t in history.rounds() if history.has_updates(t)]
    if not stored:
        raise ValueError("fused: the history keeps no client updates to rank layers with")
    how: dict[str, Any] = {"choice": choice}
    score: dict[str, float] | None = None
    if choice == "request":
        targets = set(ctx.request.targets)
        rounds = [t for t in stored if targets.intersection(history.participants(t))]
        rounds = rounds[-max(1, cli_rounds) :]
        per = _relative_changes(ctx, layers, rounds, targets) if rounds else {}
        req = ctx.request
        weights = {
            n: req.forget_share(n, len(req.forget.get(n, ())) + len(req.remaining[n])) for n in per
        }
        total = sum(weights.values())
        if per and total > 0:
            score = {
                k: sum(weights[n] * float(np.mean(per[n][k])) for n in per) / total for k in layers
            }
            how.update(rounds=rounds, clients={int(n): weights[n] for n in sorted(per)})
        else:
            how["fallback"] = "no stored update of a client holding the data to forget"
            log.warning("fused: %s; ranking layers by every client's updates", how["fallback"])
    if score is None:
        rounds = stored[-max(1, cli_rounds) :]
        per = _relative_changes(ctx, layers, rounds, None)
        score = {k: float(np.mean([v for n in per for v in per[n][k]])) for k in layers}
        how.update(rounds=rounds, clients=sorted(int(n) for n in per))
    top = sorted(layers, key=lambda k: -score[k])[: max(1, num_layers)]
    return [k for k in layers if k in top], score, how


class Adapters(nn.Module):
    """Low-rank adapters ``(alpha / r) * B A`` for a set of weight tensors."""

    def __init__(
        self, shapes: Mapping[str, Sequence[int]], rank: int, alpha: float, seed: int
    ) -> None:
        super().__init__()
        self.names = list(shapes)
        self.shapes = {k: tuple(int(s) for s in v) for k, v in shapes.items()}
        self.ranks: dict[str, int] = {}
        self.scale: dict[str, float] = {}
        self.A = nn.ParameterDict()
        self.B = nn.ParameterDict()
        gen = torch.Generator().manual_seed(derive_seed(seed, 81))
        for i, (name, shape) in enumerate(self.shapes.items()):
            fan_out, fan_in = shape[0], int(np.prod(shape[1:]))
            r = max(1, min(rank, fan_out, fan_in))
            a = torch.empty(r, fan_in)
            bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)) as in LoRA
            a.uniform_(-bound, bound, generator=gen)
            self.A[str(i)] = nn.Parameter(a)
            self.B[str(i)] = nn.Parameter(torch.zeros(fan_out, r))
            self.ranks[name] = r
            self.scale[name] = float(alpha) / r

    def delta(self, name: str) -> torch.Tensor:
        """The adapter's weight change for layer ``name`` in the layer's shape."""
        i = str(self.names.index(name))
        return (self.scale[name] * (self.B[i] @ self.A[i])).view(self.shapes[name])

    def tensors(self) -> State:
        """Adapter tensors keyed ``<layer>.lora_A`` / ``<layer>.lora_B`` (what goes on the link)."""
        out: State = {}
        for i, name in enumerate(self.names):
            out[f"{name}.lora_A"] = self.A[str(i)].detach().to("cpu", copy=True)
            out[f"{name}.lora_B"] = self.B[str(i)].detach().to("cpu", copy=True)
        return out

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Set the adapter parameters from :meth:`tensors` output."""
        with torch.no_grad():
            for i, name in enumerate(self.names):
                self.A[str(i)].copy_(tensors[f"{name}.lora_A"])
                self.B[str(i)].copy_(tensors[f"{name}.lora_B"])

    def nbytes(self) -> int:
        """Bytes of the adapter tensors as float32."""
        return sum(p.numel() * 4 for p in self.parameters())


def merge_adapters(base: Mapping[str, torch.Tensor], adapters: Adapters) -> State:
    """``W + delta`` for the adapted layers (a plain state dict any metric can score)."""
    out = {k: v.detach().clone() for k, v in base.items()}
    with torch.no_grad():
        for name in adapters.names:
            out[name] = base[name] + adapters.delta(name).to(base[name].device, base[name].dtype)
    return out


def drop_adapters(merged: Mapping[str, torch.Tensor], adapters: Adapters) -> State:
    """Undo :func:`merge_adapters`: the original model back, up to float rounding."""
    out = {k: v.detach().clone() for k, v in merged.items()}
    with torch.no_grad():
        for name in adapters.names:
            out[name] = merged[name] - adapters.delta(name).to(
                merged[name].device, merged[name].dtype
            )
    return out


def _train_adapters(
    model: nn.Module,
    base: Mapping[str, torch.Tensor],
    adapters: Adapters,
    indices: np.ndarray,
    ctx: UnlearnContext,
    epochs: int,
    lr: float,
    t: int,
    n: int,
    max_grad_norm: float | None,
    clipped: list[int],
) -> State:
    """Local SGD of client n on the adapter parameters only (base frozen).

    ``max_grad_norm`` clips the adapters' gradient norm per step (``None``: no clipping, as the
    reference code); ``clipped`` counts [clipped steps, steps].
    """
    data = ctx.run.setup.train
    fl = ctx.cfg.fl
    opt = torch.optim.SGD(adapters.parameters(), lr=lr, momentum=float(fl.momentum))
    idx_all = torch.as_tensor(indices, dtype=torch.int64)
    dev = next(model.parameters()).device  # fl.device (the model, adapters and base live there)
    frozen = {k: v.detach().to(dev) for k, v in base.items()}
    model.eval()
    torch.manual_seed(derive_seed(ctx.seed, 82, t, n))
    for pos in client_batches(len(indices), epochs, fl.batch_size, ctx.seed, t, n):
        idx = idx_all[torch.as_tensor(pos)]
        params = dict(frozen)
        for name in adapters.names:
            params[name] = frozen[name] + adapters.delta(name)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(
            functional_call(model, params, (data.inputs(idx).to(dev),)), data.labels[idx].to(dev)
        )
        loss.backward()
        if max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(adapters.parameters(), max_grad_norm)
            clipped[0] += int(float(norm) > max_grad_norm)
        clipped[1] += 1
        opt.step()
    return adapters.tensors()


class AdapterTrainer:
    """FUSED's local training as a :class:`~scaleflu.fl.fedavg.LocalTrainer`: each client
    trains the adapters from the round's global adapters on its remaining data."""

    def __init__(
        self,
        model: nn.Module,
        base: Mapping[str, torch.Tensor],
        adapters: Adapters,
        parts: Sequence[np.ndarray],
        ctx: UnlearnContext,
        epochs: int,
        lr: float,
        max_grad_norm: float | None = None,
    ) -> None:
        self.model, self.base, self.adapters, self.parts = model, base, adapters, parts
        self.ctx, self.epochs, self.lr = ctx, epochs, lr
        self.max_grad_norm = max_grad_norm
        self.clipped = [0, 0]  # [steps whose gradient norm was clipped, steps], every round

    def train(
        self, global_state: Mapping[str, torch.Tensor], clients: Sequence[int], t: int
    ) -> dict[int, State]:
        """Each client's adapters after its local epochs of round ``t``."""
        out = {}
        for n in clients:
            self.adapters.load_tensors(global_state)
            out[n] = _train_adapters(
                self.model, self.base, self.adapters, self.parts[n], self.ctx, self.epochs,
                self.lr, t, n, self.max_grad_norm, self.clipped,
            )  # fmt: skip
        return out


class FusedUnlearner:
    """FUSED: critical layers, frozen base, FedAvg-trained sparse low-rank adapters."""

    name = "fused"

    def __init__(self, **overrides: Any) -> None:
        """Keyword overrides of ``baselines.fused`` (rank, num_layers, rounds, ...)."""
        self.overrides = overrides

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Pick layers, train adapters with the remaining clients, measure the merged model."""
        hp = baseline_config("fused", self.overrides, ctx.cfg)
        fl = ctx.cfg.fl
        t0 = time.perf_counter()
        layers, scores, how = critical_layers(
            ctx, int(hp.num_layers), int(hp.cli_rounds), str(hp.layer_choice)
        )
        log.info("FUSED critical layers: %s", layers)
        base = ctx.original_state()
        adapters = Adapters(
            {k: tuple(base[k].shape) for k in layers},
            int(hp.rank),
            float(hp.alpha if hp.alpha is not None else hp.rank),
            ctx.seed,
        )
        epochs = int(hp.local_epochs if hp.local_epochs is not None else fl.local_epochs)
        lr = float(hp.lr if hp.lr is not None else fl.lr)
        clip = None if hp.max_grad_norm is None else float(hp.max_grad_norm)
        parts = ctx.request.remaining
        dev = ctx.device  # fl.device: adapters train there; merged states stay on the CPU
        adapters.to(dev)
        model = ctx.new_model(base).to(dev)
        for p in model.parameters():
            p.requires_grad_(False)
        aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
        T = ctx.run.history.last_completed_round()
        nb = adapters.nbytes()
        nbytes, link_s, rounds_done, trace = 0, 0.0, 0, []
        cur_adapter = adapters.tensors()
        merged_prev = base
        n_rounds = int(hp.rounds if hp.rounds is not None else fl.rounds)
        strategy = ctx.strategy(recalibrate=False)  # the adapters hold no BatchNorm statistics
        trainer = AdapterTrainer(model, base, adapters, parts, ctx, epochs, lr, clip)
        for r in tqdm(
            range(1, n_rounds + 1),
            desc="FUSED",
            unit="round",
            disable=not ctx.progress,
            leave=False,
        ):
            result = strategy.fit_round(T + r, cur_adapter, trainer)
            if result is None:  # every selected client left the federation
                continue
            cur_adapter = result.state
            adapters.load_tensors(cur_adapter)
            b, s = round_link(ctx, nb, nb, len(result.clients))
            nbytes += b
            link_s += s
            merged = merge_adapters(base, adapters)
            aoi.full_round(s, changed_groups(merged_prev, merged, ctx.groups, ctx.link_tol))
            trace.append(float(aoi.total()["aoi_s"]))
            merged_prev = merged
            rounds_done += 1
        adapters.load_tensors(cur_adapter)
        final = merge_adapters(base, adapters)
        n_clip, n_steps = trainer.clipped
        if clip is not None and n_clip > 0.1 * max(n_steps, 1):
            log.warning(
                "FUSED clipped the adapters' gradient norm (max_grad_norm %g) on %d of %d steps: "
                "its lr %g is likely too large for the adapters (baselines.fused.lr)",
                clip, n_clip, n_steps, lr,
            )  # fmt: skip
        wall = time.perf_counter() - t0
        self.state = final
        self.base_state = base
        self.adapters = adapters
        n_adapter = sum(p.numel() for p in adapters.parameters())
        n_model = sum(v.numel() for v in base.values() if torch.is_floating_point(v))
        res = ctx.make_result(
            "fused",
            final,
            wall_s=wall,
            bytes_=nbytes,
            link_s=link_s,
            fl_rounds=rounds_done,
            aoi=aoi,
            top_layers=None,
            sum_aoi_trace=trace,
            details={
                "critical_layers": layers,
                "layer_scores": scores,
                "layer_choice": how,
                "ranks": adapters.ranks,
                "adapter_params": n_adapter,
                "adapter_share": n_adapter / max(n_model, 1),
                "adapter_bytes": nb,
                "rounds": rounds_done,
                "local_epochs": epochs,
                "lr": lr,
                "max_grad_norm": clip,
                "clipped_steps": n_clip,
                "steps": n_steps,
                "reversible": "drop the adapters: base model unchanged",
                "hyper_parameters": hp,
            },
        )
        return annotate(res, aoi)
