"""Phase I of SCALE: per-layer sensitivity to the target (alignment, KL impact, top-M).

For every sensitivity layer l (Conv/Linear weights, :func:`scaleflu.fl.models.sensitivity_layers`):

* alignment ``S^a = -1/2 log(1 - rho^2)`` with rho the Pearson correlation of the target's
  layer and the global layer; rho^2 is clipped to ``1 - 1e-12`` so identical layers give a
  large finite score;
* impact ``S^d = KL(P || Q)`` with ``P_i = (|w_i| + eps) / sum(|w| + eps)`` from W_l and Q from
  the global layer without the target, W_{l,-n};
* combined ``S = lambda S^a + (1 - lambda) S^d`` and the top-M layers.

Two input semantics (docs/scale.md, "Phase I: sensitive layers"):

* ``paper``: raw weights. W_{l,n} is the target's last local model Theta_{n,E}[t_n] (t_n its last
  round), W_l the aggregate of that round Theta[t_n + 1], and W_{l,-n} the weighted mean of the
  round's other local models, ``(sum_j M_j W_l - M_n W_{l,n}) / (sum_j M_j - M_n)``. Raw scores
  are mixed; several targets average their scores.
* ``default``: historical updates. U_l = sum over the target's rounds of its update
  ``Theta_{n,E}[t] - Theta[t]`` (times its forget share |D_u,n|/|D_n| for class and sample
  requests), correlated with the global updates ``Theta[t+1] - Theta[t]`` summed over the same
  rounds. The contribution of the target to the final model is
  ``C_l = sum_t M_n / sum_{C[t]} M_j * share_n * update_{n,t}``; W_l is the final model and
  W_{l,-n} = W_l - C_l. Each score is divided by its maximum over layers before mixing.

``C_l`` is also the attribution map the default Sparsify uses, except for a class
removed from the whole federation, where :func:`class_saliency` on the server's validation set
replaces it (every client holds the class, so C_l is not class-specific).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from scaleflu.config import ConfigError
from scaleflu.fl.history import HistoryStore
from scaleflu.fl.models import sensitivity_layers

if TYPE_CHECKING:
    from scaleflu.unlearn.base import UnlearnContext

log = logging.getLogger(__name__)

RHO2_MAX = 1.0 - 1e-12
DEFAULT_EPS = 1e-8

Layers = dict[str, torch.Tensor]


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two flattened tensors (0 when either is constant)."""
    x = a.detach().flatten().double()
    y = b.detach().flatten().double()
    if x.numel() != y.numel():
        raise ValueError(f"correlation of tensors of {x.numel()} and {y.numel()} elements")
    if x.numel() < 2:
        return 0.0
    x = x - x.mean()
    y = y - y.mean()
    den = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    if den == 0.0:
        return 0.0
    return max(-1.0, min(1.0, float((x * y).sum()) / den))


def alignment_score(rho: float) -> float:
    """S^a = -1/2 log(1 - rho^2), rho^2 clipped below 1."""
    r2 = min(rho * rho, RHO2_MAX)
    return -0.5 * math.log1p(-r2)


def weight_distribution(w: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """P_i = (|w_i| + eps) / sum_k (|w_k| + eps) over a flattened layer (float64)."""
    a = w.detach().flatten().double().abs() + eps
    return a / a.sum()


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(P || Q) = sum_i P_i log(P_i / Q_i) of two strictly positive distributions."""
    return max(0.0, float((p * (p.log() - q.log())).sum()))


def impact_score(w: torch.Tensor, w_without: torch.Tensor, eps: float = DEFAULT_EPS) -> float:
    """S^d: KL between the normalised magnitudes of W_l and of W_{l,-n}."""
    return kl_divergence(weight_distribution(w, eps), weight_distribution(w_without, eps))


@dataclass
class SensitivityReport:
    """Per-layer scores, the top-M layers, and (default mode) the attribution map C_l."""

    mode: str
    layers: list[str]
    rho: dict[str, float]
    alignment: dict[str, float]
    impact: dict[str, float]
    score: dict[str, float]
    top: list[str]
    lam: float
    eps: float
    rounds: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    attribution: Layers = field(default_factory=dict, repr=False)
    # default mode: the target's accumulated contribution C_l (``attribution`` may be replaced
    # by a class saliency for class requests; ``subtract`` always removes C_l)
    contribution: Layers = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready per-layer table and the selection."""
        return {
            "mode": self.mode,
            "lambda": self.lam,
            "eps": self.eps,
            "rounds": self.rounds,
            "top": self.top,
            "notes": self.notes,
            "layers": [
                {
                    "layer": name,
                    "rho": self.rho[name],
                    "alignment": self.alignment[name],
                    "impact": self.impact[name],
                    "score": self.score[name],
                    "selected": name in self.top,
                }
                for name in self.layers
            ],
        }

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_json` to ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2))
        return path


def combine_scores(
    layers: Sequence[str],
    alignment: Mapping[str, float],
    impact: Mapping[str, float],
    lam: float,
    normalise: bool,
) -> dict[str, float]:
    """S = lambda S^a + (1 - lambda) S^d, each term divided by its layer maximum if asked."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    a = {n: float(alignment[n]) for n in layers}
    d = {n: float(impact[n]) for n in layers}
    if normalise:
        ma, md = max(a.values(), default=0.0), max(d.values(), default=0.0)
        a = {n: v / ma if ma > 0 else 0.0 for n, v in a.items()}
        d = {n: v / md if md > 0 else 0.0 for n, v in d.items()}
    return {n: lam * a[n] + (1.0 - lam) * d[n] for n in layers}


def top_layers(score: Mapping[str, float], layers: Sequence[str], m: int) -> list[str]:
    """The top-M layers by score (ties keep forward order)."""
    if m < 1:
        raise ValueError(f"top_m must be >= 1, got {m}")
    order = sorted(range(len(layers)), key=lambda i: (-score[layers[i]], i))
    return [layers[i] for i in order[: min(m, len(layers))]]


def layer_scores(
    layers: Sequence[str],
    target: Mapping[str, torch.Tensor],
    reference: Mapping[str, torch.Tensor],
    global_layers: Mapping[str, torch.Tensor],
    without: Mapping[str, torch.Tensor],
    eps: float = DEFAULT_EPS,
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(rho, S^a, S^d) per layer: Corr(target, reference) and KL(P(global) || P(without))."""
    rho, sa, sd = {}, {}, {}
    for name in layers:
        rho[name] = pearson(target[name], reference[name])
        sa[name] = alignment_score(rho[name])
        sd[name] = impact_score(global_layers[name], without[name], eps)
    return rho, sa, sd


def paper_sensitivity(
    history: HistoryStore,
    targets: Sequence[int],
    layers: Sequence[str],
    lam: float,
    top_m: int,
    eps: float = DEFAULT_EPS,
) -> SensitivityReport:
    """Literal Phase I on raw weights of each target's last local model (scores averaged)."""
    per: list[tuple[dict[str, float], dict[str, float], dict[str, float]]] = []
    rounds, notes = [], []
    for n in targets:
        kept = [t for t in history.client_rounds(n) if history.has_updates(t)]
        if not kept:
            notes.append(f"client {n} has no stored local model; left out of Phase I")
            continue
        t = kept[-1]
        rounds.append(t)
        sizes = history.data_sizes(t)
        total = float(sum(sizes.values()))
        glob = history.global_model(t + 1)
        local = history.client_model(t, n)
        g = {k: glob[k] for k in layers}
        w_n = {k: local[k] for k in layers}
        if total - sizes[n] <= 0:
            notes.append(f"client {n} was alone in round {t}: W_(l,-n) taken as Theta[t]")
            start = history.global_model(t)
            wo = {k: start[k] for k in layers}
        else:
            wo = {k: (total * g[k] - sizes[n] * w_n[k]) / (total - sizes[n]) for k in layers}
        per.append(layer_scores(layers, w_n, g, g, wo, eps))
    if not per:
        notes.append("no target has a stored local model: all scores are zero")
        zero = {k: 0.0 for k in layers}
        per = [(zero, zero, zero)]
    rho = {k: sum(p[0][k] for p in per) / len(per) for k in layers}
    sa = {k: sum(p[1][k] for p in per) / len(per) for k in layers}
    sd = {k: sum(p[2][k] for p in per) / len(per) for k in layers}
    score = combine_scores(layers, sa, sd, lam, normalise=False)
    top = top_layers(score, layers, top_m)
    return SensitivityReport(
        "paper", list(layers), rho, sa, sd, score, top, lam, eps, rounds, notes
    )


def target_contribution(
    history: HistoryStore,
    shares: Mapping[int, float],
    layers: Sequence[str],
) -> tuple[Layers, Layers, Layers, list[int], list[str]]:
    """Accumulated target updates U, global updates G and contribution C over stored rounds.

    ``shares`` maps each target client to the share of its updates attributed to the forget
    set (1 for client requests). Returns (U, G, C, rounds used, notes).
    """
    U = {k: None for k in layers}
    G = {k: None for k in layers}
    C = {k: None for k in layers}
    used, notes = [], []
    dropped = 0
    for t in history.rounds():
        part = history.participants(t)
        hit = [n for n in shares if n in part and shares[n] > 0]
        if not hit:
            continue
        if not history.has_updates(t):
            dropped += 1
            continue
        sizes = history.data_sizes(t)
        total = float(sum(sizes.values()))
        start, end = history.global_model(t), history.global_model(t + 1)
        for n in hit:
            upd = history.client_update(t, n)
            w = float(shares[n])
            for k in layers:
                u = upd[k] * w
                c = u * (sizes[n] / total)
                U[k] = u if U[k] is None else U[k] + u
                C[k] = c if C[k] is None else C[k] + c
        for k in layers:
            g = end[k] - start[k]
            G[k] = g if G[k] is None else G[k] + g
        used.append(t)
    if dropped:
        notes.append(f"{dropped} target rounds had their updates dropped (history.keep_rounds)")
    if not used:
        notes.append("the targets took part in no stored round: contribution is zero")
        final = history.final_model()
        for k in layers:
            U[k] = torch.zeros_like(final[k])
            G[k] = torch.zeros_like(final[k])
            C[k] = torch.zeros_like(final[k])
    return U, G, C, used, notes  # type: ignore[return-value]


def historical_sensitivity(
    history: HistoryStore,
    shares: Mapping[int, float],
    layers: Sequence[str],
    lam: float,
    top_m: int,
    eps: float = DEFAULT_EPS,
) -> SensitivityReport:
    """Default Phase I on accumulated historical updates, scores normalised across layers."""
    U, G, C, used, notes = target_contribution(history, shares, layers)
    final = history.final_model()
    W = {k: final[k] for k in layers}
    W_without = {k: final[k] - C[k] for k in layers}
    rho, sa, sd = layer_scores(layers, U, G, W, W_without, eps)
    score = combine_scores(layers, sa, sd, lam, normalise=True)
    top = top_layers(score, layers, top_m)
    rep = SensitivityReport(
        "default", list(layers), rho, sa, sd, score, top, lam, eps, used, notes, attribution=C
    )
    return rep


def class_saliency(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    classes: Sequence[int],
    layers: Sequence[str],
    contrast: float = 1.0,
) -> tuple[Layers, dict[str, Any]]:
    """Class-specific attribution ``relu(s_c / sum s_c - contrast * s_r / sum s_r)`` per weight.

    ``s_c = mean_i |w * dL_i/dw|`` over the samples of the forgotten ``classes`` (per-sample
    gradients of the cross-entropy, so opposite gradients of different samples do not cancel)
    and ``s_r`` the same over the other samples; each sum runs over all ``layers``. The result
    is large where a weight matters for the forgotten classes and little for the rest (the
    attribution of a class request, computed on the server's validation set). Returns the map
    and counts for the report.
    """
    mask = torch.zeros(len(labels), dtype=torch.bool, device=labels.device)
    for c in classes:
        mask |= labels == int(c)
    # the same per-weight saliency as the forget set's (vectorised per-sample gradients)
    out, _ = forget_saliency(
        model, inputs[mask], labels[mask], inputs[~mask], labels[~mask], layers, contrast
    )
    n_f, n_r = int(mask.sum()), int((~mask).sum())
    info = {"forget_val_samples": n_f, "rest_val_samples": n_r, "contrast": contrast}
    return out, info


def contrastive_contribution(
    history: HistoryStore,
    shares: Mapping[int, float],
    layers: Sequence[str],
    rounds: Sequence[int],
    contrast: float = 1.0,
) -> tuple[Layers, dict[str, Any]]:
    """Target-specific attribution ``relu(a_u / sum a_u - contrast * a_o / sum a_o)`` per weight.

    ``a_u = sum_t share_n |u_{n,t}|`` over the target clients' updates in the ``rounds`` they took
    part in, ``a_o = sum_t mean_m |u_{m,t}|`` over the other participants of the same rounds
    (magnitudes per update, so opposite moves do not cancel); each sum in the normaliser runs
    over all ``layers``. Large where the targets moved a weight much more than everyone else
    did: what their data taught that the others' did not (a backdoor trigger, a client's own
    mislabelled samples), not the task all clients learn together. The client-request analogue
    of :func:`class_saliency`.
    """
    a_u = {k: None for k in layers}
    a_o = {k: None for k in layers}
    n_other = 0
    for t in rounds:
        part = history.participants(t)
        hit = [n for n in shares if n in part and shares[n] > 0]
        others = [m for m in part if m not in shares]
        if not hit or not history.has_updates(t):
            continue
        ups = history.client_updates(t)
        for k in layers:
            u = sum(ups[n][k].abs().double() * float(shares[n]) for n in hit)
            a_u[k] = u if a_u[k] is None else a_u[k] + u
            if others:
                o = sum(ups[m][k].abs().double() for m in others) / len(others)
                a_o[k] = o if a_o[k] is None else a_o[k] + o
        n_other += len(others)
    final = history.final_model()
    for k in layers:
        if a_u[k] is None:
            a_u[k] = torch.zeros_like(final[k], dtype=torch.float64)
        if a_o[k] is None:
            a_o[k] = torch.zeros_like(final[k], dtype=torch.float64)
    tot_u = sum(float(v.sum()) for v in a_u.values()) or 1.0
    tot_o = sum(float(v.sum()) for v in a_o.values()) or 1.0
    out: Layers = {
        k: (a_u[k] / tot_u - contrast * a_o[k] / tot_o).clamp_min(0.0).to(final[k].dtype)
        for k in layers
    }
    return out, {"other_updates": n_other, "contrast": contrast}


def forget_saliency(
    model: torch.nn.Module,
    forget_x: torch.Tensor,
    forget_y: torch.Tensor,
    rest_x: torch.Tensor,
    rest_y: torch.Tensor,
    layers: Sequence[str],
    contrast: float = 1.0,
    chunk: int = 128,
    stat: str = "loss",
) -> tuple[Layers, dict[str, Any]]:
    """The forget set's own saliency, contrasted with the retained data's, per weight.

    ``stat``: what the gradient is of -- ``loss`` (the cross-entropy ``L_i``) or ``margin``
    (the label's logit margin ``phi_i = z_y - logsumexp_{j != y} z_j``, the statistic a
    membership attack reads): a memorised sample has almost no loss and hence almost no loss
    gradient, while its margin's gradient does not vanish.

    ``s_u = mean_i |w * dL_i/dw|`` over the forget samples **as the requesting client holds
    them** (a triggered image with the target label, a flipped label), ``s_r`` the same over
    retained samples (the server's validation set); each divided by its sum over ``layers``;
    the map is ``relu(s_u - contrast * s_r)``: weights that the forgotten samples lean on and
    the rest of the task does not (a backdoor trigger's path, a memorised sample's). A sample or
    ``class:c@n`` request comes from the client that holds D_u, so it computes ``s_u`` on its
    own data and sends one tensor the size of the sensitivity layers; the server computes
    ``s_r``. Per-sample gradients come in chunks of ``chunk`` from one backward pass
    (:func:`_per_sample_weight_grads`: the layers' inputs and output gradients, for Conv2d and
    Linear layers), else from ``torch.func`` (vectorised, but its first call imports
    ``torch._dynamo``: about a second of a short process).
    """
    params = {k: v.detach() for k, v in model.named_parameters()}
    was = model.training
    model.eval()

    if stat not in ("loss", "margin"):
        raise ValueError(f"saliency statistic must be loss or margin, got {stat!r}")

    def statistic(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per sample: the cross-entropy, or the label's logit margin."""
        if stat == "margin":
            hot = (torch.arange(out.shape[-1], device=out.device) == y.unsqueeze(-1)).to(out.dtype)
            return (out * hot).sum(-1) - torch.logsumexp(out - 1e9 * hot, dim=-1)
        return torch.nn.functional.cross_entropy(out, y, reduction="none")

    hooked = hookable_layers(model, layers)
    per_sample = (
        (lambda x, y: _per_sample_weight_grads(model, hooked, statistic, x, y))
        if hooked is not None
        else _torch_func_grads(model, params, layers, statistic)
    )

    def mean_saliency(x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        acc = {k: torch.zeros_like(params[k], dtype=torch.float64) for k in layers}
        for i in range(0, len(y), chunk):
            g = per_sample(x[i : i + chunk], y[i : i + chunk])
            for k in layers:
                acc[k] += (params[k].unsqueeze(0) * g[k]).abs().sum(0).double()
        return {k: v / max(len(y), 1) for k, v in acc.items()}

    s_u = mean_saliency(forget_x, forget_y)
    s_r = mean_saliency(rest_x, rest_y) if len(rest_y) else None
    model.train(was)
    tot_u = sum(float(v.sum()) for v in s_u.values()) or 1.0
    tot_r = sum(float(v.sum()) for v in s_r.values()) or 1.0 if s_r is not None else 1.0
    out: Layers = {}
    for k in layers:
        a = s_u[k] / tot_u
        b = s_r[k] / tot_r if s_r is not None else torch.zeros_like(a)
        out[k] = (a - contrast * b).clamp_min(0.0).to("cpu", params[k].dtype)
    info = {"forget_samples": int(len(forget_y)), "rest_samples": int(len(rest_y))}
    info["contrast"] = contrast
    info["stat"] = stat
    return out, info


def hookable_layers(
    model: torch.nn.Module, layers: Sequence[str]
) -> dict[str, tuple[torch.nn.Module, str]] | None:
    """Each layer's module and parameter name when every layer is the weight or bias of a
    ``Linear`` or zero-padded numeric-padding ``Conv2d`` that requires a gradient; else None."""
    modules = dict(model.named_modules())
    out: dict[str, tuple[torch.nn.Module, str]] = {}
    for name in layers:
        owner, _, attr = name.rpartition(".")
        mod = modules.get(owner)
        if attr not in ("weight", "bias") or getattr(mod, attr, None) is None:
            return None
        if not getattr(mod, attr).requires_grad:
            return None
        if isinstance(mod, torch.nn.Conv2d):
            if mod.padding_mode != "zeros" or isinstance(mod.padding, str):
                return None
        elif not isinstance(mod, torch.nn.Linear):
            return None
        out[name] = (mod, attr)
    return out


def _per_sample_weight_grads(
    model: torch.nn.Module,
    hooked: Mapping[str, tuple[torch.nn.Module, str]],
    statistic: Any,
    x: torch.Tensor,
    y: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Per-sample gradients of ``statistic(model(x), y)`` (one value per sample) for Linear and
    Conv2d weights and biases, from one backward pass.

    In eval mode the samples of a batch do not interact, so the gradient of the summed statistic
    with respect to a layer's output holds each sample's own output gradient; a layer's per-sample
    weight gradient is then its output gradient times its input (unfolded for a convolution,
    grouped convolutions group by group), summed over the calls of a module used more than once.
    """
    mods = {id(m): m for m, _ in hooked.values()}
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {i: [] for i in mods}

    def keep(mod: torch.nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        seen[id(mod)].append((inp[0].detach(), out))

    handles = [m.register_forward_hook(keep) for m in mods.values()]
    try:
        with torch.enable_grad():
            total = statistic(model(x), y).sum()
            calls = [(i, a, o) for i, lst in seen.items() for a, o in lst]
            grads = torch.autograd.grad(total, [o for _, _, o in calls], allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    per_mod: dict[int, dict[str, torch.Tensor]] = {}
    for (i, a, o), g in zip(calls, grads, strict=True):
        if g is None:
            g = torch.zeros_like(o)
        mod = mods[i]
        if isinstance(mod, torch.nn.Conv2d):
            w, b = _conv2d_sample_grads(mod, a, g)
        else:
            g3 = g.reshape(g.shape[0], -1, g.shape[-1])
            a3 = a.reshape(a.shape[0], -1, a.shape[-1])
            w, b = torch.einsum("bno,bni->boi", g3, a3), g3.sum(1)
        acc = per_mod.setdefault(i, {})
        acc["weight"] = acc["weight"] + w if "weight" in acc else w
        acc["bias"] = acc["bias"] + b if "bias" in acc else b
    out = {}
    for name, (mod, attr) in hooked.items():
        got = per_mod.get(id(mod))
        p = getattr(mod, attr)
        out[name] = (
            got[attr].reshape(-1, *p.shape).to(p.dtype)
            if got is not None
            else torch.zeros((len(y), *p.shape), dtype=p.dtype, device=p.device)
        )
    return out


def _conv2d_sample_grads(
    mod: torch.nn.Conv2d, a: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Conv2d's per-sample weight and bias gradients from its input ``a`` and output gradient
    ``g``: the unfolded input's patches times the output gradient, group by group."""
    bsz, groups = a.shape[0], mod.groups
    cols = torch.nn.functional.unfold(
        a, mod.kernel_size, dilation=mod.dilation, padding=mod.padding, stride=mod.stride
    )  # (B, C_in * kh * kw, L)
    cols = cols.reshape(bsz, groups, -1, cols.shape[-1])
    go = g.reshape(bsz, groups, g.shape[1] // groups, -1)  # (B, G, C_out / G, L)
    w = torch.einsum("bgol,bgil->bgoi", go, cols).reshape(bsz, *mod.weight.shape)
    return w, g.sum((2, 3))


def _torch_func_grads(
    model: torch.nn.Module,
    params: Mapping[str, torch.Tensor],
    layers: Sequence[str],
    statistic: Any,
) -> Any:
    """Per-sample gradients of the layers by ``torch.func`` (any module)."""
    from torch.func import functional_call, grad, vmap

    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, ({**params, **p}, buffers), (x.unsqueeze(0),))
        return statistic(out, y.unsqueeze(0))[0]

    sub = {k: params[k] for k in layers}
    batched = vmap(grad(one), in_dims=(None, 0, 0))
    return lambda x, y: batched(sub, x, y)


# ----------------------------------------------------------------------------- a request's Phase I


def phase_one(
    ctx: UnlearnContext, mode: str, timing: dict[str, float] | None = None
) -> SensitivityReport:
    """Sensitive-layer identification for the request's targets in the given mode.

    ``timing`` (optional) receives the seconds of the parts: ``history_s`` (scores and C_l
    from the stored updates), ``saliency_s`` (class saliency), ``contrast_s`` (contrast).
    """
    timing = {} if timing is None else timing
    sc = ctx.scale_cfg
    th = time.perf_counter()
    layers = [k for k in sensitivity_layers(ctx.new_model()) if k in ctx.groups]
    lam, top_m, eps = float(sc["lambda"]), int(sc.top_m), float(sc.eps)
    history = ctx.run.history
    if mode == "paper":
        return paper_sensitivity(history, ctx.request.targets, layers, lam, top_m, eps)
    req = ctx.request.request
    if req.kind == "client" and sc.top_m_client is not None:
        top_m = int(sc.top_m_client)
    if top_m < 1:
        raise ConfigError(f"scale.top_m (and top_m_client) must be at least 1, got {top_m}")
    sizes = ctx.run.setup.data_sizes
    shares = {n: ctx.request.forget_share(n, sizes[n]) for n in ctx.request.targets}
    report = historical_sensitivity(history, shares, layers, lam, top_m, eps)
    report.contribution = dict(report.attribution)
    timing["history_s"] = time.perf_counter() - th
    attribution = str(sc.class_attribution)
    if attribution not in ("saliency", "contribution"):
        raise ConfigError(
            f"scale.class_attribution must be saliency or contribution, got {attribution!r}"
        )
    if req.whole_class and attribution == "saliency":
        # a class removed from the whole federation: every client holds it, so the clients'
        # contribution C_l is nearly the whole model and not class-specific. Sparsify by a
        # class-specific saliency on the server's validation set instead.
        ts = time.perf_counter()
        model = ctx.new_model(ctx.original_state()).to(ctx.device)  # fl.device
        sal, info = class_saliency(
            model,
            ctx.val.inputs().to(ctx.device),
            ctx.val.labels.to(ctx.device),
            list(req.classes),
            layers,
            float(sc.class_saliency_contrast),
        )
        timing["saliency_s"] = time.perf_counter() - ts
        if info["forget_val_samples"] == 0:
            report.notes.append(
                "class request: the validation set holds no sample of the class(es); "
                "Sparsify keeps the contribution attribution"
            )
        else:
            report.attribution = sal
            report.notes.append(
                "class request over the whole federation: Sparsify ranks parameters by class "
                f"saliency on the validation set ({info['forget_val_samples']} samples of the "
                f"class(es), {info['rest_val_samples']} others, contrast {info['contrast']})"
            )
            if str(sc.class_layers) == "saliency":
                # every client holds the class, so the per-client history scores S_l do not
                # point at it either: take the M layers where the saliency is densest
                density = {k: float(sal[k].sum()) / max(sal[k].numel(), 1) for k in layers}
                if any(v > 0 for v in density.values()):
                    report.top = top_layers(density, layers, top_m)
                    report.notes.append(
                        "class request over the whole federation: top-M layers by class "
                        "saliency per parameter ("
                        + ", ".join(f"{k} {density[k]:.3g}" for k in report.top)
                        + "), not by S_l"
                    )
    client_attr = str(sc.client_attribution)
    if client_attr not in ("contrast", "contribution", "saliency"):
        raise ConfigError(
            "scale.client_attribution must be contrast, contribution or saliency, "
            f"got {client_attr!r}"
        )
    sample_attr = str(sc.sample_attribution)
    if sample_attr not in ("contrast", "contribution", "saliency"):
        raise ConfigError(
            "scale.sample_attribution must be contrast, contribution or saliency, "
            f"got {sample_attr!r}"
        )
    local_class = req.kind == "class" and bool(req.clients)
    chosen = client_attr if req.kind == "client" else sample_attr
    if req.kind in ("client", "sample") or local_class:
        if chosen == "saliency":
            _forget_saliency(ctx, report, layers, top_m, timing)
            return report
    contrast = (req.kind == "client" and client_attr == "contrast") or (
        req.kind == "sample" and sample_attr == "contrast"
    )
    if contrast and report.rounds:
        # the targets' contribution C_l holds the task every client learns as well; rank the
        # entries by how much more the targets moved them than the other participants did
        tc = time.perf_counter()
        attr, info = contrastive_contribution(
            history, shares, layers, report.rounds, float(sc.client_contrast)
        )
        timing["contrast_s"] = time.perf_counter() - tc
        if any(float(v.sum()) > 0 for v in attr.values()):
            report.attribution = attr
            report.notes.append(
                "Sparsify ranks parameters by the targets' updates contrasted with the other "
                f"participants' ({info['other_updates']} updates, contrast {info['contrast']})"
            )
    return report


def _forget_saliency(
    ctx: UnlearnContext,
    report: SensitivityReport,
    layers: list[str],
    top_m: int,
    timing: dict[str, float],
) -> None:
    """Sparsify (and, by default, the top-M layers) by the forget set's own saliency.

    The requesting client holds D_u: it computes ``|w * dL/dw|`` on (at most
    ``scale.forget_saliency_samples`` of) its forget samples at Theta and sends that one
    tensor; the server contrasts it with the same saliency on its retained validation set
    (:func:`~scaleflu.unlearn.sensitivity.forget_saliency`). Both parts are timed as Phase I.
    """
    sc = ctx.scale_cfg
    ts = time.perf_counter()
    n = sc.forget_saliency_samples
    data = ctx.forget
    if n is not None:
        if int(n) < 1:
            raise ConfigError(f"scale.forget_saliency_samples must be positive, got {n}")
        if int(n) < len(data):
            rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, 46]))
            data = data.subset(np.sort(rng.choice(len(data), size=int(n), replace=False)))
    model = ctx.new_model(ctx.original_state()).to(ctx.device)
    sal, info = forget_saliency(
        model,
        data.inputs().to(ctx.device),
        data.labels.to(ctx.device),
        ctx.val_retain.inputs().to(ctx.device),
        ctx.val_retain.labels.to(ctx.device),
        layers,
        float(sc.forget_saliency_contrast),
        stat=str(sc.forget_saliency_stat),
    )
    timing["saliency_s"] = time.perf_counter() - ts
    if not any(float(v.sum()) > 0 for v in sal.values()):
        report.notes.append("forget-set saliency is zero everywhere; Sparsify keeps C_l")
        return
    report.attribution = sal
    report.notes.append(
        f"Sparsify ranks parameters by the forget set's own saliency ({info['stat']}), "
        f"computed by the client holding it ({info['forget_samples']} samples), contrasted "
        f"with the retained validation set's ({info['rest_samples']} samples, "
        f"contrast {info['contrast']})"
    )
    layer_rule = str(sc.forget_layers)
    if layer_rule not in ("saliency", "score"):
        raise ConfigError(f"scale.forget_layers must be saliency or score, got {layer_rule!r}")
    if layer_rule == "saliency":
        density = {k: float(sal[k].sum()) / max(sal[k].numel(), 1) for k in layers}
        report.top = top_layers(density, layers, top_m)
        report.notes.append(
            "top-M layers by forget-set saliency per parameter ("
            + ", ".join(f"{k} {density[k]:.3g}" for k in report.top)
            + "), not by S_l"
        )
