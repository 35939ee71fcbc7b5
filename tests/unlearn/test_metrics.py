"""Metric helpers on constructed inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.unlearn.base import UnlearnResult
from scaleflu.unlearn.metrics import auc, fit_threshold, forgetting_rate, mia


def test_auc_and_threshold() -> None:
    assert auc(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 1.0
    assert auc(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == pytest.approx(0.5)
    t = fit_threshold(np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0]))
    assert 0.3 <= t < 1.0
    out = mia(np.array([0.1, 0.2]), np.array([2.0, 3.0]), np.array([0.15, 2.5]))
    assert out["member_rate"] == 0.5 and out["auc"] == pytest.approx(0.75)


def test_forgetting_rate() -> None:
    old = torch.tensor([0.8, 0.5])
    assert forgetting_rate(old.clone(), old) == pytest.approx(0.0)
    assert forgetting_rate(torch.tensor([0.4, 0.0]), old) == pytest.approx(0.75)


def test_result_json_round_trip() -> None:
    r = UnlearnResult(
        "x", None, {"text": "client:1"}, "clean", "/r", {"fa": float("nan")}, {}, {}, {}
    )
    d = r.to_dict()
    assert d["metrics"]["fa"] is None and d["schema"] == 1
    assert UnlearnResult.from_dict(d).method == "x"


def test_calibrated_mia_and_tpr_at_low_fpr() -> None:
    """phi - phi_ref separates members that the raw score cannot; TPR at 1 % FPR on the tail."""
    from scaleflu.unlearn.metrics import calibrated_mia, logit_confidence, tpr_at_fpr

    rng = np.random.default_rng(0)
    diff_t = rng.normal(0, 3, 400)  # per-sample difficulty, shared by model and reference
    diff_n = rng.normal(0, 3, 400)
    # members gain +1 over their reference; raw scores overlap, calibrated ones do not
    out = calibrated_mia(diff_t + 1.0, diff_n, diff_t, diff_n)
    assert out["auc"] == 1.0 and out["tpr"] == 1.0
    assert auc(diff_t + 1.0, diff_n) < 0.7
    same = calibrated_mia(diff_t, diff_n, diff_t, diff_n)  # the reference itself: no trace
    assert same["auc"] == pytest.approx(0.5) and same["tpr"] == 0.0
    neg = np.arange(100.0)
    assert tpr_at_fpr(np.array([98.5, 99.5, 50.0]), neg) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="align"):
        calibrated_mia(diff_t, diff_n, diff_t[:3], diff_n)
    p = torch.tensor([[0.9, 0.1], [0.5, 0.5]])
    phi = logit_confidence(p, torch.tensor([0, 1]))
    assert phi == pytest.approx([np.log(9.0), 0.0])


def test_class_matched_sets_match_classes_and_kinds() -> None:
    """Non-members: same true classes and kinds in the same proportions, transformed alike."""
    from scaleflu.fl.data import ImageData, PoisonInfo
    from scaleflu.unlearn.metrics import class_matched_sets

    def data(labels: list[int]) -> ImageData:
        lab = torch.tensor(labels)
        return ImageData(torch.zeros(len(lab), 1, 8, 8, dtype=torch.uint8), lab, (0.5,), (0.5,), 4)

    clean = data([0, 1, 1, 2, 2, 2, 3, 3])
    train = clean.copy()
    train.labels[torch.tensor([1, 2])] = 3  # backdoor: target 3
    train.labels[5] = 3  # label flip (shift): 2 -> 3
    poison = PoisonInfo(np.array([1, 2]), np.array([5]), 3, 2, {}, "shift", 2)
    pool = data([0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3])
    target, non = class_matched_sets(
        train, clean.labels, np.array([1, 2, 3, 4, 5]), poison, pool, 10, 0
    )
    assert len(target) == len(non) == 5
    # backdoored class-1 samples -> triggered class-1 pool images with the target label
    assert sorted(non.labels.tolist()) == sorted(target.labels.tolist()) == [2, 2, 3, 3, 3]
    assert int((non.pixels[:, 0, -2:, -2:] == 255).all(-1).all(-1).sum()) == 2  # triggers
    assert int((non.pixels[:, 0, :2, :2] == 255).all(-1).all(-1).sum()) == 1  # flip marker
    t2, n2 = class_matched_sets(train, clean.labels, np.array([3, 4, 5]), poison, pool, 2, 0)
    assert len(t2) == len(n2) == 2  # capped: both sides shrink together
