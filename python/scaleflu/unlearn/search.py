"""SCALE's Phase II search: PPO over the sparsification MDP, or the greedy cut.

:func:`search` builds the :class:`~scaleflu.unlearn.env.SparsifyEnv` of a request
(:func:`sparsify_env`) and finds Theta''s top-M layers, returned as a :class:`Found`:

* ``scale.search: ppo`` (the paper's): :func:`train_ppo` trains stable-baselines3's PPO with
  Table I's hyper-parameters (``scale.ppo``, ``scale.ppo.episodes`` x ``scale.episode_steps``
  environment steps), then :func:`rollout` plays the trained policy's deterministic episode from
  Theta. In default mode with ``scale.keep_best`` the best-return episodes seen in training are
  candidates too and replace the rollout when their return is higher (a short CPU-sized PPO run
  often ends with a policy whose greedy actions are worse than what it already found); with a
  subsampled utility (``scale.utility_samples``) the candidates are re-scored on the whole
  selection set first (:func:`_choose`).
* ``scale.search: greedy`` (default mode): :func:`greedy_cut` zeroes the budget's share of the
  top-M layers' entries with the largest attribution at once, one broadcast step.

:class:`Utility` is the validation accuracy the reward's utility term measures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.fl.device import infer
from scaleflu.fl.models import sensitivity_layers
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext
from scaleflu.unlearn.env import EnvSpec, EpisodeRecord, SparsifyEnv
from scaleflu.unlearn.heal import split_class_images
from scaleflu.unlearn.sensitivity import forget_saliency, hookable_layers

if TYPE_CHECKING:
    from scaleflu.unlearn.sensitivity import SensitivityReport

log = logging.getLogger(__name__)

_SB3_IMPORT_S: float | None = None  # seconds the first stable-baselines3 import took
_TORCH_FUNC_READY = False  # torch.func's first vmap(grad) done in this process


def uses_saliency(ctx: UnlearnContext) -> bool:
    """Whether Phase I computes a saliency (per-sample gradients) for the request: a class
    removed from the whole federation, or the attribution chosen for its kind."""
    req, sc = ctx.request.request, ctx.scale_cfg
    if req.whole_class:
        return str(sc.class_attribution) == "saliency"
    chosen = sc.client_attribution if req.kind == "client" else sc.sample_attribution
    return str(chosen) == "saliency"


def saliency_needs_torch_func(ctx: UnlearnContext) -> bool:
    """Whether the request's saliency needs ``torch.func``: only for a model whose sensitivity
    layers are not all Linear or Conv2d weights (their per-sample gradients come from one
    backward pass, ``sensitivity._per_sample_weight_grads``)."""
    if not uses_saliency(ctx):
        return False
    model = ctx.new_model()
    return hookable_layers(model, sensitivity_layers(model)) is None


def uses_ppo(ctx: UnlearnContext, mode: str) -> bool:
    """Whether the search trains PPO (stable-baselines3): paper mode, or ``scale.search: ppo``."""
    return mode != "default" or str(ctx.scale_cfg.search) != "greedy"


def sb3_startup(saliency: bool = True, ppo: bool = True) -> float:
    """With ``ppo`` import stable-baselines3, with ``saliency`` set up torch.func (for a
    saliency that needs it: :func:`saliency_needs_torch_func`), once per process each; return
    the seconds this call spent on it.

    The import (several seconds on a busy CPU) is a long-lived server's start-up cost, paid once,
    so SCALE reports it separately (``details.startup_s``) instead of hiding or adding it:
    everything else SCALE needs is in its ``wall_s`` and ``cpu_s``.
    """
    global _SB3_IMPORT_S, _TORCH_FUNC_READY
    spent = 0.0
    if saliency and not _TORCH_FUNC_READY:
        # torch.func's first vmap(grad) (the saliencies of a model with layers other than
        # Linear and Conv2d) imports torch._dynamo, about a second of CPU: a process start-up
        # cost too, paid here once and only when Phase I needs it (healing needs no
        # torch.optim: fl/optim.py)
        t0 = time.perf_counter()
        model = torch.nn.Sequential(torch.nn.Conv1d(1, 2, 1), torch.nn.Flatten())
        x, y = torch.zeros(2, 1, 1), torch.zeros(2, dtype=torch.long)
        forget_saliency(model, x, y, x, y, ["0.weight"])
        _TORCH_FUNC_READY = True
        spent = time.perf_counter() - t0
    if not ppo or _SB3_IMPORT_S is not None:
        return spent
    t0 = time.perf_counter()
    import stable_baselines3  # noqa: F401
    from stable_baselines3.common.callbacks import BaseCallback  # noqa: F401

    _SB3_IMPORT_S = time.perf_counter() - t0
    return spent + _SB3_IMPORT_S


def greedy_cut(
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


class Utility:
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
        return float((infer(self.model, self.x).argmax(1) == self.y).float().mean())


def ppo_device(ctx: UnlearnContext) -> str:
    """``scale.ppo.device``: cpu (SB3's advice for an MlpPolicy) or fl (= ``fl.device``)."""
    choice = str(ctx.scale_cfg.ppo.device)
    if choice not in ("cpu", "fl"):
        raise ConfigError(f"scale.ppo.device must be cpu or fl, got {choice!r}")
    return str(ctx.device) if choice == "fl" else "cpu"


def train_ppo(env: SparsifyEnv, ctx: UnlearnContext, total_steps: int) -> Any:
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
        device=ppo_device(ctx),
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


@dataclass
class Found:
    """What the search chose: Theta''s top-M layers, their AoI state and how they were found."""

    layers: dict[str, torch.Tensor]
    aoi: AoITracker
    sum_aoi_trace: list[float]
    steps: list[dict[str, Any]]
    zeroed_share: float
    chosen: str  # greedy | rollout | best_episode
    env: SparsifyEnv
    utility: Utility | None
    trained_at: float  # time.perf_counter() when PPO (or the greedy cut) had finished
    ppo_steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    best: EpisodeRecord | None = None
    ppo_utility_s: float = 0.0
    recheck: list[dict[str, Any]] = field(default_factory=list)
    rollout_return: float = 0.0


def sparsify_env(
    ctx: UnlearnContext,
    mode: str,
    report: SensitivityReport,
    theta: Mapping[str, torch.Tensor],
    select: ImageData,
    budget: float | None = None,
) -> tuple[SparsifyEnv, Utility | None]:
    """The request's environment over the top-M layers, and the exact utility (None: none).

    ``budget`` (default mode): the cut's budget where the caller sets one (the class check's
    first budget), else ``scale.budget``.

    The utility term (default mode, ``scale.w_u`` > 0) scores the selection part of the retained
    validation set, on a seeded subset of ``scale.utility_samples`` during the search.
    """
    sc = ctx.scale_cfg
    default = mode == "default"
    aoi0 = AoITracker.from_history(ctx.run.history)
    # no utility term without retained validation samples (e.g. every class forgotten)
    keep_val = len(ctx.val_retain) > 0
    exact = Utility(ctx, theta, data=select) if default and float(sc.w_u) and keep_val else None
    utility = exact
    n_search = sc.utility_samples
    if exact is not None and n_search is not None and int(n_search) < len(exact.y):
        if int(n_search) < 1:
            raise ConfigError(f"scale.utility_samples must be positive, got {n_search}")
        # PPO's reward on a subset (cheaper); the best episodes are re-scored on all of it
        utility = Utility(ctx, theta, int(n_search), data=select)
    if not default:
        budget = None
    elif budget is None:
        budget = sc.budget
    forget_u = None
    if sc.class_forget_reward not in ("measured", "attribution"):
        raise ConfigError(
            "scale.class_forget_reward must be measured or attribution, "
            f"got {sc['class_forget_reward']!r}"
        )
    # (default mode heals: without the class's images that heal, if any do)
    measured = split_class_images(ctx)[0] if default else ctx.val_forget
    if default and len(measured) and sc.class_forget_reward == "measured":
        # a class removed from the whole federation: the server sees its validation samples,
        # so R_f measures the forgetting instead of a proxy for it
        forget_u = Utility(ctx, theta, data=measured)
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
    return env, exact


def search(
    ctx: UnlearnContext,
    mode: str,
    report: SensitivityReport,
    theta: Mapping[str, torch.Tensor],
    select: ImageData,
    budget: float | None = None,
) -> Found:
    """Phase II: Theta''s top-M layers by PPO (and its candidates) or by the greedy cut
    (``budget``: see :func:`sparsify_env`)."""
    sc = ctx.scale_cfg
    env, exact = sparsify_env(ctx, mode, report, theta, select, budget)
    utility = env.spec.utility
    how = str(sc.search)
    if how not in ("ppo", "greedy"):
        raise ConfigError(f"scale.search must be ppo or greedy, got {how!r}")
    if mode == "default" and how == "greedy":
        # ablation / cheap search: no PPO; zero the budget's share of the top-M layers' entries
        # with the largest attribution at once (one broadcast step)
        layers, aoi, steps, zeroed = greedy_cut(env.spec)
        trace = [float(aoi.total(report.top)["aoi_s"])]
        return Found(layers, aoi, trace, steps, zeroed, "greedy", env, utility, time.perf_counter())
    total = max(1, int(sc.ppo.episodes) * int(sc.episode_steps))
    policy = train_ppo(env, ctx, total)
    trained_at = time.perf_counter()
    curve = list(env.episode_returns)
    best = env.best  # the best training episode (default mode with keep_best)
    ppo_utility_s = env.utility_s
    steps = rollout(env, policy)
    rollout_return = float(sum(s["reward"] for s in steps))
    chosen, pick, recheck = _choose(env, steps, rollout_return, exact, theta, report.top, sc)
    return Found(
        pick.layers,
        pick.aoi,
        list(pick.sum_aoi_trace),
        pick.steps,
        pick.zeroed_share,
        chosen,
        env,
        utility,
        trained_at,
        total,
        curve,
        best,
        ppo_utility_s,
        recheck,
        rollout_return,
    )


def _choose(
    env: SparsifyEnv,
    steps: list[dict[str, Any]],
    rollout_return: float,
    exact: Utility | None,
    theta: Mapping[str, torch.Tensor],
    top: list[str],
    sc: Any,
) -> tuple[str, EpisodeRecord, list[dict[str, Any]]]:
    """The rollout or a kept training episode, whichever scores best; the re-check rows."""
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
    if env.spec.utility is not exact and exact is not None:
        # the estimate only ranked the search: re-score the candidates' utility term exactly
        w_u = float(sc.w_u)
        acc0 = max(exact({k: theta[k] for k in top}), 1e-6)
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
    log.info(
        "Theta' from the %s (return %.3f; deterministic rollout %.3f)",
        names[i_best],
        score[i_best],
        score[0],
    )
    return names[i_best], cands[i_best], recheck
