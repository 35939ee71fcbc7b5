"""SCALE (Algorithm 1): Phase I sensitivity, Phase II PPO over the sparsification MDP, rollout.

``paper`` mode follows the equations and the authors' semantics (raw weights, raw scores,
magnitude pruning, the literal reward, no recovery). ``default`` mode uses historical updates,
normalised scores, attribution-guided Sparsify, a per-episode budget, a validation utility term
and optional FedAvg recovery rounds with the remaining clients (GUIDE 3.1-3.5).

After PPO (``scale.ppo.episodes`` x ``scale.episode_steps`` environment steps) the trained
policy is rolled out deterministically for one episode from Theta to produce Theta'. In default
mode with ``scale.keep_best`` the best-return episode seen during training replaces the rollout
when its return is higher (a short CPU-sized PPO run often ends with a policy whose greedy
actions are worse than what it already found).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.env import EnvSpec, EpisodeRecord, SparsifyEnv
from scaleflu.unlearn.metrics import accuracy_from_probs, predict
from scaleflu.unlearn.sensitivity import (
    SensitivityReport,
    class_saliency,
    contrastive_contribution,
    forget_saliency,
    historical_sensitivity,
    paper_sensitivity,
    top_layers,
)

log = logging.getLogger(__name__)

_SB3_IMPORT_S: float | None = None  # seconds the first stable-baselines3 import took


def sb3_startup() -> float:
    """Import stable-baselines3 (and torch.optim's lazy imports) once per process; return the
    seconds this call spent on it.

    The import (several seconds on a busy CPU) is a long-lived server's start-up cost, paid once,
    so SCALE reports it separately (``details.startup_s``) instead of hiding or adding it:
    everything else SCALE needs is in its ``wall_s`` and ``cpu_s``.
    """
    global _SB3_IMPORT_S
    if _SB3_IMPORT_S is not None:
        return 0.0
    t0 = time.perf_counter()
    import stable_baselines3  # noqa: F401
    from stable_baselines3.common.callbacks import BaseCallback  # noqa: F401

    # torch.optim's first optimizer imports torch._dynamo (about 0.9 s of CPU, measured on the
    # 2-core machine) and torch.func's first vmap(grad) about 1 s: process start-up costs too,
    # paid here once (healing uses an optimizer, the saliencies torch.func)
    lin = torch.nn.Linear(2, 2)
    torch.optim.SGD(lin.parameters(), lr=0.1)
    # torch.func's first vmap(grad) (the saliencies) sets itself up once per process too
    from scaleflu.unlearn.sensitivity import forget_saliency

    x, y = torch.zeros(2, 2), torch.zeros(2, dtype=torch.long)
    forget_saliency(lin, x, y, x, y, ["weight"])

    _SB3_IMPORT_S = time.perf_counter() - t0
    return _SB3_IMPORT_S


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
    from scaleflu.fl.models import sensitivity_layers

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
    if req.kind == "class" and not req.clients and attribution == "saliency":
        # a class removed from the whole federation: every client holds it, so the clients'
        # contribution C_l is nearly the whole model and not class-specific. Sparsify by a
        # class-specific saliency on the server's validation set instead (GUIDE 3.4, 3.5).
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
    )
    timing["saliency_s"] = time.perf_counter() - ts
    if not any(float(v.sum()) > 0 for v in sal.values()):
        report.notes.append("forget-set saliency is zero everywhere; Sparsify keeps C_l")
        return
    report.attribution = sal
    report.notes.append(
        "Sparsify ranks parameters by the forget set's own saliency, computed by the client "
        f"holding it ({info['forget_samples']} samples), contrasted with the retained "
        f"validation set's ({info['rest_samples']} samples, contrast {info['contrast']})"
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


def _greedy(
    spec: EnvSpec,
) -> tuple[dict[str, torch.Tensor], AoITracker, list[dict[str, Any]], float]:
    """Zero ``budget`` x (top-M parameters) entries with the largest attribution, at once.

    The attribution maps are normalised over the sensitivity layers, so one ranking across the
    top-M layers is meaningful; only entries with positive attribution are zeroed.
    """
    if spec.budget is None:
        raise ConfigError("scale.search: greedy needs scale.budget")
    flat = torch.cat([spec.attribution[k].flatten().float() for k in spec.layers])
    n = min(int(spec.budget * flat.numel()), int((flat > 0).sum()))
    layers = {k: spec.weights[k].clone() for k in spec.layers}
    aoi = spec.aoi.copy()
    if n <= 0:
        return layers, aoi, [], 0.0
    thr = torch.topk(flat, n).values.min()
    zeroed = 0
    for k in spec.layers:
        mask = (spec.attribution[k] >= thr) & (spec.attribution[k] > 0)
        zeroed += int(mask.sum())
        layers[k][mask.reshape(layers[k].shape)] = 0.0
    changed = changed_groups(spec.weights, layers, spec.groups)
    steps = []
    for k in spec.layers:  # one broadcast step per layer, as the environment's steps
        js = [j for (lk, j) in changed if lk == k]
        if js:
            link_s = aoi.step([(k, j) for j in js])
            steps.append(
                {
                    "layer": k,
                    "changed_groups": js,
                    "link_s": link_s,
                    "s": None,
                    "reward": 0.0,
                    "greedy": True,
                }
            )
    return layers, aoi, steps, zeroed / max(flat.numel(), 1)


def _selection_and_heal(ctx: UnlearnContext) -> tuple[ImageData, ImageData | None]:
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
    share = float(sc.heal_share)
    if not 0.0 < share < 1.0:
        raise ConfigError(f"scale.heal_share must be in (0, 1), got {share}")
    rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, 47]))
    perm = rng.permutation(len(data))
    n_heal = max(1, min(len(data) - 1, int(round(share * len(data)))))
    return data.subset(np.sort(perm[n_heal:])), data.subset(np.sort(perm[:n_heal]))


def distill_targets(
    ctx: UnlearnContext, teacher: torch.nn.Module, x: torch.Tensor, temp: float = 1.0
) -> torch.Tensor:
    """The teacher's softmax at temperature ``temp`` on ``x``, the healing's soft labels.

    The server's samples carry no trigger, so what the model before unlearning teaches on them
    is the task, not the backdoor. A class removed from the whole federation gets probability
    0 (its logits masked before the softmax; its samples are already out of the retained set).
    """
    with torch.no_grad():
        logits = teacher(x) / temp
    req = ctx.request.request
    if req.kind == "class" and not req.clients:
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
    weight); what does not train stays bit-exact (its gradient is zeroed before the step).

    At most ``scale.heal_epochs`` passes over ``data`` (the healing part of the retained
    validation set) with the run's batch size and momentum and ``scale.heal_lr`` (null:
    ``fl.lr``), all parameters trained, seeded. With ``select`` (the disjoint selection part)
    the state after the epoch with the best selection accuracy is kept (the unhealed model
    counts as epoch 0) and healing stops after ``scale.heal_patience`` epochs without
    improvement. Costs no client and no link time. Returns the state and a summary.
    """
    sc = ctx.scale_cfg
    fl = ctx.cfg.fl
    lr = float(sc.heal_lr or fl.lr)
    patience = int(sc.heal_patience or 0)
    loss_kind = str(sc.heal_loss or "ce")
    if loss_kind not in ("ce", "distill"):
        raise ConfigError(f"scale.heal_loss must be ce or distill, got {loss_kind!r}")
    temp = sc.heal_temperature
    temp = 1.0 if temp is None else float(temp)
    if not temp > 0.0:
        raise ConfigError(f"scale.heal_temperature must be positive, got {temp}")
    model = ctx.new_model(state).to(ctx.device)
    which = str(sc.heal_params or "all")
    if which not in ("all", "layers", "cut"):
        raise ConfigError(f"scale.heal_params must be all, layers or cut, got {which!r}")
    grad_mask: dict[str, torch.Tensor | None] = {}
    if which != "all":
        if not cut:
            raise ConfigError(f"scale.heal_params={which} needs the cut's layers")
        for k, _ in model.named_parameters():
            if k in cut:
                m = cut[k].to(ctx.device)
                grad_mask[k] = m.to(torch.float32) if which == "cut" else None
            else:
                grad_mask[k] = torch.zeros((), device=ctx.device)  # frozen
    params = dict(model.named_parameters())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=float(fl.momentum or 0.0))
    x, y = data.inputs().to(ctx.device), data.labels.to(ctx.device)
    augment = str(sc.heal_augment or "none")
    if augment not in ("none", "mix"):
        raise ConfigError(f"scale.heal_augment must be none or mix, got {augment!r}")
    if augment != "none" and loss_kind != "distill":
        raise ConfigError("scale.heal_augment needs scale.heal_loss: distill (no labels for mixes)")
    teacher = None
    if loss_kind == "distill":
        # the teacher is the model before unlearning (Theta) on the server's clean samples
        teacher = ctx.new_model(ctx.original_state()).to(ctx.device).eval()

    def targets(inp: torch.Tensor) -> torch.Tensor:
        assert teacher is not None
        return distill_targets(ctx, teacher, inp, temp)

    soft = targets(x) if teacher is not None and augment == "none" else None
    sx = sy = None
    if select is not None and len(select):
        sx, sy = select.inputs().to(ctx.device), select.labels.to(ctx.device)

    def score() -> float:
        model.eval()
        with torch.no_grad():
            return float((model(sx).argmax(1) == sy).float().mean())

    best = score() if sx is not None else -1.0
    trace = [best] if sx is not None else []
    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    best_epoch, bs, since = 0, int(fl.batch_size), 0
    gen = torch.Generator().manual_seed(int(ctx.seed) * 1000 + 48)
    epochs = int(sc.heal_epochs)
    for ep in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(y), generator=gen).to(ctx.device)
        for i in range(0, len(y), bs):
            idx = perm[i : i + bs]
            opt.zero_grad(set_to_none=True)
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
    }


class _Utility:
    """Retained-data validation accuracy of Theta with the top-M layers replaced.

    Measured on :attr:`UnlearnContext.val_retain` (the validation set less a class removed
    from the whole federation: scoring that class would reward remembering it).
    """

    def __init__(
        self,
        ctx: UnlearnContext,
        base: Mapping[str, torch.Tensor],
        samples: int | None = None,
        data: ImageData | None = None,
    ) -> None:
        """``samples``: a seeded subset of that many samples (None: all); ``data``: another set."""
        self.model = ctx.new_model(base).to(ctx.device)  # fl.device
        self.model.eval()
        self.params = dict(self.model.named_parameters())
        data = ctx.val_retain if data is None else data
        if samples is not None and samples < len(data):
            rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, 45]))
            data = data.subset(np.sort(rng.choice(len(data), size=samples, replace=False)))
        self.x = data.inputs().to(ctx.device)
        self.y = data.labels.to(ctx.device)

    @torch.no_grad()
    def __call__(self, layers: Mapping[str, torch.Tensor]) -> float:
        for k, v in layers.items():
            self.params[k].copy_(v)
        return float((self.model(self.x).argmax(1) == self.y).float().mean())


def _ppo_device(ctx: UnlearnContext) -> str:
    """``scale.ppo.device``: cpu (SB3's advice for an MlpPolicy) or fl (= ``fl.device``)."""
    choice = str(ctx.scale_cfg.ppo.device)
    if choice not in ("cpu", "fl"):
        raise ConfigError(f"scale.ppo.device must be cpu or fl, got {choice!r}")
    return str(ctx.device) if choice == "fl" else "cpu"


def _ppo(env: SparsifyEnv, ctx: UnlearnContext, total_steps: int) -> Any:
    """Train SB3 PPO with Table I hyper-parameters (config ``scale.ppo``) and a tqdm bar."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    p = ctx.scale_cfg.ppo
    n_steps = max(2, min(int(p.n_steps), total_steps))
    batch = max(2, min(int(p.batch_size), n_steps))

    class _Bar(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.bar = tqdm(
                total=total_steps, desc="SCALE PPO", unit="step", disable=not ctx.progress
            )

        def _on_step(self) -> bool:
            self.bar.update(1)
            if env.episode_returns:
                self.bar.set_postfix(ret=f"{env.episode_returns[-1]:.3f}", refresh=False)
            return True

        def _on_training_end(self) -> None:
            self.bar.close()

    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=float(p.learning_rate),
        n_steps=n_steps,
        batch_size=batch,
        n_epochs=int(p.epochs),
        gamma=float(p.gamma),
        gae_lambda=float(p.gae_lambda),
        clip_range=float(p.clip_range),
        ent_coef=float(p.ent_coef),
        seed=ctx.seed,
        device=_ppo_device(ctx),
        verbose=0,
    )
    # torch.distributions re-checks every logit and sample of the ten categoricals per step;
    # the policy produces them, so the checks only cost time (a fifth of PPO's own overhead)
    validate = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        model.learn(total_timesteps=total_steps, callback=_Bar())
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
    return model


def rollout(env: SparsifyEnv, policy: Any | None) -> list[dict[str, Any]]:
    """One deterministic episode from Theta (``policy`` None: no action, for tests)."""
    obs, _ = env.reset()
    steps: list[dict[str, Any]] = []
    done = False
    while not done:
        if policy is None:
            break
        action, _ = policy.predict(obs, deterministic=True)
        obs, reward, term, trunc, info = env.step(action)
        steps.append({**info, "reward": reward, "action": np.asarray(action).tolist()})
        done = term or trunc
    return steps


class ScaleUnlearner:
    """SCALE as an :class:`~scaleflu.unlearn.base.Unlearner` (mode from the context or given)."""

    name = "scale"

    def __init__(self, mode: str | None = None) -> None:
        """``mode`` overrides the context's mode (paper | default)."""
        self.mode = mode

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Phase I, PPO, deterministic rollout, (default) recovery rounds; measure Theta'."""
        mode = self.mode or ctx.mode
        sc = ctx.scale_cfg
        startup = sb3_startup()  # reported apart from the unlearning time (a server's start-up)
        t0 = time.perf_counter()
        c0 = time.process_time()
        phase1_parts: dict[str, float] = {}
        report = phase_one(ctx, mode, phase1_parts)
        t1 = time.perf_counter()
        log.info("Phase I (%s): top-%d layers %s", mode, len(report.top), report.top)
        theta = ctx.original_state()
        aoi0 = AoITracker.from_history(ctx.run.history)
        default = mode == "default"
        # no utility term without retained validation samples (e.g. every class forgotten)
        keep_val = len(ctx.val_retain) > 0
        select, heal_set = _selection_and_heal(ctx) if default else (ctx.val_retain, None)
        exact = (
            _Utility(ctx, theta, data=select) if default and float(sc.w_u) and keep_val else None
        )
        utility = exact
        n_search = sc.utility_samples
        if exact is not None and n_search is not None and int(n_search) < len(exact.y):
            if int(n_search) < 1:
                raise ConfigError(f"scale.utility_samples must be positive, got {n_search}")
            # PPO's reward on a subset (cheaper); the best episodes are re-scored on all of it
            utility = _Utility(ctx, theta, int(n_search), data=select)
        budget = sc.budget if default else None
        forget_u = None
        if sc.class_forget_reward not in ("measured", "attribution"):
            raise ConfigError(
                "scale.class_forget_reward must be measured or attribution, "
                f"got {sc['class_forget_reward']!r}"
            )
        if default and len(ctx.val_forget) and sc.class_forget_reward == "measured":
            # a class removed from the whole federation: the server sees its validation samples,
            # so R_f measures the forgetting instead of a proxy for it
            forget_u = _Utility(ctx, theta, data=ctx.val_forget)
        if str(sc.measure_every) not in ("step", "episode"):
            raise ConfigError(
                f"scale.measure_every must be step or episode, got {sc['measure_every']!r}"
            )
        spec = EnvSpec(
            mode=mode,
            layers=report.top,
            groups={k: ctx.groups[k] for k in report.top},
            weights={k: theta[k] for k in report.top},
            score={k: report.score[k] for k in report.top},
            aoi=aoi0,
            G=int(sc.groups_per_layer),
            s_levels=int(sc.s_levels),
            episode_steps=int(sc.episode_steps),
            w_f=float(sc.w_f),
            w_c=float(sc.w_c),
            w_u=float(sc.w_u) if default else 0.0,
            budget=float(budget) if budget is not None else None,
            attribution={k: report.attribution[k] for k in report.top} if default else {},
            contribution=(
                {k: report.contribution[k] for k in report.top}
                if default and report.contribution
                else {}
            ),
            utility=utility,
            forget_utility=forget_u,
            measure_every=str(sc.measure_every),
            aoi_unit=str(sc.aoi_unit),
            op=str(sc.sparsify_op),
        )
        env = SparsifyEnv(spec)
        env.keep_best = default and bool(sc.keep_best)
        if utility is not exact:
            env.keep_top = max(1, int(sc.utility_recheck))
        search = str(sc.search)
        if search not in ("ppo", "greedy"):
            raise ConfigError(f"scale.search must be ppo or greedy, got {search!r}")
        total = 0
        if default and search == "greedy":
            # ablation / cheap search: no PPO; zero the budget's share of the top-M layers' entries
            # with the largest attribution at once (one broadcast step)
            layers, aoi, steps, zeroed = _greedy(spec)
            trace = [float(aoi.total(report.top)["aoi_s"])]
            chosen, curve, best, ppo_utility_s, recheck = "greedy", [], None, 0.0, []
            t2 = time.perf_counter()
            rollout_return = 0.0
        else:
            total = max(1, int(sc.ppo.episodes) * int(sc.episode_steps))
            policy = _ppo(env, ctx, total)
            t2 = time.perf_counter()
            curve = list(env.episode_returns)
            best = env.best  # the best training episode (default mode with keep_best)
            ppo_utility_s = env.utility_s
            steps = rollout(env, policy)
            rollout_return = float(sum(s["reward"] for s in steps))
            cands = [
                EpisodeRecord(
                    rollout_return,
                    env.layer_state(),
                    env.aoi,
                    list(env.sum_aoi_trace),
                    steps,
                    env.zeroed_share(),
                    (env.util_prev - env.util0) / env.util0,
                ),
                *env.top,
            ]
            names = ["rollout"] + ["best_episode"] * len(env.top)
            score = [c.ret for c in cands]
            recheck: list[dict[str, Any]] = []
            if utility is not exact and exact is not None:
                # the estimate only ranked the search: re-score the candidates' utility term exactly
                w_u = float(sc.w_u)
                acc0 = max(exact({k: theta[k] for k in report.top}), 1e-6)
                for i, c in enumerate(cands):
                    acc = exact(c.layers)
                    score[i] = c.ret - w_u * c.util_gain + w_u * (acc - acc0) / acc0
                    recheck.append(
                        {
                            "from": names[i],
                            "return": c.ret,
                            "exact_return": score[i],
                            "val_acc": acc,
                        }
                    )
            # the rollout unless a kept episode does strictly better (as before the re-check)
            i_best = max(range(len(cands)), key=lambda i: (score[i], i == 0))
            chosen, pick = names[i_best], cands[i_best]
            layers, aoi, trace, steps = pick.layers, pick.aoi, list(pick.sum_aoi_trace), pick.steps
            zeroed = pick.zeroed_share
            log.info(
                "Theta' from the %s (return %.3f; deterministic rollout %.3f)",
                chosen,
                score[i_best],
                score[0],
            )
        new_state = dict(theta)
        for k, v in layers.items():
            new_state[k] = v.clone()
        # the chosen episode's AoI state: each step's payload was charged to the link
        link_s = sum(s["link_s"] for s in steps)
        nbytes = sum(
            aoi.payload_bytes([(s["layer"], j) for j in s["changed_groups"]]) for s in steps
        )
        t3 = time.perf_counter()
        recovery = {"rounds": 0, "bytes": 0, "link_s": 0.0, "wall_s": 0.0}
        pre_recovery_acc = None
        if default and int(sc.recovery_rounds) > 0:
            pre_recovery_acc = accuracy_from_probs(
                predict(ctx.new_model(new_state), ctx.val), ctx.val.labels
            )
            epochs = sc.recovery_local_epochs
            local = ctx.local_config(int(epochs) if epochs is not None else None)
            T = ctx.run.history.last_completed_round()
            new_state, cost = ctx.fedavg_rounds(
                new_state, int(sc.recovery_rounds), T + 1, local, aoi, desc="recovery"
            )
            recovery = {
                "rounds": cost.rounds,
                "bytes": cost.bytes,
                "link_s": cost.link_s,
                "wall_s": cost.wall_s,
            }
            trace.append(float(aoi.total(report.top)["aoi_s"]))
        t4 = time.perf_counter()
        healing = None
        if heal_set is not None:
            # fine-pruning's healing on the server's own clean samples (no client, no link);
            # validation accuracy before and after, measured on the selection part
            val_sel = accuracy_from_probs(predict(ctx.new_model(new_state), select), select.labels)
            cut = {k: layers[k] != theta[k] for k in report.top}  # the cut, before any round
            new_state, heal_info = heal(ctx, new_state, heal_set, select, cut)
            healing = {
                **heal_info,
                "epochs": int(sc.heal_epochs),
                "samples": len(heal_set),
                "selection_samples": len(select),
                "val_acc_before": val_sel,
                "val_acc_after": accuracy_from_probs(
                    predict(ctx.new_model(new_state), select), select.labels
                ),
            }
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        timing = {
            "startup_s": startup,  # stable-baselines3's first import: not in wall_s / cpu_s
            "phase1_s": t1 - t0,
            **{f"phase1_{k}": v for k, v in phase1_parts.items()},
            "ppo_s": t2 - t1,
            "ppo_utility_s": ppo_utility_s,  # validation forward passes inside PPO's steps
            "select_s": t3 - t2,  # deterministic rollout, exact re-check of the candidates
            "recovery_s": t4 - t3,  # FedAvg recovery rounds (and the validation pass before)
            "heal_s": wall - (t4 - t0),  # healing on the server's validation samples
            "wall_s": wall,
            "cpu_s": cpu,
            "torch_threads": torch.get_num_threads(),
        }
        log.info(
            "SCALE time: %s",
            ", ".join(f"{k} {v:.2f}" for k, v in timing.items() if isinstance(v, float)),
        )
        details = {
            "timing": timing,
            "startup_s": startup,
            "sensitivity": report.to_json(),
            "phase1_s": t1 - t0,
            "ppo_s": t2 - t1,
            "ppo_steps": total,
            "episode_returns": curve,
            "episode_infos": env.episode_infos,
            "rollout": steps,
            "theta_from": chosen,
            "utility_samples": len(utility.y) if utility is not None else None,
            "utility_recheck": recheck,
            "rollout_return": rollout_return,
            "best_episode_return": best.ret if best is not None else None,
            "zeroed_share": zeroed,
            "utility_evals": env.utility_evals,
            "utility_cache_hits": env.utility_hits,
            "recovery": recovery,
            "healing": healing,
            "val_acc_before_recovery": pre_recovery_acc,
            "action_encoding": (
                f"MultiDiscrete([{len(report.top)}] + [2]*{spec.G} + [{spec.s_levels}])"
            ),
        }
        res = ctx.make_result(
            f"scale-{mode}",
            new_state,
            wall_s=wall,
            bytes_=nbytes + recovery["bytes"],
            link_s=link_s + recovery["link_s"],
            fl_rounds=recovery["rounds"],
            aoi=aoi,
            top_layers=report.top,
            steps=len(steps),
            sum_aoi_trace=trace,
            details=details,
            mode=mode,
            cpu_s=cpu,
        )
        self.state = new_state
        self.report = report
        return res


# The figures live in scaleflu.plots; these names are kept for old importers.
from scaleflu.plots import plot_rewards, plot_sum_aoi  # noqa: E402, F401
