"""SCALE's forgetting step: D_u's remembered samples brought down to never-seen margins.

After the cut and the healing, the samples of D_u that the network had *memorised* one by one
(a sample whose held label its own neighbourhood does not support: a mislabelled or duplicated
sample, an outlier) still get a higher margin for their held label than a model that never saw
them would give; that residue is what a per-example membership attack reads (docs/scale.md,
"Forgetting membership"). Patterns the network learned from many samples (a trigger, a marked
relabelling) are what the cut removes. This step removes the residue without any model trained
without D_u:

1. **Which samples.** The client holding D_u embeds its distinct samples (one per copy set) with
   the model it was sent (the input of its last linear layer, cosine similarity) and gives each
   its *support*: the share of its ``scale.forget_support_k`` nearest D_u neighbours that hold
   the same label. A sample with support at most ``scale.forget_support_max`` is one its
   neighbourhood does not explain: it was remembered, not learned, whether the model still
   predicts its held label (a duplicated canary the cut left) or not. (Labels only as held: no
   true label is needed.)
2. **Their targets.** The server measures, on its retained validation images (never seen in
   training), the margin ``phi(x, y') = z_y' - logsumexp_{j != y'} z_j`` of every wrong label
   ``y'`` of every image, per cell (the image's class, ``y'``). A D_u sample with held label
   ``y`` sits in cell (the model's class for it with ``y`` aside, ``y``); its level is its rank r
   among the n samples of the cell whose held label is no longer predicted or that were
   remembered (one still predicted ranks at the top), (r + 0.5) / n, and
   its target the cell's never-seen margin at that level: the ranks stay, the distribution
   becomes the never-seen one. A sample is selected when it is also above its target. Cells
   are measured again on the current model every second epoch, so a push that moves
   never-seen images too moves the targets with them.
3. **The step.** At most ``scale.forget_epochs`` epochs (Adam, ``scale.forget_lr``, null:
   0.0015) over the selected samples still above their target, on ``mean relu(phi_i - t_i)``
   plus ``scale.forget_anchor_weight`` times the squared distance from the logits of the model
   received of a batch drawn from the anchor: the server's validation images (sent with the
   model) and the client's own distinct samples that are not selected. What the model does on
   never-seen data and on the rest of D_u stays (the cut and the healing already set it), only
   the remembered samples move. A model
   split into ``trunk`` and ``head`` (the built-in ones, :mod:`scaleflu.fl.models`) moves its
   head only, on trunk features computed once (an epoch then costs a few milliseconds); another
   model moves every parameter. BatchNorm statistics stay frozen. The step ends at the first
   measurement where the selected samples' mean margin above target is at most 0 (they sit,
   on average, at their never-seen level): pushing on until the last of them is under drags
   the others below it, and a member then looks less like one than a never-seen sample does.
4. **The bound.** With the targets the server measures its selection accuracy; the result is
   the state at the last measured epoch whose accuracy is within ``scale.forget_val_tol`` of
   the model received's (the model received when none is).

The client's compute counts in SCALE's CPU time; one model and the anchor images go down, one
model comes back over the link.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.fl.device import infer
from scaleflu.fl.optim import Adam
from scaleflu.unlearn.audit import example_units, label_margins
from scaleflu.unlearn.base import UnlearnContext

_BATCH = 500  # rows per pass of a head on features, and of the similarity search
_MEASURE_EVERY = 2  # epochs between two measurements (the bound and the targets)


def _forward(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``model`` (a whole model, its trunk or its head) on ``x``, no gradient: images in the
    device's passes (:func:`scaleflu.fl.device.infer`), feature rows in passes of 500 (a head's
    matrix products gain nothing from smaller ones)."""
    return infer(model, x, None if x.dim() > 2 else _BATCH)


def embed(
    model: torch.nn.Module,
    x: torch.Tensor,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The input of ``model``'s last linear layer for ``x`` (its penultimate features), and the
    logits (one pass of ``forward``, ``model`` itself by default: its head on trunk features)."""
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linear:
        raise ConfigError("the forgetting step needs a model that ends in a linear layer")
    got: list[torch.Tensor] = []
    hook = linear[-1].register_forward_hook(lambda _m, inp, _o: got.append(inp[0].detach()))
    try:
        z = _forward(model if forward is None else forward, x)
    finally:
        hook.remove()
    return torch.cat(got).flatten(1), z


def label_support(feats: torch.Tensor, labels: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: the share of its ``k`` nearest other rows (cosine similarity) holding its
    label."""
    n = len(labels)
    k = min(int(k), n - 1)
    if k < 1:
        return torch.ones(n)
    f = torch.nn.functional.normalize(feats.float(), dim=1)
    share = torch.empty(n)
    for i in range(0, n, _BATCH):
        part = torch.arange(i, min(i + _BATCH, n))
        sim = f[part] @ f.T
        sim[torch.arange(len(part)), part] = float("-inf")  # not its own neighbour
        nb = labels[sim.topk(k, dim=1).indices]
        share[i : i + len(part)] = (nb == labels[part, None]).float().mean(1)
    return share


def head_layers(model: torch.nn.Module) -> list[torch.nn.Linear] | None:
    """The linear layers of ``model``'s head where the model gives them (``head_layers()``,
    :mod:`scaleflu.fl.models`: the head is those layers, a ReLU after each but the last, nothing
    else) and each has a bias; None otherwise."""
    get = getattr(model, "head_layers", None)
    layers = list(get()) if callable(get) else []
    if not layers or not all(isinstance(m, torch.nn.Linear) for m in layers):
        return None
    return layers if all(m.bias is not None for m in layers) else None


@torch.no_grad()
def step_gradients(
    layers: list[torch.nn.Linear],
    x: torch.Tensor,
    y: torch.Tensor,
    t: torch.Tensor,
    a0: torch.Tensor,
    anchor: float,
) -> None:
    """The gradient of one step's loss (``mean relu(phi_i - t_i)`` over the first ``len(y)``
    rows of ``x``, plus ``anchor`` times the mean squared distance of the other rows' logits
    from ``a0``) into the ``.grad`` of every parameter of ``layers`` (a head as
    :func:`head_layers` gives it, on its input ``x``).

    The operations autograd's backward pass of that loss runs, in its order (the forward's
    ``addmm``, ``relu``, ``logsumexp``; their derivatives' ``threshold_backward``, ``exp``,
    ``mm``): the same gradients bit for bit (the tests compare them with autograd's), at about
    half the cost. A step of the forgetting is a few small matrices, where autograd's
    bookkeeping costs as much as the arithmetic.
    """
    n = len(y)
    hs = [x]
    for i, lin in enumerate(layers):
        h = torch.addmm(lin.bias, hs[-1], lin.weight.t())
        hs.append(torch.relu(h) if i < len(layers) - 1 else h)
    z = hs.pop()
    col = y.view(-1, 1)
    # mean relu(phi - t): 1/n where phi - t > 0 (relu's and mean's derivatives)
    masked = z[:n].scatter(1, col, float("-inf"))
    lse = torch.logsumexp(masked, dim=1)
    r = torch.relu(z[:n].gather(1, col).flatten() - lse - t)
    dphi = torch.ops.aten.threshold_backward(torch.ones_like(r).div_(n), r, 0)
    # phi = z_y - logsumexp_{j != y} z_j: d/dz_j = -exp(z_j - lse) (j != y), d/dz_y = 1
    dz = torch.empty_like(z)
    dz[:n] = (-dphi).unsqueeze(1) * (masked - lse.unsqueeze(1)).exp()
    dz[:n].scatter_(1, col, dphi.unsqueeze(1))
    if len(x) > n:  # anchor * mean_a sum_j (z_aj - a0_aj)^2
        w = torch.tensor(anchor, dtype=z.dtype).div_(len(x) - n)
        dz[n:] = w * (2.0 * (z[n:] - a0))
    for lin in reversed(layers):
        h = hs.pop()
        lin.weight.grad = dz.t().mm(h)
        lin.bias.grad = dz.sum(0)
        if hs:  # the layer's input: through the ReLU before it
            dz = torch.ops.aten.threshold_backward(dz.mm(lin.weight), h, 0)


def all_margins(logits: torch.Tensor) -> torch.Tensor:
    """``phi(x, l)`` for every row and every label ``l`` at once, shape (n, C)."""
    C = logits.shape[1]
    eye = torch.eye(C, dtype=torch.bool, device=logits.device)
    rest = logits.unsqueeze(1).expand(-1, C, -1).masked_fill(eye, float("-inf"))
    return logits - torch.logsumexp(rest, dim=2)


def cell_margins(logits: torch.Tensor, y: torch.Tensor) -> dict[tuple[int, int], np.ndarray]:
    """Sorted wrong-label margins of never-seen images (``logits``, classes ``y``) per cell
    (image class, wrong label)."""
    phi = all_margins(logits.double().cpu()).numpy()
    y = y.cpu().numpy()
    out: dict[tuple[int, int], np.ndarray] = {}
    for c in np.unique(y).tolist():
        rows = np.sort(phi[y == c], axis=0)
        for lab in range(phi.shape[1]):
            if lab != c:
                out[(int(c), lab)] = rows[:, lab]
    return out


def cell_levels(
    phi: torch.Tensor, cell: torch.Tensor, y: torch.Tensor, ranked: torch.Tensor
) -> torch.Tensor:
    """Each sample's quantile level in its cell (cell, held label): (rank + 0.5) / n among the
    ``ranked`` samples of the cell; 0.5 (the cell's median) for the others."""
    q = torch.full((len(y),), 0.5, dtype=torch.float64)
    keys = cell * 1000 + y
    for key in torch.unique(keys[ranked]).tolist():
        m = (keys == key) & ranked
        ranks = torch.argsort(torch.argsort(phi[m]))
        q[m] = (ranks.double() + 0.5) / int(m.sum())
    return q


def cell_targets(
    ref: Mapping[tuple[int, int], np.ndarray], q: torch.Tensor, cell: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """The never-seen margin at quantile level ``q`` (linear interpolation, as ``np.quantile``)
    of each sample's cell (+inf: no reference)."""
    t = np.full(len(y), np.inf)
    keys = (cell * 1000 + y).numpy()
    qn = q.numpy()
    for key in np.unique(keys).tolist():
        m = keys == key
        r = ref.get((key // 1000, key % 1000))
        if r is not None and len(r):
            t[m] = np.interp(qn[m] * (len(r) - 1), np.arange(len(r)), r)
    return torch.as_tensor(t, dtype=torch.float32)


def _settings(ctx: UnlearnContext) -> dict[str, Any]:
    sc = ctx.scale_cfg
    s = {
        "epochs": int(sc.forget_epochs or 0),
        "lr": 0.0015 if sc.forget_lr is None else float(sc.forget_lr),
        "tol": float(sc.forget_val_tol),
        "anchor": float(sc.forget_anchor_weight or 0.0),
        "k": int(sc.forget_support_k),
        "support_max": float(sc.forget_support_max),
    }
    if s["epochs"] < 0:
        raise ConfigError(f"scale.forget_epochs must be >= 0, got {s['epochs']}")
    if not s["lr"] > 0:
        raise ConfigError(f"scale.forget_lr must be positive, got {s['lr']}")
    if s["tol"] < 0:
        raise ConfigError(f"scale.forget_val_tol must be >= 0, got {s['tol']}")
    if s["anchor"] < 0:
        raise ConfigError(f"scale.forget_anchor_weight must be >= 0, got {s['anchor']}")
    if s["k"] < 1:
        raise ConfigError(f"scale.forget_support_k must be >= 1, got {s['k']}")
    if not 0.0 <= s["support_max"] < 1.0:
        raise ConfigError(f"scale.forget_support_max must be in [0, 1), got {s['support_max']}")
    return s


def calibrated_forget(
    ctx: UnlearnContext,
    state: Mapping[str, torch.Tensor],
    select: ImageData,
    anchor: ImageData | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The step of the module docstring on ``state``; returns the new state and a summary.

    ``select``: the server's selection images (the bound); ``anchor``: the server's images whose
    logits must not move (the healing part; None: the selection images). The never-seen
    reference is the retained validation set (both parts).
    """
    s = _settings(ctx)
    dev = ctx.device
    model = ctx.new_model(state).to(dev).eval()  # eval: BatchNorm statistics stay frozen
    setup = ctx.run.setup
    units = example_units(len(setup.train), setup.poison)
    idx = np.unique(units[ctx.forget_idx])
    data = setup.train.subset(idx)
    x, y = data.inputs().to(dev), data.labels.to(dev)
    # a model split into trunk and head (the built-in ones: fl/models.py) moves its head only,
    # on trunk features computed once; another model moves every parameter
    split = callable(getattr(model, "trunk", None)) and callable(getattr(model, "head", None))
    net: Callable[[torch.Tensor], torch.Tensor] = model.head if split else model
    # a head given as its linear layers gets its gradients from step_gradients, not autograd
    layers = head_layers(model) if split else None

    def inputs(images: torch.Tensor) -> torch.Tensor:
        return _forward(model.trunk, images) if split else images

    xin = inputs(x)  # what ``net`` takes: trunk features (or the images)
    feats, z = embed(model, xin, net)
    z, yc = z.float().cpu(), y.cpu()
    phi = label_margins(z, yc)
    # the image's class as the model sees it, its held label aside
    cls = z.scatter(1, yc.view(-1, 1), float("-inf")).argmax(1)
    forgotten = z.argmax(1) != yc  # the held label no longer predicted
    # the support of every sample (among all of D_u): a sample its neighbourhood does not
    # explain was remembered, whether the model still predicts its held label or not
    support = label_support(feats.cpu(), yc, s["k"])
    remembered = support <= s["support_max"]
    # ranked per cell: the samples whose held label is no longer predicted and the remembered
    # ones it still is (a duplicated canary with its wrong label, the cut and the healing left
    # it): those sit at their cell's top ranks and get its top never-seen margins
    ranked = forgotten | remembered
    levels = cell_levels(phi, cls, yc, ranked)  # ranks among those, per cell
    # the never-seen reference: the server's validation images (the bound's and the anchor's)
    parts = [select] if anchor is None or not len(anchor) else [select, anchor]
    vx = inputs(torch.cat([d.inputs() for d in parts]).to(dev))
    vy = torch.cat([d.labels for d in parts]).to(dev)
    t = cell_targets(cell_margins(_forward(net, vx), vy), levels, cls, yc)
    candidates = ranked & (phi > t)
    chosen = candidates & remembered
    info: dict[str, Any] = {
        "epochs": s["epochs"],
        "forget_samples": int(len(idx)),
        "candidates": int(candidates.sum()),  # ranked and above their target
        "selected": int(chosen.sum()),
        "selected_held": int((chosen & ~forgotten).sum()),  # their held label still predicted
        "excess_before": float((phi - t)[chosen].mean()) if bool(chosen.any()) else None,
    }
    copy = {k: v.detach().to("cpu").clone() for k, v in state.items()}
    if s["epochs"] == 0 or not bool(chosen.any()):
        info.update(epochs_run=0, kept_epoch=0, excess_after=info["excess_before"])
        return copy, info
    sel = torch.nonzero(chosen).flatten()
    xs, ys, cs, qs = xin[sel.to(dev)], y[sel.to(dev)], cls[sel], levels[sel]
    n_sel = len(select)  # the first images of the reference: one pass per epoch serves both
    # the anchor: the server's images and the client's own samples that are not pushed (what
    # the model received does on them stays; on 15 Table II runs the second part halved the
    # client request's gap to Retrain's audit at no cost in RA: docs/results/scale.md)
    rest = torch.nonzero(~chosen).flatten().to(dev)
    n_server = len(vx) - n_sel if len(parts) == 2 else len(vx)
    ax = torch.cat([vx[n_sel:] if len(parts) == 2 else vx, xin[rest]])
    a0 = _forward(net, ax)
    # (a trunk parameter gets no gradient, and Adam leaves a parameter without one alone)
    opt = Adam([p for p in model.parameters() if p.requires_grad], lr=s["lr"])
    gen = torch.Generator().manual_seed(int(ctx.seed) * 1000 + 49)
    bs = int(ctx.cfg.fl.batch_size)
    trace: list[float] = []  # selection accuracy at the measured epochs
    excess: list[float] = []  # mean margin above target of the selected samples, alike
    measured: list[int] = []
    kept, kept_state, run = 0, copy, 0
    moving: list[tuple[str, torch.nn.Parameter]] = []
    ts = phi_s = active = None
    for ep in range(s["epochs"] + 1):
        if ep % _MEASURE_EVERY == 0 or ep == s["epochs"]:
            # measured on the model after ep epochs: the bound, and the targets on the current
            # model (a push that moves never-seen images moves the targets with them)
            zv = _forward(net, vx)
            trace.append(float((zv[:n_sel].argmax(1) == vy[:n_sel]).float().mean()))
            ts = cell_targets(cell_margins(zv, vy), qs, cs, ys.cpu())
            phi_s = label_margins(_forward(net, xs).float().cpu(), ys.cpu())
            excess.append(float((phi_s - ts).mean()))
            measured.append(ep)
            if ep > 0 and trace[-1] >= trace[0] - s["tol"]:
                kept = ep  # what moves (the head's parameters) is kept; the rest is the copy
                kept_state = {**copy, **{k: p.detach().to("cpu").clone() for k, p in moving}}
            active = torch.nonzero(phi_s > ts).flatten()
            ts = ts.to(dev)
        # the selected samples sit, on average, at their never-seen level: pushing on until the
        # last one is under drags the others (one head moves them all) below it
        if ep == s["epochs"] or len(active) == 0 or (ep > 0 and excess[-1] <= 0):
            break
        run = ep + 1
        order = active[torch.randperm(len(active), generator=gen)].to(dev)
        for i in range(0, len(order), bs):
            j = order[i : i + bs]
            opt.zero_grad()
            # (index_select: the rows x[j] gives, without advanced indexing's cost per call)
            xj, yj, tj = xs.index_select(0, j), ys.index_select(0, j), ts.index_select(0, j)
            if s["anchor"] > 0:  # one pass for both parts
                a = torch.randint(len(ax), (min(bs, len(ax)),), generator=gen).to(dev)
                xb, ab = torch.cat([xj, ax.index_select(0, a)]), a0.index_select(0, a)
            else:
                xb, ab = xj, a0[:0]
            if layers is not None:
                step_gradients(layers, xb, yj, tj, ab, s["anchor"])
            else:
                out = net(xb)
                pull = ((out[len(j) :] - ab) ** 2).sum(1).mean() if len(ab) else 0.0
                loss = torch.relu(label_margins(out[: len(j)], yj) - tj).mean()
                loss = loss + s["anchor"] * pull
                loss.backward()
            if not moving:  # the parameters this loss reaches (the same graph every step)
                moving = [(k, p) for k, p in model.named_parameters() if p.grad is not None]
            opt.step()
    info.update(
        epochs_run=run,
        kept_epoch=kept,
        measured_epochs=measured,
        select_acc_trace=trace,
        excess_trace=excess,
        excess_after=excess[measured.index(kept)],
        anchor_images=int(n_server),
        anchor_samples=int(len(rest)),
    )
    return kept_state, info
