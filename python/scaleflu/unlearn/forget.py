"""SCALE's calibrated forgetting step: D_u's remaining margins moved onto never-seen data's.

After the cut and the healing, the forgotten samples whose held label the model no longer
predicts (a triggered image, a flipped or a memorised mislabelled sample) still get a higher
margin for that label than a model that never saw them would give: that residue is what a
per-example membership attack reads (docs/scale.md, "Forgetting membership"). This step removes
it without any model trained without D_u:

1. The server measures, on its retained validation images, the margin
   ``phi(x, y') = z_y' - logsumexp_{j != y'} z_j`` the current model gives to every *wrong*
   label ``y'`` of every image -- the margins of never-seen samples whose label is not the
   image's class -- and sends their quantiles (``scale.forget_quantiles`` of them).
2. The client holding D_u takes the samples whose held label the model does not predict
   (``argmax != y``; one per distinct sample: a canary's copies count once), ranks their margins
   and gives the sample of rank r the reference quantile at (r + 0.5) / n as its target: the
   ranks stay, the distribution becomes the never-seen one.
3. It runs at most ``scale.forget_epochs`` epochs of SGD (the run's batch size and momentum,
   ``scale.forget_lr``, null: ``fl.lr``) on ``mean relu(phi_i - t_i)``: a margin above its
   target comes down, none is pushed up (with ``scale.forget_anchor_weight`` > 0, plus that
   weight times the cross-entropy of a batch of the server's healing images, sent with the
   model). After each epoch the server checks its selection
   accuracy; an epoch that lowers it by more than ``scale.forget_val_tol`` is undone and the
   step stops there (the bound).

Samples the model still predicts with their held label are left alone (they cannot be told
from correctly learned ones without the data's true labels). The client's compute counts in
SCALE's CPU time; one model goes down and one comes back over the link.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.unlearn.audit import example_units
from scaleflu.unlearn.base import UnlearnContext


def wrong_label_margins(model: torch.nn.Module, data: ImageData, batch: int = 500) -> np.ndarray:
    """``phi(x, y')`` for every image of ``data`` and every label ``y'`` but its own (eval mode)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(data), batch):
            z = model(data.inputs(slice(i, i + batch)).to(dev)).double()
            y = data.labels[i : i + batch].to(dev)
            C = z.shape[1]
            for c in range(C):
                keep = y != c
                if not bool(keep.any()):
                    continue
                zc = z[keep]
                rest = zc.clone()
                rest[:, c] = float("-inf")
                out.append((zc[:, c] - torch.logsumexp(rest, dim=1)).cpu())
    model.train(was)
    return torch.cat(out).numpy() if out else np.zeros(0)


def _margins(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    hot = torch.nn.functional.one_hot(y, logits.shape[1]).bool()
    zy = logits.gather(1, y.view(-1, 1)).flatten()
    return zy - torch.logsumexp(logits.masked_fill(hot, float("-inf")), dim=1)


def calibrated_forget(
    ctx: UnlearnContext,
    state: Mapping[str, torch.Tensor],
    select: ImageData,
    anchor: ImageData | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The step of the module docstring on ``state``; returns the new state and a summary.

    ``anchor``: the server's healing images (labelled), whose cross-entropy, weighted by
    ``scale.forget_anchor_weight``, is added to every step's loss (0 or None: no anchor).
    """
    sc = ctx.scale_cfg
    epochs = int(sc.forget_epochs or 0)
    tol = float(sc.forget_val_tol)
    if tol < 0:
        raise ConfigError(f"scale.forget_val_tol must be >= 0, got {tol}")
    n_q = int(sc.forget_quantiles)
    if n_q < 2:
        raise ConfigError(f"scale.forget_quantiles must be >= 2, got {n_q}")
    w_anchor = float(sc.forget_anchor_weight or 0.0)
    if w_anchor < 0:
        raise ConfigError(f"scale.forget_anchor_weight must be >= 0, got {w_anchor}")
    fl = ctx.cfg.fl
    lr = float(sc.forget_lr or fl.lr)
    model = ctx.new_model(state).to(ctx.device)
    # 1. the server's reference: wrong-label margins of its never-seen validation images
    ref = wrong_label_margins(model, ctx.val_retain)
    qs = np.quantile(ref, (np.arange(n_q) + 0.5) / n_q)
    # 2. the client's forgotten samples whose held label is no longer predicted (one per copy set)
    setup = ctx.run.setup
    units = example_units(len(setup.train), setup.poison)
    idx = np.unique(units[ctx.forget_idx])
    data = setup.train.subset(idx)
    x, y = data.inputs().to(ctx.device), data.labels.to(ctx.device)
    model.eval()
    with torch.no_grad():
        z = torch.cat([model(x[i : i + 500]) for i in range(0, len(y), 500)])
        phi = _margins(z, y)
        chosen = z.argmax(1) != y
    info: dict[str, Any] = {
        "epochs": epochs,
        "forget_samples": int(len(idx)),
        "selected": int(chosen.sum()),
        "reference_median": float(np.median(ref)) if len(ref) else None,
        "margin_before": float(phi[chosen].mean()) if bool(chosen.any()) else None,
    }
    if epochs <= 0 or not bool(chosen.any()):
        info.update(epochs_run=0, margin_after=info["margin_before"])
        return {k: v.detach().clone() for k, v in state.items()}, info
    xs, ys, ps = x[chosen], y[chosen], phi[chosen]
    ranks = torch.argsort(torch.argsort(ps)).cpu().numpy()
    targets = torch.as_tensor(
        np.interp((ranks + 0.5) / len(ranks), (np.arange(n_q) + 0.5) / n_q, qs),
        dtype=torch.float32,
        device=ctx.device,
    )
    above = ps > targets  # only margins above their target move (the loss is zero elsewhere)
    info["above_target"] = int(above.sum())
    if not bool(above.any()):
        info.update(epochs_run=0, margin_after=info["margin_before"])
        return {k: v.detach().clone() for k, v in state.items()}, info
    xs, ys, targets = xs[above], ys[above], targets[above]
    sx, sy = select.inputs().to(ctx.device), select.labels.to(ctx.device)
    if anchor is None or len(anchor) == 0:
        w_anchor = 0.0
    if w_anchor > 0:
        ax, ay = anchor.inputs().to(ctx.device), anchor.labels.to(ctx.device)
    info["anchor_weight"] = w_anchor

    def score() -> float:
        model.eval()
        with torch.no_grad():
            return float((model(sx).argmax(1) == sy).float().mean())

    start = score()
    best = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=float(fl.momentum or 0.0))
    gen = torch.Generator().manual_seed(int(ctx.seed) * 1000 + 49)
    bs = int(fl.batch_size)
    trace, run = [start], 0
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(ys), generator=gen).to(ctx.device)
        for i in range(0, len(ys), bs):
            j = perm[i : i + bs]
            opt.zero_grad(set_to_none=True)
            loss = torch.relu(_margins(model(xs[j]), ys[j]) - targets[j]).mean()
            if w_anchor > 0:
                a = torch.randint(len(ay), (min(bs, len(ay)),), generator=gen).to(ctx.device)
                loss = loss + w_anchor * torch.nn.functional.cross_entropy(model(ax[a]), ay[a])
            loss.backward()
            opt.step()
        acc = score()
        trace.append(acc)
        if acc < start - tol:  # the bound: this epoch cost too much validation accuracy
            model.load_state_dict(best)
            break
        best = {k: v.detach().clone() for k, v in model.state_dict().items()}
        run += 1
    model.eval()
    with torch.no_grad():
        after = _margins(model(x[chosen]), y[chosen])
    info.update(
        epochs_run=run,
        select_acc_trace=trace,
        margin_after=float(after.mean()),
        target_mean=float(targets.mean()),
    )
    return {k: v.detach().to("cpu").clone() for k, v in best.items()}, info
