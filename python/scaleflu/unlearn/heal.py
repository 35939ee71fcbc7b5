"""SCALE's healing: fine-pruning's fine-tune of Theta' on the server's own clean samples.

:func:`split_selection_and_heal` splits the retained validation set into a selection part
(PPO's utility, the re-check, the choice of the healing epoch) and a disjoint healing part;
:func:`heal` fine-tunes on the healing part (cross-entropy, or distillation from the model
before unlearning with :func:`distill_targets`); no client and no link time is spent.
:func:`heal_and_measure` is SCALE's healing step: :func:`heal` with the selection accuracy
before and after.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.fl.device import infer
from scaleflu.fl.fedavg import derive_seed
from scaleflu.fl.optim import MomentumSGD
from scaleflu.unlearn.base import UnlearnContext


def _heal_split(ctx: UnlearnContext, data: ImageData, salt: int) -> tuple[ImageData, ImageData]:
    """``data`` (at least 2 samples) as the rest and a disjoint healing part: a seeded
    (``ctx.seed``, ``salt``) ``scale.heal_share`` of it, at least one sample each."""
    share = float(ctx.scale_cfg.heal_share)
    if not 0.0 < share < 1.0:
        raise ConfigError(f"scale.heal_share must be in (0, 1), got {share}")
    rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, salt]))
    perm = rng.permutation(len(data))
    n_heal = max(1, min(len(data) - 1, int(round(share * len(data)))))
    return data.subset(np.sort(perm[n_heal:])), data.subset(np.sort(perm[:n_heal]))


def split_selection_and_heal(ctx: UnlearnContext) -> tuple[ImageData, ImageData | None]:
    """The retained validation set split into a selection part and a disjoint healing part.

    With ``scale.heal_epochs`` > 0 a seeded ``scale.heal_share`` of the retained validation
    samples fine-tunes Theta' (healing) and only the rest scores PPO's utility and the
    re-check, so the episode is never chosen on the samples that then heal it.
    """
    sc = ctx.scale_cfg
    epochs = int(sc.heal_epochs or 0)
    data = ctx.val_retain
    if epochs <= 0 or len(data) < 2:
        return data, None
    return _heal_split(ctx, data, 47)


def split_class_images(ctx: UnlearnContext) -> tuple[ImageData, ImageData | None]:
    """The server's validation images of a class removed from the whole federation
    (``ctx.val_forget``; empty for any other request) as the part that measures the class (the
    class check, the search's measured R_f) and the part that heals.

    With ``scale.heal_class_images`` (the default) and healing by distillation, a seeded
    ``scale.heal_share`` of them joins the healing, labelled by the teacher with the class
    masked (:func:`distill_targets`: the other classes' share of what the model before
    unlearning gives them), and only the rest measures, so the check is not scored on images
    the healing trained on. Otherwise (the option off, no healing, or healing on the labels: no
    label of the class may be taught) every image measures and none heals.
    """
    sc = ctx.scale_cfg
    data = ctx.val_forget
    if not bool(sc.get("heal_class_images")) or int(sc.heal_epochs or 0) <= 0 or len(data) < 2:
        return data, None
    if heal_loss_kind(ctx) != "distill":
        return data, None
    return _heal_split(ctx, data, 53)


def distill_targets(
    ctx: UnlearnContext, teacher: torch.nn.Module, x: torch.Tensor, temp: float = 1.0
) -> torch.Tensor:
    """The teacher's softmax at temperature ``temp`` on ``x``, the healing's soft labels.

    The server's samples carry no trigger, so what the model before unlearning teaches on them
    is the task, not the backdoor. A class removed from the whole federation gets probability
    0 (its logits masked before the softmax; its samples are already out of the retained set).
    """
    logits = infer(teacher, x) / temp
    req = ctx.request.request
    if req.whole_class:
        logits[:, sorted(req.classes)] = float("-inf")
    return torch.softmax(logits, dim=1)


def _shift_mix(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A batch of images shifted by up to 2 pixels each way, then mixed pairwise (mixup)."""
    n = x.shape[0]
    dx, dy = (int(v) for v in torch.randint(-2, 3, (2,), generator=gen))
    xs = torch.roll(x, shifts=(dy, dx), dims=(-2, -1))
    lam = torch.rand(n, 1, 1, 1, generator=gen).to(x.device)
    other = torch.randperm(n, generator=gen).to(x.device)
    return lam * xs + (1.0 - lam) * xs[other]


def _cuda_devices(device: torch.device | str) -> list[int]:
    """The CUDA device ``device`` is, as ``torch.random.fork_rng`` takes it (none on the CPU)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


def heal_loss_kind(ctx: UnlearnContext) -> str:
    """The healing loss for this request: ``scale.heal_loss``, where ``distill_class`` is
    ``distill`` for a class removed from the whole federation (the teacher's class masked out)
    and ``ce`` for every other request (a teacher that learned D_u would pass D_u on: on a
    MobileNetV3 run the flipped labels came back above the trained model's level;
    docs/results/table2.md)."""
    kind = str(ctx.scale_cfg.heal_loss or "ce")
    if kind not in ("ce", "distill", "distill_class"):
        raise ConfigError(f"scale.heal_loss must be ce, distill or distill_class, got {kind!r}")
    if kind == "distill_class":
        req = ctx.request.request
        return "distill" if req.whole_class else "ce"
    return kind


def heal(
    ctx: UnlearnContext,
    state: Mapping[str, torch.Tensor],
    data: ImageData,
    select: ImageData | None = None,
    cut: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Fine-pruning's healing (Liu et al. 2018): SGD on the server's own clean samples.

    ``scale.heal_params`` says what trains: ``all`` parameters, the cut ``layers`` (the keys of
    ``cut``) or only the ``cut`` entries themselves (``cut[k]`` True where the cut changed the
    weight), or everything but the cut entries (``uncut``: they stay zero, so healing cannot
    grow back what the cut removed); what does not train stays bit-exact (its gradient is
    zeroed before the step).

    At most ``scale.heal_epochs`` passes over ``data`` (the healing part of the retained
    validation set) with the run's batch size and momentum and ``scale.heal_lr`` (null:
    ``fl.lr``), all parameters trained, seeded. With ``select`` (the disjoint selection part)
    the state after the epoch with the best selection accuracy is kept (the unhealed model
    counts as epoch 0) and healing stops after ``scale.heal_patience`` epochs without
    improvement; with ``scale.heal_until: original`` it also stops at the first epoch (after
    at least one) whose selection accuracy improves on every earlier one's and is at least the
    model before unlearning's: the accuracy the cut took is back. Costs no client and no link
    time. Returns the state and a summary.
    """
    sc = ctx.scale_cfg
    fl = ctx.cfg.fl
    lr = float(sc.heal_lr or fl.lr)
    patience = int(sc.heal_patience or 0)
    until = str(sc.get("heal_until") or "best")
    if until not in ("best", "original"):
        raise ConfigError(f"scale.heal_until must be best or original, got {until!r}")
    loss_kind = heal_loss_kind(ctx)
    temp = sc.heal_temperature
    temp = 1.0 if temp is None else float(temp)
    if not temp > 0.0:
        raise ConfigError(f"scale.heal_temperature must be positive, got {temp}")
    model = ctx.new_model(state).to(ctx.device)
    which = str(sc.heal_params or "all")
    if which not in ("all", "layers", "cut", "uncut"):
        raise ConfigError(f"scale.heal_params must be all, layers, cut or uncut, got {which!r}")
    grad_mask: dict[str, torch.Tensor | None] = {}
    if which == "uncut":
        # everything trains but the cut entries, which stay zero: healing cannot grow back
        # what the cut removed
        for k, m in (cut or {}).items():
            grad_mask[k] = (~m.to(ctx.device)).to(torch.float32)
    elif which != "all":
        if not cut:
            raise ConfigError(f"scale.heal_params={which} needs the cut's layers")
        for k, _ in model.named_parameters():
            if k in cut:
                m = cut[k].to(ctx.device)
                grad_mask[k] = m.to(torch.float32) if which == "cut" else None
            else:
                grad_mask[k] = torch.zeros((), device=ctx.device)  # frozen
    params = dict(model.named_parameters())
    # torch.optim.SGD's update without its first-call import of torch._dynamo (fl/optim.py)
    opt = MomentumSGD(model.parameters(), lr=lr, momentum=float(fl.momentum or 0.0))
    x, y = data.inputs().to(ctx.device), data.labels.to(ctx.device)
    augment = str(sc.heal_augment or "none")
    if augment not in ("none", "mix"):
        raise ConfigError(f"scale.heal_augment must be none or mix, got {augment!r}")
    if augment != "none" and loss_kind != "distill":
        raise ConfigError(
            f"scale.heal_augment needs the distillation loss (no labels for mixes); this request "
            f"heals with {loss_kind} (scale.heal_loss: {ctx.scale_cfg.heal_loss})"
        )
    teacher = None
    if loss_kind == "distill":
        # the teacher is the model before unlearning (Theta) on the server's clean samples
        teacher = ctx.new_model(ctx.original_state()).to(ctx.device).eval()

    def targets(inp: torch.Tensor) -> torch.Tensor:
        assert teacher is not None
        return distill_targets(ctx, teacher, inp, temp)

    _, class_heal = split_class_images(ctx)
    n_class = 0 if class_heal is None else len(class_heal)
    if n_class:
        # the class's own images, taught the teacher's other classes (its class masked)
        assert class_heal is not None
        x = torch.cat([x, class_heal.inputs().to(ctx.device)])
        y = torch.cat([y, class_heal.labels.to(ctx.device)])  # (unused: no label is taught)
    soft = targets(x) if teacher is not None and augment == "none" else None
    sx = sy = None
    if select is not None and len(select):
        sx, sy = select.inputs().to(ctx.device), select.labels.to(ctx.device)

    def score() -> float:
        model.eval()
        return float((infer(model, sx).argmax(1) == sy).float().mean())

    best = score() if sx is not None else -1.0
    goal = None  # heal_until original: the model before unlearning's selection accuracy
    if until == "original" and sx is not None:
        before = teacher
        if before is None:  # (a new model's initial draw leaves the caller's generator alone)
            with torch.random.fork_rng(devices=_cuda_devices(ctx.device)):
                before = ctx.new_model(ctx.original_state()).to(ctx.device).eval()
        goal = float((infer(before, sx).argmax(1) == sy).float().mean())
    trace = [best] if sx is not None else []
    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    best_epoch, bs, since = 0, int(fl.batch_size), 0
    gen = torch.Generator().manual_seed(int(ctx.seed) * 1000 + 48)
    epochs = int(sc.heal_epochs)
    # train-mode layers that draw from torch's global generator (MobileNetV3's dropout) draw
    # from one seeded for the healing, so that its result does not depend on what the process
    # ran before (the caller's generator stays as it was)
    with torch.random.fork_rng(devices=_cuda_devices(ctx.device)):
        torch.manual_seed(derive_seed(int(ctx.seed), 48))
        for ep in range(1, epochs + 1):
            model.train()
            perm = torch.randperm(len(y), generator=gen).to(ctx.device)
            for i in range(0, len(y), bs):
                idx = perm[i : i + bs]
                opt.zero_grad()
                if augment == "mix":
                    # more inputs than samples for the teacher to label: each image shifted by up
                    # to 2 pixels, then mixed with another of the batch (mixup); no trigger appears
                    xb = _shift_mix(x[idx], gen)
                    out = model(xb)
                    logp = torch.log_softmax(out / temp, dim=1)
                    loss = torch.nn.functional.kl_div(logp, targets(xb), reduction="batchmean")
                    loss = loss * temp * temp
                elif soft is None:
                    out = model(x[idx])
                    loss = torch.nn.functional.cross_entropy(out, y[idx])
                else:
                    out = model(x[idx])
                    # KL(teacher || student) at temperature T (Hinton et al.), scaled by T^2
                    logp = torch.log_softmax(out / temp, dim=1)
                    loss = torch.nn.functional.kl_div(logp, soft[idx], reduction="batchmean")
                    loss = loss * temp * temp
                loss.backward()
                for k, m in grad_mask.items():
                    g = params[k].grad
                    if m is not None and g is not None:
                        g.mul_(m)
                opt.step()
            if sx is None:
                best_epoch = ep
                continue
            acc = score()
            trace.append(acc)
            if acc > best:
                best, best_epoch, since = acc, ep, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                if goal is not None and acc >= goal:
                    break  # the accuracy the cut took is back
            else:
                since += 1
                if patience and since >= patience:
                    break
    if sx is None:
        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {k: v.to("cpu") for k, v in best_state.items()}
    return out, {
        "epochs_run": len(trace) - 1 if trace else epochs,
        "best_epoch": best_epoch,
        "select_acc_trace": trace,
        "loss": loss_kind,
        "class_images": n_class,
        "until": until,
        "original_select_acc": goal,
    }


def heal_and_measure(
    ctx: UnlearnContext,
    state: Mapping[str, torch.Tensor],
    data: ImageData,
    select: ImageData,
    cut: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """:func:`heal` ``state`` on ``data``; the summary adds the selection accuracy before/after
    (the selection trace's epoch 0 and its kept epoch: measured once, during the healing)."""
    healed, info = heal(ctx, state, data, select, cut)
    trace = info["select_acc_trace"]  # empty without selection images: no accuracy
    before, after = (trace[0], trace[info["best_epoch"]]) if trace else (None, None)
    return healed, {
        **info,
        "epochs": int(ctx.scale_cfg.heal_epochs),
        "samples": len(data),
        "selection_samples": len(select),
        "val_acc_before": before,
        "val_acc_after": after,
    }
