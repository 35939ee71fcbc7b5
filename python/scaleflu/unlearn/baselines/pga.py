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
   ``||Theta - Theta_ref||_2 <= delta``. Early stop as soon as the accuracy on D_u (as the
   clients hold it) falls below ``stop_acc``.
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

from scaleflu.fl.fedavg import aggregate, client_batches, derive_seed
from scaleflu.fl.history import state_bytes
from scaleflu.fl.models import build_model
from scaleflu.unlearn.aoi import AoITracker, changed_groups
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
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
        model = ctx.new_model(ref_state)
        ref_model = ctx.new_model(ref_state)
        radius = (
            float(hp["radius"])
            if hp.get("radius") is not None
            else pga_radius(ctx, ref_model, int(hp["radius_models"]), float(hp["radius_fraction"]))
        )
        center = parameters_to_vector(ref_model.parameters()).detach().clone()
        data = ctx.run.setup.train
        forget_idx = torch.as_tensor(ctx.forget_idx, dtype=torch.int64)
        check = ctx.forget
        cap = int(hp["check_samples"])
        if len(check) > cap:
            rng = np.random.default_rng(np.random.SeedSequence([ctx.seed, 72]))
            check = check.subset(np.sort(rng.choice(len(check), size=cap, replace=False)))
        stop_acc = float(hp["stop_acc"])
        opt = torch.optim.SGD(
            model.parameters(), lr=float(hp["lr"]), momentum=float(hp["momentum"])
        )
        bs = hp["batch_size"] or ctx.cfg["fl"]["batch_size"]  # None: full batch
        clip = float(hp["clip_grad"])
        steps, stopped, dist = 0, False, 0.0
        acc = accuracy_from_probs(predict(model, check), check.labels) or 0.0
        acc_trace = [acc]
        torch.manual_seed(derive_seed(ctx.seed, 73))
        batches = client_batches(
            len(forget_idx), int(hp["epochs"]), int(bs) if bs else None, ctx.seed, 0, 73
        )
        model.train()
        for pos in tqdm(batches, desc="PGA", unit="step", disable=not ctx.progress, leave=False):
            if acc < stop_acc:
                stopped = True
                break
            idx = forget_idx[torch.as_tensor(pos)]
            opt.zero_grad(set_to_none=True)
            loss = -F.cross_entropy(model(data.inputs(idx)), data.labels[idx])
            loss.backward()
            if clip > 0:
                clip_grad_norm_(model.parameters(), clip)
            opt.step()
            dist = project_to_ball(model, center, radius)
            steps += 1
            acc = accuracy_from_probs(predict(model, check), check.labels) or 0.0
            acc_trace.append(acc)
            model.train()
        stopped = stopped or acc < stop_acc
        pga_wall = time.perf_counter() - t0
        unlearned = {k: v.detach().clone() for k, v in model.state_dict().items()}
        theta = ctx.original_state()
        aoi = RecordingAoITracker.wrap(AoITracker.from_history(ctx.run.history))
        mb = state_bytes(unlearned)
        n_targets = max(1, len(ctx.request.targets))
        nbytes, link_s = round_link(ctx, n_targets * mb, mb, n_targets)
        # The unlearned model replaces Theta at the clients: one update of the changed groups.
        aoi.full_round(link_s, changed_groups(theta, unlearned, ctx.groups, ctx.link_tol))
        trace = [float(aoi.total()["aoi_s"])]
        post = int(hp["post_rounds"])
        pre_post = ctx.evaluate(unlearned, relearn=False) if hp.get("report_pre_post") else None
        state, cost = unlearned, None
        if post > 0:
            T = ctx.run.history.last_completed_round()
            state, cost = ctx.fedavg_rounds(unlearned, post, T + 1, aoi=aoi, desc="PGA post")
            nbytes += cost.bytes
            link_s += cost.link_s
            trace.append(float(aoi.total()["aoi_s"]))
        wall = time.perf_counter() - t0
        self.state = state
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
                "forget_acc_trace": acc_trace,
                "pga_wall_s": pga_wall,
                "post_rounds": post,
                "metrics_before_post_rounds": pre_post,
                "hyper_parameters": hp,
            },
        )
        return annotate(res, aoi)
