"""SCALE's Phase II search: PPO over the sparsification MDP, or the greedy cut.

:func:`_ppo` trains stable-baselines3's PPO on a :class:`~scaleflu.unlearn.env.SparsifyEnv`
with Table I's hyper-parameters (``scale.ppo``); :func:`rollout` plays the trained policy's
deterministic episode from Theta. :func:`_greedy` is the cheap search (``scale.search: greedy``):
the budget's share of the top-M layers' entries with the largest attribution, zeroed at once.
:class:`_Utility` is the validation accuracy the reward's utility term measures.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext
from scaleflu.unlearn.env import EnvSpec, SparsifyEnv

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
