"""SCALE (Algorithm 1) as an unlearning method: Phase I, the search, recovery, healing.

:meth:`ScaleUnlearner.run` is four named steps over an :class:`UnlearnContext`:

1. **Phase I** (:func:`scaleflu.unlearn.sensitivity.phase_one`): the request's top-M sensitive
   layers and the attribution that ranks their entries.
2. **The search** (:func:`scaleflu.unlearn.search.search`): PPO over the AoI-driven
   sparsification MDP and its deterministic rollout (or the greedy cut) gives Theta'.
3. **Recovery** (:func:`recover`, default mode, ``scale.recovery_rounds`` > 0): FedAvg rounds
   with the remaining clients from Theta'.
4. **Healing** (:func:`scaleflu.unlearn.heal.heal_and_measure`, default mode,
   ``scale.heal_epochs`` > 0): fine-tuning on the server's own clean samples.

``paper`` mode follows the equations and the authors' semantics (raw weights, raw scores,
magnitude pruning, the literal reward, no recovery). ``default`` mode uses historical updates,
normalised scores, attribution-guided Sparsify, a per-episode budget, a validation utility term
and optional recovery and healing (docs/scale.md, "Phase I: sensitive layers" and "Phase II:
AoI-driven sparsification").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from scaleflu.config import ConfigError
from scaleflu.fl.data import ImageData
from scaleflu.fl.history import state_bytes
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.forget import calibrated_forget
from scaleflu.unlearn.heal import heal_and_measure, split_class_images, split_selection_and_heal
from scaleflu.unlearn.metrics import accuracy_from_probs, predict
from scaleflu.unlearn.search import (
    Found,
    greedy_cut,
    saliency_needs_torch_func,
    sb3_startup,
    search,
    uses_ppo,
)
from scaleflu.unlearn.sensitivity import SensitivityReport, phase_one

log = logging.getLogger(__name__)

NO_RECOVERY = {"rounds": 0, "bytes": 0, "link_s": 0.0, "wall_s": 0.0}
# the class check grows the greedy cut's budget by this factor per try (up to class_budget_max)
_BUDGET_STEP = 1.5


def recover(
    ctx: UnlearnContext, state: dict[str, torch.Tensor], aoi: AoITracker
) -> tuple[dict[str, torch.Tensor], dict[str, Any], float]:
    """``scale.recovery_rounds`` FedAvg rounds with the remaining clients from ``state``.

    Returns the state after them, their cost and the validation accuracy before them.
    """
    sc = ctx.scale_cfg
    before = accuracy_from_probs(predict(ctx.new_model(state), ctx.val), ctx.val.labels)
    epochs = sc.recovery_local_epochs
    local = ctx.local_config(int(epochs) if epochs is not None else None)
    T = ctx.run.history.last_completed_round()
    state, cost = ctx.fedavg_rounds(
        state, int(sc.recovery_rounds), T + 1, local, aoi, desc="recovery"
    )
    recovery = {
        "rounds": cost.rounds,
        "bytes": cost.bytes,
        "link_s": cost.link_s,
        "wall_s": cost.wall_s,
    }
    return state, recovery, before


@dataclass
class _Outcome:
    """Theta' after the cut, the recovery rounds and the healing, and what they cost."""

    state: dict[str, torch.Tensor]
    recovery: dict[str, Any]
    pre_recovery_acc: float | None
    healing: dict[str, Any] | None
    recovery_s: float


def _cut_recover_heal(
    ctx: UnlearnContext,
    default: bool,
    report: SensitivityReport,
    theta: dict[str, torch.Tensor],
    found: Found,
    heal_set: ImageData | None,
    select: ImageData,
) -> _Outcome:
    """Theta with ``found``'s layers, then (default mode) recovery and healing."""
    sc = ctx.scale_cfg
    state = dict(theta)
    for k, v in found.layers.items():
        state[k] = v.clone()
    t0 = time.perf_counter()
    recovery, pre_recovery_acc = dict(NO_RECOVERY), None
    if default and int(sc.recovery_rounds) > 0:
        aoi = found.aoi.copy()  # the rounds' AoI on a copy: an escalation may recover again
        state, recovery, pre_recovery_acc = recover(ctx, state, aoi)
        found.aoi = aoi
        found.sum_aoi_trace = [*found.sum_aoi_trace, float(aoi.total(report.top)["aoi_s"])]
    t1 = time.perf_counter()
    healing = None
    if heal_set is not None:
        # fine-pruning's healing on the server's own clean samples (no client, no link)
        cut = {k: found.layers[k] != theta[k] for k in report.top}  # before any round
        state, healing = heal_and_measure(ctx, state, heal_set, select, cut)
    return _Outcome(state, recovery, pre_recovery_acc, healing, t1 - t0)


def _class_check(ctx: UnlearnContext, mode: str) -> float | None:
    """The class check's first budget (:func:`class_first_budget`) where the check applies,
    else None. It applies to default mode's greedy cut of a class removed from the whole
    federation (the server holds validation images of it), with a positive first budget below
    ``scale.class_budget_max``."""
    sc = ctx.scale_cfg
    req = ctx.request.request
    if mode != "default" or str(sc.search) != "greedy" or sc.budget is None:
        return None
    if not req.whole_class or not len(ctx.val_forget):
        return None
    cap = sc.get("class_budget_max")
    first = class_first_budget(ctx)
    return first if cap is not None and 0.0 < first < float(cap) else None


def class_first_budget(ctx: UnlearnContext) -> float:
    """The greedy cut's first budget where the class check applies: ``scale.class_budget_start``
    (null: ``scale.budget``). The check grows it by half while the class is still recognised,
    so a first budget below what the class needs costs a try, not the forgetting."""
    sc = ctx.scale_cfg
    start = sc.get("class_budget_start")
    first = float(sc.budget if start is None else start)
    if not first > 0.0:
        raise ConfigError(f"scale.class_budget_start must be positive (or null), got {start}")
    return first


def class_val_accuracy(ctx: UnlearnContext, state: dict[str, torch.Tensor]) -> float:
    """The share of the server's validation images of the forgotten class(es) that ``state``
    still predicts as their class (a model that never saw the class: 0); those that healed
    (``scale.heal_class_images``) are not counted."""
    images, _ = split_class_images(ctx)
    acc = accuracy_from_probs(predict(ctx.new_model(state), images), images.labels)
    return float(acc or 0.0)


def _escalate(
    ctx: UnlearnContext,
    report: SensitivityReport,
    theta: dict[str, torch.Tensor],
    found: Found,
    out: _Outcome,
    heal_set: ImageData | None,
    select: ImageData,
) -> tuple[Found, _Outcome, dict[str, Any]]:
    """Grow the greedy cut's budget by half (up to ``scale.class_budget_max``) while the healed
    model still predicts more than ``scale.class_forget_tol`` of the server's validation images
    of the forgotten class as that class. The result is the try with the fewest of them (the
    first such: the last try when it is within the tolerance; where the cap comes first, a
    larger cut may have healed back more of the class than a smaller one). Only the chosen cut
    goes over the link; every try counts in SCALE's time (the server's computation)."""
    sc = ctx.scale_cfg
    tol = float(sc.class_forget_tol)
    cap = float(sc.class_budget_max)
    if not 0.0 <= tol < 1.0:
        raise ConfigError(f"scale.class_forget_tol must be in [0, 1), got {tol}")
    budget = float(found.env.spec.budget)  # the first cut's (class_first_budget)
    acc = class_val_accuracy(ctx, out.state)
    tries = [{"budget": budget, "class_val_acc": acc}]
    best = (acc, found, out, budget)
    while acc > tol and budget < cap:
        budget = min(_BUDGET_STEP * budget, cap)
        spec = replace(found.env.spec, budget=budget)
        layers, aoi, steps, zeroed = greedy_cut(spec)
        trace = [float(aoi.total(report.top)["aoi_s"])]
        found = replace(
            found, layers=layers, aoi=aoi, sum_aoi_trace=trace, steps=steps, zeroed_share=zeroed
        )
        out = _cut_recover_heal(ctx, True, report, theta, found, heal_set, select)
        acc = class_val_accuracy(ctx, out.state)
        tries.append({"budget": budget, "class_val_acc": acc})
        if acc < best[0]:
            best = (acc, found, out, budget)
    _, found, out, kept = best
    if len(tries) > 1:
        log.info(
            "class check: the server's validation images of the class at %s (tolerance %.3f); "
            "kept budget %.3f",
            ", ".join(f"budget {t['budget']:.3f}: {t['class_val_acc']:.3f}" for t in tries),
            tol,
            kept,
        )
    info = {
        "tol": tol,
        "budget_max": cap,
        "val_images": len(split_class_images(ctx)[0]),
        "tries": tries,
        "kept_budget": kept,
    }
    return found, out, info


class ScaleUnlearner:
    """SCALE as an :class:`~scaleflu.unlearn.base.Unlearner` (mode from the context or given)."""

    name = "scale"

    def __init__(self, mode: str | None = None) -> None:
        """``mode`` overrides the context's mode (paper | default)."""
        self.mode = mode

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Phase I, the search, (default) recovery and healing; measure Theta'."""
        mode = self.mode or ctx.mode
        default = mode == "default"
        sc = ctx.scale_cfg
        # reported apart from the unlearning time (a server's start-up)
        startup = sb3_startup(saliency=saliency_needs_torch_func(ctx), ppo=uses_ppo(ctx, mode))
        t0, c0 = time.perf_counter(), time.process_time()

        phase1_parts: dict[str, float] = {}
        report = phase_one(ctx, mode, phase1_parts)
        t1 = time.perf_counter()
        log.info("Phase I (%s): top-%d layers %s", mode, len(report.top), report.top)

        theta = ctx.original_state()
        select, heal_set = split_selection_and_heal(ctx) if default else (ctx.val_retain, None)
        # the class check's first cut may be smaller than scale.budget: it grows while needed
        first = _class_check(ctx, mode)
        found = search(ctx, mode, report, theta, select, first)
        t3 = time.perf_counter()
        out = _cut_recover_heal(ctx, default, report, theta, found, heal_set, select)
        t5 = time.perf_counter()
        escalation = None
        if first is not None:
            # a class removed from the whole federation whose own validation images the model
            # still recognises: the cut was too small for this model, so cut more
            found, out, escalation = _escalate(ctx, report, theta, found, out, heal_set, select)
        new_state = out.state
        # the chosen cut's changed groups go over the link (one broadcast step per layer)
        link_s = sum(s["link_s"] for s in found.steps)
        nbytes = sum(
            found.aoi.payload_bytes([(s["layer"], j) for j in s["changed_groups"]])
            for s in found.steps
        )
        t6 = time.perf_counter()

        forgetting = None
        if default and int(sc.forget_epochs or 0) > 0:
            # the forgetting step: the requester's client moves D_u's remembered samples'
            # margins onto never-seen data's (one model and the anchor images down, one back)
            new_state, forgetting = calibrated_forget(ctx, new_state, select, heal_set)
            model_bytes = state_bytes(new_state)
            px = ctx.val.pixels
            image_bytes = int(px[0].numel()) * px.element_size()  # as the server stores them
            forgetting["bytes"] = 2 * model_bytes + forgetting.get("anchor_images", 0) * image_bytes
            forgetting["link_s"] = ctx.link.seconds(forgetting["bytes"])
            nbytes += forgetting["bytes"]
            link_s += forgetting["link_s"]

        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
        timing = {
            "startup_s": startup,  # stable-baselines3's first import: not in wall_s / cpu_s
            "phase1_s": t1 - t0,
            **{f"phase1_{k}": v for k, v in phase1_parts.items()},
            "ppo_s": found.trained_at - t1,
            "ppo_utility_s": found.ppo_utility_s,  # validation passes inside PPO's steps
            "select_s": t3 - found.trained_at,  # rollout, exact re-check of the candidates
            "recovery_s": out.recovery_s,  # FedAvg recovery rounds (and the validation pass before)
            "heal_s": t5 - t3 - out.recovery_s,  # healing on the server's validation samples
            # larger cuts (a class its validation images still show) and the cut's link cost
            "escalation_s": t6 - t5,
            "forget_s": wall - (t6 - t0),  # the calibrated forgetting step (the client's)
            "wall_s": wall,
            "cpu_s": cpu,
            "torch_threads": torch.get_num_threads(),
        }
        log.info(
            "SCALE time: %s",
            ", ".join(f"{k} {v:.2f}" for k, v in timing.items() if isinstance(v, float)),
        )
        recovery = out.recovery
        details = _details(report, found, timing, recovery, out.healing, out.pre_recovery_acc)
        details["forgetting"] = forgetting
        details["class_escalation"] = escalation
        res = ctx.make_result(
            f"scale-{mode}",
            new_state,
            wall_s=wall,
            bytes_=nbytes + recovery["bytes"],
            link_s=link_s + recovery["link_s"],
            fl_rounds=recovery["rounds"],
            aoi=found.aoi,
            top_layers=report.top,
            steps=len(found.steps),
            sum_aoi_trace=found.sum_aoi_trace,
            details=details,
            mode=mode,
            cpu_s=cpu,
        )
        self.state = new_state
        self.report = report
        return res


def _details(
    report: SensitivityReport,
    found: Found,
    timing: dict[str, Any],
    recovery: dict[str, Any],
    healing: dict[str, Any] | None,
    pre_recovery_acc: float | None,
) -> dict[str, Any]:
    """The ``details`` of SCALE's :class:`UnlearnResult` (docs/scale.md, "Results schema")."""
    env = found.env
    return {
        "timing": timing,
        "startup_s": timing["startup_s"],
        "sensitivity": report.to_json(),
        "phase1_s": timing["phase1_s"],
        "ppo_s": timing["ppo_s"],
        "ppo_steps": found.ppo_steps,
        "episode_returns": found.episode_returns,
        "episode_infos": env.episode_infos,
        "rollout": found.steps,
        "theta_from": found.chosen,
        "utility_samples": len(found.utility.y) if found.utility is not None else None,
        "utility_recheck": found.recheck,
        "rollout_return": found.rollout_return,
        "best_episode_return": found.best.ret if found.best is not None else None,
        "zeroed_share": found.zeroed_share,
        "utility_evals": env.utility_evals,
        "utility_cache_hits": env.utility_hits,
        "recovery": recovery,
        "healing": healing,
        "val_acc_before_recovery": pre_recovery_acc,
        "action_encoding": (
            f"MultiDiscrete([{len(report.top)}] + [2]*{env.spec.G} + [{env.spec.s_levels}])"
        ),
    }
