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
from typing import Any

import torch

from scaleflu.config import ConfigError
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from scaleflu.unlearn.env import EnvSpec, EpisodeRecord, SparsifyEnv
from scaleflu.unlearn.heal import _selection_and_heal, heal
from scaleflu.unlearn.metrics import accuracy_from_probs, predict
from scaleflu.unlearn.search import _greedy, _ppo, _Utility, rollout, sb3_startup
from scaleflu.unlearn.sensitivity import phase_one

log = logging.getLogger(__name__)


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
