"""Unlearning metrics and audits: RA, FA, FR, MIA, backdoor success, relearn time, overhead.

* RA, FA, FR: the paper's equations (Sec. V-B) on D_r and D_u *as the clients hold them*
  (a triggered sample carries the target label, a flipped one its wrong label).
* ``fa_protocol`` (docs/reproducing.md, "Evaluation protocol"): backdoor -> attack success on the
  *triggered test set* (true label != target); class -> accuracy on the test images of the forgotten
  classes; label_flip / clean -> FA. ``fa_clean`` is the accuracy on D_u's clean images and true
  labels.
* MIA: members = remaining training samples, non-members = held-out test samples. A 1-D
  threshold attack is fitted on the per-sample loss (loss-threshold MIA) and on the prediction
  entropy (the entropy feature of the SVC MIA used in unlearning papers; a linear SVC on one
  feature is a threshold), then applied to D_u: ``mia_*_member_rate`` is the share of D_u
  called "member"; ``mia_*_auc`` the AUC separating D_u from non-members (0.5: no trace).
* Calibrated, class-matched MIA (the protocol with power, docs/reproducing.md): the target set
  is D_u (capped), the non-members are held-out test images of the *same classes in the same
  proportions*, transformed as D_u's samples were (trigger + target label, flip marker +
  flipped label), never trained on by anyone. Score: the logit-scaled confidence of the held
  label, ``phi = log p - log(1 - p)``, minus the mean ``phi`` of reference (shadow) models
  trained without D_u and without the non-members (the reference-model / offline-LiRA
  difficulty calibration). ``mia_ref_auc`` separates D_u from the non-members (0.5: no trace),
  ``mia_ref_tpr_1fpr`` is the share of D_u above the non-members' 99th percentile (0.01: no
  trace). ``mia_cm_loss_auc`` is the uncalibrated loss attack on the same two sets.
* Canary MIA (docs/reproducing.md): the same reference-model attack on D_u's membership
  canaries (``data.poison.canaries``: clean samples with a random wrong label, duplicated in
  their client's data so the model memorises them) against their held-out twins (same true
  class, relabelled alike, never trained on). ``mia_canary_auc`` / ``mia_canary_tpr_1fpr``
  (calibrated), ``mia_canary_loss_auc`` (uncalibrated loss), ``mia_canary_n`` canaries scored.
  The canaries are left out of the class-matched sets above (their labels are random).
* ``ra_clean``: RA on D_r's clean images and true labels (``ra`` uses the labels as held).
* relearn time: rounds of fine-tuning on D_u (one local epoch each, the run's SGD settings)
  until FA reaches ``relearn_target`` x the original model's FA.
* communication overhead ``C = a * C_t + b * E[A_g]`` with C_t in link seconds (bytes are
  reported too) and E[A_g] the mean AoI in seconds over the sensitive layers' groups.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scaleflu.fl.data import ImageData, PoisonInfo, poisoned_like
from scaleflu.fl.device import infer_batch, infer_slices
from scaleflu.fl.fedavg import LocalConfig, train_client

log = logging.getLogger(__name__)


@torch.no_grad()
def predict(model: nn.Module, data: ImageData, batch_size: int | None = None) -> torch.Tensor:
    """Softmax probabilities of ``model`` on every sample of ``data`` (eval mode; passes of
    ``batch_size`` images, None: the device's, :func:`scaleflu.fl.device.infer_batch`)."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device  # fl.device: computed there, returned on the CPU
    out = []
    for sl in infer_slices(len(data), infer_batch(dev, batch_size)):
        out.append(F.softmax(model(data.inputs(sl).to(dev)), dim=1).cpu())
    model.train(was)
    if not out:
        return torch.empty(0, data.num_classes)
    return torch.cat(out)


def accuracy_from_probs(probs: torch.Tensor, labels: torch.Tensor) -> float | None:
    """Share of argmax predictions equal to ``labels`` (None on an empty set)."""
    if len(labels) == 0:
        return None
    return float((probs.argmax(1) == labels).float().mean())


def forgetting_rate(p_new: torch.Tensor, p_old: torch.Tensor, eps: float = 1e-12) -> float:
    """FR = 1 - mean_{D_u} P_new(y|x) / P_old(y|x) (the paper's Eq., authors' semantics)."""
    if len(p_new) == 0:
        return float("nan")
    return float(1.0 - (p_new / p_old.clamp_min(eps)).mean())


def true_label_probs(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """P(y|x) for the given labels."""
    return probs.gather(1, labels.view(-1, 1)).flatten()


def _losses(probs: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    return (-true_label_probs(probs, labels).clamp_min(1e-12).log()).numpy()


def _entropy(probs: torch.Tensor) -> np.ndarray:
    p = probs.clamp_min(1e-12)
    return (-(p * p.log()).sum(1)).numpy()


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Probability that a random ``pos`` score exceeds a random ``neg`` score (ties half)."""
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    sorted_v = allv[order]
    i = 0
    while i < len(allv):  # average ranks of ties
        j = i
        while j + 1 < len(allv) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    r_pos = ranks[: len(pos)].sum()
    return float((r_pos - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def logit_confidence(probs: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    """LiRA's per-sample statistic: log p_y - log(1 - p_y) of the given labels."""
    p = true_label_probs(probs, labels).double().clamp(1e-12, 1 - 1e-12)
    return (p.log() - (1 - p).log()).numpy()


def tpr_at_fpr(pos: np.ndarray, neg: np.ndarray, fpr: float = 0.01) -> float:
    """Share of ``pos`` scoring above the (1 - fpr) quantile of ``neg`` (higher = member)."""
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    thr = float(np.quantile(neg, 1.0 - fpr, method="higher"))
    return float((pos > thr).mean())


def calibrated_mia(
    phi_target: np.ndarray,
    phi_nonmembers: np.ndarray,
    ref_target: np.ndarray,
    ref_nonmembers: np.ndarray,
    fpr: float = 0.01,
) -> dict[str, float]:
    """Reference-model attack: score = phi(model) - phi(reference); AUC and TPR at ``fpr``."""
    if len(ref_target) != len(phi_target) or len(ref_nonmembers) != len(phi_nonmembers):
        raise ValueError("reference scores must align with the target and non-member sets")
    pos = phi_target - ref_target
    neg = phi_nonmembers - ref_nonmembers
    return {"auc": auc(pos, neg), "tpr": tpr_at_fpr(pos, neg, fpr)}


def class_matched_sets(
    train: ImageData,
    clean_labels: torch.Tensor,
    forget_idx: np.ndarray,
    poison: PoisonInfo,
    pool: ImageData,
    cap: int,
    seed: int,
) -> tuple[ImageData, ImageData]:
    """The calibrated MIA's target set (D_u, capped) and its class-matched non-members.

    D_u's samples are grouped by (true class, kind: clean | backdoor | label_flip); every
    group gets non-members from ``pool`` (held-out images of that true class, transformed as
    the kind was by :func:`scaleflu.fl.data.poisoned_like`) in the same proportion ``f``, the
    largest that the pool and ``cap`` allow; D_u is subsampled with the same ``f`` when
    ``|D_u| > cap``, so both sets have the same class and kind mixture.
    """
    target_idx, non = class_matched_indices(
        train, clean_labels, forget_idx, poison, pool, cap, seed
    )
    return train.subset(target_idx), non


def class_matched_indices(
    train: ImageData,
    clean_labels: torch.Tensor,
    forget_idx: np.ndarray,
    poison: PoisonInfo,
    pool: ImageData,
    cap: int,
    seed: int,
) -> tuple[np.ndarray, ImageData]:
    """:func:`class_matched_sets` with the target set as training indices (for the audit, which
    needs to know which shadow federations held each target sample)."""
    forget_idx = np.asarray(forget_idx, dtype=np.int64)
    if len(forget_idx) == 0:
        return forget_idx, pool.subset(np.empty(0, np.int64))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 45]))
    true = clean_labels[torch.as_tensor(forget_idx)].numpy()
    kind = np.where(
        np.isin(forget_idx, poison.backdoor_indices),
        "backdoor",
        np.where(np.isin(forget_idx, poison.flipped_indices), "label_flip", "clean"),
    )
    pool_labels = pool.labels.numpy()
    groups = sorted({(int(c), str(k)) for c, k in zip(true, kind, strict=True)})
    need = {g: int(((true == g[0]) & (kind == g[1])).sum()) for g in groups}
    per_class: dict[int, int] = {}
    for (c, _), n in need.items():
        per_class[c] = per_class.get(c, 0) + n
    avail = {c: int((pool_labels == c).sum()) for c in per_class}
    f = min(1.0, cap / len(forget_idx), *(avail[c] / per_class[c] for c in per_class))
    targets, nons = [], []
    for c, k in groups:
        n = max(1, int(round(need[(c, k)] * f)))
        members = forget_idx[(true == c) & (kind == k)]
        targets.append(np.sort(rng.choice(members, size=min(n, len(members)), replace=False)))
        cand = np.flatnonzero(pool_labels == c)
        pick = np.sort(rng.choice(cand, size=min(n, len(cand)), replace=False))
        nons.append(poisoned_like(pool.subset(pick), poison, k, seed))
    non = ImageData(
        torch.cat([d.pixels for d in nons]),
        torch.cat([d.labels for d in nons]),
        pool.mean,
        pool.std,
        pool.num_classes,
        pool.name,
    )
    return np.concatenate(targets), non


def fit_threshold(members: np.ndarray, nonmembers: np.ndarray) -> float:
    """Threshold t maximising balanced accuracy of "member if score <= t" (low loss = member)."""
    cand = np.unique(np.concatenate([members, nonmembers]))
    if len(cand) > 512:
        cand = np.quantile(cand, np.linspace(0, 1, 512))
    best_t, best = float(cand[0]), -1.0
    for t in cand:
        bal = 0.5 * ((members <= t).mean() + (nonmembers > t).mean())
        if bal > best:
            best, best_t = bal, float(t)
    return best_t


def mia(
    scores_members: np.ndarray, scores_nonmembers: np.ndarray, scores_target: np.ndarray
) -> dict[str, float]:
    """Threshold MIA fitted on members/non-members and applied to the target set."""
    t = fit_threshold(scores_members, scores_nonmembers)
    return {
        "member_rate": float((scores_target <= t).mean()) if len(scores_target) else float("nan"),
        "auc": auc(-scores_target, -scores_nonmembers),
        "threshold": t,
    }


def relearn_rounds(
    model: nn.Module,
    state: Mapping[str, torch.Tensor],
    data: ImageData,
    forget_idx: np.ndarray,
    target_fa: float,
    local: LocalConfig,
    seed: int,
    max_rounds: int,
) -> int | None:
    """Rounds of one-epoch fine-tuning on D_u until FA >= ``target_fa`` (None: not reached)."""
    if len(forget_idx) == 0 or max_rounds < 1:
        return None
    forget = data.subset(forget_idx)
    cur = {k: v.clone() for k, v in state.items()}
    model.load_state_dict(cur)
    if (accuracy_from_probs(predict(model, forget), forget.labels) or 0.0) >= target_fa:
        return 0
    one = LocalConfig(1, local.lr, local.batch_size, local.momentum)
    for r in range(1, max_rounds + 1):
        cur = train_client(model, cur, forget_idx, data, one, seed, 10_000 + r, 0)
        model.load_state_dict(cur)
        if (accuracy_from_probs(predict(model, forget), forget.labels) or 0.0) >= target_fa:
            return r
    return None


def _target_mia(
    model: nn.Module, target: ImageData, nonmembers: ImageData, reference: Any
) -> tuple[float | None, float | None, float | None]:
    """Loss-attack AUC of ``target`` against ``nonmembers``, then with ``reference`` (the
    reference models' confidences, :func:`calibrated_mia`) the calibrated AUC and TPR at 1 % FPR
    (None without a reference)."""
    p_t = predict(model, target)
    p_n = predict(model, nonmembers)
    loss_auc = auc(-_losses(p_t, target.labels), -_losses(p_n, nonmembers.labels))
    if reference is None:
        return loss_auc, None, None
    cal = calibrated_mia(
        logit_confidence(p_t, target.labels), logit_confidence(p_n, nonmembers.labels), *reference
    )
    return loss_auc, cal["auc"], cal["tpr"]


def evaluate_model(
    model: nn.Module,
    *,
    test: ImageData,
    remaining: ImageData,
    forget: ImageData,
    forget_clean: ImageData,
    nonmembers: ImageData,
    members: ImageData,
    protocol: str,
    p_old_forget: torch.Tensor,
    triggered: ImageData | None,
    target_label: int | None,
    classes: list[int],
    remaining_clean: ImageData | None = None,
    mia_target: ImageData | None = None,
    mia_nonmembers: ImageData | None = None,
    mia_reference: tuple[np.ndarray, np.ndarray] | None = None,
    canary_target: ImageData | None = None,
    canary_nonmembers: ImageData | None = None,
    canary_reference: tuple[np.ndarray, np.ndarray] | None = None,
    canary_min: int = 1,
) -> dict[str, Any]:
    """Every accuracy-type metric and the MIAs of ``model`` (see the module docstring).

    ``mia_target`` / ``mia_nonmembers``: the class-matched MIA sets; ``mia_reference``: the
    reference models' mean ``phi`` on them (None: no calibrated attack). ``canary_*``: D_u's
    membership canaries, their held-out twins and the references' ``phi`` on both; the canary
    AUCs are reported when there are at least ``canary_min`` of them (``mia_canary_n`` always).
    """
    p_test = predict(model, test)
    p_rem = predict(model, remaining)
    p_forget = predict(model, forget)
    p_fclean = predict(model, forget_clean)
    out: dict[str, Any] = {
        "test_acc": accuracy_from_probs(p_test, test.labels),
        "ra": accuracy_from_probs(p_rem, remaining.labels),
        "fa": accuracy_from_probs(p_forget, forget.labels),
        "fr": forgetting_rate(true_label_probs(p_forget, forget.labels), p_old_forget),
        "fa_clean": accuracy_from_probs(p_fclean, forget_clean.labels),
        "backdoor_asr": None,
        "fa_class_test": None,
        "ra_class_test": None,
    }
    if triggered is not None and target_label is not None and len(triggered):
        p_trig = predict(model, triggered)
        out["backdoor_asr"] = float((p_trig.argmax(1) == target_label).float().mean())
    if classes:
        in_cls = torch.isin(test.labels, torch.as_tensor(classes))
        out["fa_class_test"] = accuracy_from_probs(p_test[in_cls], test.labels[in_cls])
        out["ra_class_test"] = accuracy_from_probs(p_test[~in_cls], test.labels[~in_cls])
    if protocol == "backdoor":
        out["fa_protocol"] = out["backdoor_asr"]
    elif protocol == "class":
        out["fa_protocol"] = out["fa_class_test"]
    else:
        out["fa_protocol"] = out["fa"]
    p_mem = predict(model, members)
    p_non = predict(model, nonmembers)
    loss = mia(
        _losses(p_mem, members.labels),
        _losses(p_non, nonmembers.labels),
        _losses(p_forget, forget.labels),
    )
    ent = mia(_entropy(p_mem), _entropy(p_non), _entropy(p_forget))
    out["ra_clean"] = None
    if remaining_clean is not None:
        out["ra_clean"] = accuracy_from_probs(
            predict(model, remaining_clean), remaining_clean.labels
        )
    out.update(mia_cm_loss_auc=None, mia_ref_auc=None, mia_ref_tpr_1fpr=None)
    if mia_target is not None and mia_nonmembers is not None and len(mia_target):
        out["mia_cm_loss_auc"], out["mia_ref_auc"], out["mia_ref_tpr_1fpr"] = _target_mia(
            model, mia_target, mia_nonmembers, mia_reference
        )
    out.update(mia_canary_loss_auc=None, mia_canary_auc=None, mia_canary_tpr_1fpr=None)
    n_can = 0 if canary_target is None else len(canary_target)
    out["mia_canary_n"] = n_can
    if canary_nonmembers is not None and n_can and n_can >= canary_min:
        assert canary_target is not None
        out["mia_canary_loss_auc"], out["mia_canary_auc"], out["mia_canary_tpr_1fpr"] = _target_mia(
            model, canary_target, canary_nonmembers, canary_reference
        )
    out.update(
        mia_loss_member_rate=loss["member_rate"],
        mia_loss_auc=loss["auc"],
        mia_entropy_member_rate=ent["member_rate"],
        mia_entropy_auc=ent["auc"],
    )
    return out


def communication_overhead(link_s: float, mean_aoi_s: float, a: float, b: float) -> float:
    """C = a * C_t + b * E[A_g], both in seconds."""
    return a * link_s + b * mean_aoi_s
