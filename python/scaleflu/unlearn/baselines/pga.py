"""PGA (Halimi et al., 2022, "Federated Unlearning: How to Efficiently Erase a Client in FL?").

Follows IBM/federated-unlearning, with its L2 confusion fixed:

1. Reference model: the (data-size weighted) average of the *other* clients' local models of
   the last round, ``Theta_ref`` (the global model without the leaving clients' contribution;
   when no leaving client took part in that round it is the final global model). For class
   and sample requests no client leaves, so the reference is the final global model.
2. Radius: ``delta = radius_fraction * mean_k ||Theta_ref - Theta_rand,k||_2`` over
   ``radius_models`` freshly initialised models (the paper: one third of the mean distance to
   random models). The reference code computes a *squared* distance, thresholds on it and
   projects with its square root; here every distance is the plain L2 norm of the parameter
   vector and the projection radius is exactly ``delta``.
3. Projected gradient ascent on D_u (SGD on ``-loss``, gradient-norm clipping), starting from
   ``Theta_ref``; after every step the parameters are projected back into the ball
   ``||Theta - Theta_ref||_2 <= delta``. Stopping (``stop_rule``), checked after a step and
   never before the first: ``reference`` (IBM/federated-unlearning) stops once the L2
   distance to the target client's last local model exceeds ``stop_distance`` (the reference
   code's ``distance_threshold``; null: ``stop_distance_ratio`` times that distance at the
   start, the reference notebook's ratio); ``accuracy`` stops once the accuracy on D_u (as
   the clients hold it) falls below ``stop_acc``. Without a stored target model the ascent
   runs ``epochs`` passes, bounded by the projection.
4. ``post_rounds`` normal FedAvg rounds with the remaining clients (run's local settings).

D_u is treated as one virtual client (for several targets, their forget sets pooled). Link cost:
one reference download and one model upload per target client, then the FedAvg rounds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_, parameters_to_vector, vector_to_parameters
from tqdm import tqdm

from scaleflu.fl.aggregation import aggregate
from scaleflu.fl.device import cpu_state
from scaleflu.fl.fedavg import client_batches, derive_seed
from scaleflu.fl.history import state_bytes
from scaleflu.fl.models import build_model
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult, nonfinite_tensors
from scaleflu.unlearn.baselines.aoi_trace import RecordingAoITracker, annotate
from scaleflu.unlearn.baselines.common import baseline_config, round_link
from scaleflu.unlearn.metrics import accuracy_from_probs, predict

log = logging.getLogger(__name__)

State = dict[str, torch.Tensor]


def l2_distance(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Plain (not squared) L2 distance between two models' parameter vectors."""
    with torch.no_grad():
        return float(
            (parameters_to_vector(a.parameters()) - parameters_to_vector(b.parameters())).norm()
        )


def project_to_ball(model: torch.nn.Module, center: torch.Tensor, radius: float) -> float:
    """Project the parameters onto ``||theta - center||_2 <= radius``; the distance after."""
    with torch.no_grad():
        vec = parameters_to_vector(model.parameters())
        diff = vec - center
        dist = float(diff.norm())
        if dist > radius:
            vector_to_parameters(center + diff * (radius / dist), model.parameters())
            return radius
        return dist


def reference_state(ctx: UnlearnContext) -> tuple[State, dict[str, Any]]:
    """Theta_ref: weighted mean of the other participants' local models of the last round."""
    history = ctx.run.history
    T = history.last_completed_round()
    leaving = set(ctx.request.removed_clients)
    parts = history.participants(T)
    if not leaving.intersection(parts) or not history.has_updates(T):
        info = {"round": T, "kind": "final global model", "clients": parts}
        return ctx.original_state(), info
    others = [n for n in parts if n not in leaving]
    if not others:
        info = {"round": T, "kind": "global model of round T (no other participant)"}
        return history.global_model(T), info
    sizes = history.data_sizes(T)
    models = {n: history.client_model(T, n) for n in others}
    info = {"round": T, "kind": "mean of the other clients' local models", "clients": others}
    return aggregate(models, {n: sizes[n] for n in others}), info


def target_models(ctx: UnlearnContext) -> dict[int, State]:
    """The local model of each client holding D_u in the last round it took part in (stored).

    The reference code stops the ascent once the model is far from the erased party's local
    model; clients whose local model the history does not keep are left out.
    """
    history = ctx.run.history
    out: dict[int, State] = {}
    stored = [t for t in history.rounds() if history.has_updates(t)]
    for n in ctx.request.targets:
        seen = [t for t in stored if n in history.participants(t)]
        if seen:
            out[n] = history.client_model(seen[-1], n)
    if not out:
        log.warning("pga: no stored local model of a target client; no distance stop")
    return out


def pga_radius(ctx: UnlearnContext, ref: torch.nn.Module, models: int, fraction: float) -> float:
    """delta = fraction x mean plain L2 distance of the reference to freshly initialised models."""
    dists = []
    args = ctx.run.setup.model_args()
    for k in range(models):
        torch.manual_seed(derive_seed(ctx.seed, 71, k))
        dists.append(l2_distance(ref, build_model(*args)))
    return fraction * float(np.mean(dists))


class PGAUnlearner:
    """Projected gradient ascent in an L2 ball around the reference, then FedAvg rounds."""

    name = "pga"

    def __init__(self, **overrides: Any) -> None:
        """Keyword overrides of ``baselines.pga`` (lr, epochs, radius_fraction, stop_acc, ...)."""
        self.overrides = overrides

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        """Reference, radius, PGA with early stop, post-training rounds; measure."""
        hp = baseline_config("pga", self.overrides, ctx.cfg)
        t0 = time.perf_counter()
        ref_state, ref_info = reference_state(ctx)
        dev = ctx.device  # fl.device: the ascent runs there; states come back to the CPU
        model = ctx.new_model(ref_state).to(dev)
        ref_model = ctx.new_model(ref_state)
        radius = (
            float(hp.radius)
            if hp.radius is not None
            else pga_radius(ctx, ref_model, int(hp.radius_models), float(hp.radius_fraction))
        )
        center = parameters_to_vector(ref_model.parameters()).detach().to(dev, copy=True)
        data = ctx.run.setup.train
        forget_idx = torch.as_tensor(ctx.forget_idx, dtype=torch.int64)
        check = ctx.forget
        cap = int(hp.check_samples)
        if len(check) > cap:
            rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, 72]))
            check = check.subset(np.sort(rng.choice(len(check), size=cap, replace=False)))
        stop_acc = float(hp.stop_acc)
        rule = str(hp.stop_rule)
        stop_distance = hp.stop_distance
        targets = target_models(ctx) if rule == "reference" else {}
        target_vecs = {
            n: parameters_to_vector(ctx.new_model(st).parameters()).detach().to(dev)
            for n, st in targets.items()
        }
        start_dist = min((float((center - v).norm()) for v in target_vecs.values()), default=None)
        threshold: float | None = None
        if target_vecs:
            threshold = (
                float(stop_distance)
                if stop_distance is not None
                else float(hp.stop_distance_ratio) * float(start_dist or 0.0)
            )
        opt = torch.optim.SGD(model.parameters(), lr=float(hp.lr), momentum=float(hp.momentum))
        bs = hp.batch_size or ctx.cfg.fl.batch_size  # None: full batch
        clip = float(hp.clip_grad)
        steps, stopped, dist, reason = 0, False, 0.0, "epochs done"
        acc = accuracy_from_probs(predict(model, check), check.labels) or 0.0
        acc_trace = [acc]
        target_dist: float | None = None
        torch.manual_seed(derive_seed(ctx.seed, 73))
        batches = client_batches(
            len(forget_idx), int(hp.epochs), int(bs) if bs else None, ctx.seed, 0, 73
        )
        model.train()
        nonfinite_at: int | None = None
        for pos in tqdm(batches, desc="PGA", unit="step", disable=not ctx.progress, leave=False):
            idx = forget_idx[torch.as_tensor(pos)]
            opt.zero_grad(set_to_none=True)
            # the last finite model: an ascent whose loss or step overflows stops there
            last = {k: v.detach().clone() for k, v in model.state_dict().items()}
            loss = -F.cross_entropy(model(data.inputs(idx).to(dev)), data.labels[idx].to(dev))
            if not bool(torch.isfinite(loss)):
                nonfinite_at = steps + 1
            else:
                loss.backward()
                if clip > 0:
                    norm = clip_grad_norm_(model.parameters(), clip)
                    if not bool(torch.isfinite(norm)):
                        nonfinite_at = steps + 1
                if nonfinite_at is None:
                    opt.step()
                    dist = project_to_ball(model, center, radius)
                    if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
                        nonfinite_at = steps + 1
            if nonfinite_at is not None:
                # the cross-entropy of a collapsed model overflows: keep the last finite model
                model.load_state_dict(last)
                dist = project_to_ball(model, center, radius)
                stopped = True
                reason = (
                    f"non-finite ascent step {nonfinite_at} (loss or gradient overflow): "
                    f"kept the model after step {steps}"
                )
                break
            steps += 1
            # The stop is checked after a step, never before the first (the reference code).
            if rule == "accuracy":
                acc = accuracy_from_probs(predict(model, check), check.labels) or 0.0
                acc_trace.append(acc)
                model.train()
                if acc < stop_acc:
                    stopped, reason = True, f"accuracy on D_u {acc:.3f} < {stop_acc}"
                    break
            elif target_vecs:
                with torch.no_grad():
                    vec = parameters_to_vector(model.parameters())
                    target_dist = min(float((vec - v).norm()) for v in target_vecs.values())
                if threshold is not None and target_dist > threshold:
                    stopped = True
                    reason = f"distance to the target's model {target_dist:.4g} > {threshold:.4g}"
                    break
        if rule != "accuracy":
            acc = accuracy_from_probs(predict(model, check), check.labels) or 0.0
            acc_trace.append(acc)
        pga_wall = time.perf_counter() - t0
        unlearned = cpu_state(model.state_dict())
        theta = ctx.original_state()
        aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
        mb = state_bytes(unlearned)
        n_targets = max(1, len(ctx.request.targets))
        nbytes, link_s = round_link(ctx, n_targets * mb, mb, n_targets)
        # The unlearned model replaces Theta at the clients: one update of the changed groups.
        aoi.full_round(link_s, changed_groups(theta, unlearned, ctx.groups, ctx.link_tol))
        trace = [float(aoi.total()["aoi_s"])]
        post = int(hp.post_rounds)
        pre_post = ctx.evaluate(unlearned, relearn=False) if hp.report_pre_post else None
        state, cost = unlearned, None
        if post > 0:
            T = ctx.run.history.last_completed_round()
            state, cost = ctx.fedavg_rounds(unlearned, post, T + 1, aoi=aoi, desc="PGA post")
            nbytes += cost.bytes
            link_s += cost.link_s
            trace.append(float(aoi.total()["aoi_s"]))
        wall = time.perf_counter() - t0
        self.state = state
        failure = None
        if nonfinite_tensors(state):
            # say where it went wrong: the ascent's model is finite by construction above
            where = "the ascent" if nonfinite_tensors(unlearned) else f"the {post} post rounds"
            failure = (
                f"non-finite after {where} (ascent: {steps} steps, {reason}; the post rounds "
                "train from the ascended model with the run's learning rate)"
            )
        res = ctx.make_result(
            "pga",
            state,
            wall_s=wall,
            bytes_=nbytes,
            link_s=link_s,
            fl_rounds=(cost.rounds if cost else 0),
            aoi=aoi,
            steps=steps,
            sum_aoi_trace=trace,
            details={
                "reference": ref_info,
                "radius": radius,
                "radius_norm": "plain L2 (not squared)",
                "final_distance": dist,
                "ascent_steps": steps,
                "early_stopped": stopped,
                "nonfinite_step": nonfinite_at,
                "stop_rule": rule,
                "stop_reason": reason,
                "target_models": sorted(int(n) for n in targets),
                "target_distance_start": start_dist,
                "target_distance": target_dist,
                "stop_threshold": threshold,
                "forget_acc_trace": acc_trace,
                "pga_wall_s": pga_wall,
                "post_rounds": post,
                "metrics_before_post_rounds": pre_post,
                "hyper_parameters": hp,
                "failure": failure,
            },
        )
        return annotate(res, aoi)
