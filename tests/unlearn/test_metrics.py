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
