"""The per-example membership audit (offline LiRA on shadow federations, ``unlearn.audit``).

The statistics on made-up numbers, then the audit on the small canary run (its shadows trained
once, kept in the run folder and reloaded): it separates the trained model from Retrain, whose
never-seen canaries look like their never-seen twins.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from scaleflu.config import ConfigError
from scaleflu.unlearn import audit
from scaleflu.unlearn.metrics import auc, logit_confidence
from tiny_run_helpers import needs_fmnist

SHADOWS = 4  # the smallest audit (2 OUT shadows per canary): the test's CPU budget


def test_every_example_is_held_by_half_the_shadows() -> None:
    m = audit.inclusion_masks(1000, 8, seed=3)
    assert m.shape == (8, 1000) and (m.sum(0) == 4).all()
    assert np.array_equal(m, audit.inclusion_masks(1000, 8, seed=3))
    assert not np.array_equal(m, audit.inclusion_masks(1000, 8, seed=4))
    # shadows differ from each other: each holds about half the examples
    assert (np.abs(m.mean(1) - 0.5) < 0.06).all()


def test_statistics_agree_with_the_reference_implementations() -> None:
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1.0, 1.0, 60), rng.normal(0.0, 1.0, 80)
    neg[:5] = pos[:5]  # ties count half
    assert audit.fast_auc(pos, neg) == pytest.approx(auc(pos, neg), abs=1e-12)
    # numpy's average ranks are scipy's, ties and all (scipy stays out of unlearning)
    from scipy.stats import rankdata

    tied = rng.integers(0, 7, 200).astype(float)
    for x in (np.concatenate([pos, neg]), tied, np.array([2.0]), np.array([1.0, 1.0, 1.0])):
        assert np.array_equal(audit.average_ranks(x), rankdata(x))
    lo, hi = audit.bootstrap_ci(pos, neg, audit.fast_auc, 400, 0.95, seed=1)
    assert lo < audit.fast_auc(pos, neg) < hi and hi - lo < 0.3
    # with fewer than 1 / FPR negatives the threshold is their maximum
    assert audit.tpr_at(np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.5]), 0.001) == 1 / 3
    assert audit.tpr_at(np.array([1.0]), np.array([]), 0.01) != audit.tpr_at(
        np.array([1.0]), np.array([]), 0.01
    )  # NaN: nothing to compare with


def test_label_phi_is_the_logit_confidence_without_its_saturation() -> None:
    from scaleflu.fl.data import ImageData

    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    data = ImageData(
        torch.randint(0, 255, (5, 1, 2, 2), dtype=torch.uint8),
        torch.tensor([0, 1, 2, 0, 1]),
        0.5,
        0.25,
        3,
        "t",
    )
    phi = audit.label_phi(lin, data)
    probs = torch.softmax(lin(data.inputs()), 1)
    assert np.allclose(phi, logit_confidence(probs.detach(), data.labels), atol=1e-5)
    with torch.no_grad():
        lin[1].weight.mul_(1e4)  # p_y within 1e-12 of 1 for some: still ranked
    assert np.isfinite(audit.label_phi(lin, data)).all()


def test_settings_are_checked() -> None:
    assert not audit.AuditSettings.from_config({"shadows": 0}).enabled
    assert audit.AuditSettings.from_config({"shadows": 8, "rounds": 3}).rounds == 3
    for bad in ({"shadows": 3}, {"shadows": 2}, {"shadows": -4}, {"ci": 1.0}, {"shadow": 4}):
        with pytest.raises(ConfigError, match="scale.eval.audit"):
            audit.AuditSettings.from_config(bad)


def test_offline_score_centres_each_example_on_its_out_shadows() -> None:
    """An example the audited model scores exactly like its OUT shadows scores 0."""
    shadow_pos = np.array([[1.0, 5.0], [3.0, 7.0], [10.0, 20.0], [12.0, 22.0]])
    held = np.array([[False, False], [False, False], [True, True], [True, True]])
    shadow_neg = np.array([[0.0], [2.0], [4.0], [6.0]])
    aset = audit.AuditSet("canaries", None, None, ~held, np.ones((4, 1), bool), held)  # type: ignore[arg-type]
    s_pos, s_neg, cal = audit.audit_scores(
        np.array([2.0, 6.0]), np.array([3.0]), shadow_pos, shadow_neg, aset
    )
    assert np.allclose(s_pos, 0.0) and np.allclose(s_neg, 0.0)
    assert cal["margin"] > 5  # the IN shadows memorised both examples


# ----------------------------------------------------------------------------- on a trained run


@pytest.fixture(scope="module")
def audited(canary_run: tuple[Any, dict[str, Any]]) -> dict[str, Any]:
    """The client request's audit of the trained model, Retrain and the fine-tune control."""
    from scaleflu.config import merge
    from scaleflu.experiments.harness import make_context
    from scaleflu.unlearn.baselines import get_method

    run, cfg = canary_run
    cfg = merge(cfg, {"scale": {"eval": {"audit": {"shadows": SHADOWS, "bootstrap": 300}}}})
    torch.set_num_threads(1)
    ctx = make_context(run, "client:0", cfg, progress=False)
    out = {"ctx": ctx, "cfg": cfg, "original": ctx.original_metrics()}
    out["retrain"] = get_method("retrain", cfg).run(ctx)
    return out


@needs_fmnist
def test_the_audit_separates_the_trained_model_from_retrain(audited: dict[str, Any]) -> None:
    """Power: the trained model's canaries stand out from their twins, Retrain's do not.

    Measured (the property's spread): trained 0.94-0.99, Retrain 0.38-0.62 over seeds 0-4 and
    torch kernels avx2 / default. The audit: docs/reproducing.md, "The membership audit".
    """
    o, r = audited["original"], audited["retrain"].metrics
    print(
        f"audit AUC trained {o['audit_auc']:.3f} [{o['audit_auc_lo']:.3f}, {o['audit_auc_hi']:.3f}]"
        f" -> Retrain {r['audit_auc']:.3f} [{r['audit_auc_lo']:.3f}, {r['audit_auc_hi']:.3f}];"
        f" TPR@1% {o['audit_tpr_1fpr']:.3f} -> {r['audit_tpr_1fpr']:.3f}"
    )
    assert o["audit_set"] == r["audit_set"] == "canaries"
    assert o["audit_n"] == o["audit_neg_n"] == 40 and o["audit_fpr_floor"] == 1 / 40
    assert o["audit_auc"] > 0.85 and abs(r["audit_auc"] - 0.5) < 0.18
    assert o["audit_auc"] - r["audit_auc"] > 0.25
    assert o["audit_tpr_1fpr"] > r["audit_tpr_1fpr"]
    # the intervals: around the estimate, Retrain's covering the null
    assert o["audit_auc_lo"] <= o["audit_auc"] <= o["audit_auc_hi"]
    assert r["audit_auc_lo"] < 0.5 + 0.05 and r["audit_auc_hi"] > 0.5 - 0.05
    info = audited["retrain"].details["audit"]
    assert info["shadows"] == SHADOWS and info["set"] == "canaries"
    assert info["train_cpu_s"] > 0 and info["margin"] > 1.0  # the shadows memorise canaries


@needs_fmnist
def test_shadows_are_kept_in_the_run_and_reloaded(audited: dict[str, Any]) -> None:
    """A second context loads the shadows (nothing trained); a damaged file is trained again."""
    from scaleflu.experiments.harness import make_context

    ctx = audited["ctx"]
    folder = next((ctx.run.run_dir / audit.AUDIT_DIR).iterdir())
    files = sorted(folder.glob("shadow-*.safetensors"))
    assert len(files) == SHADOWS
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["shadows"] == SHADOWS and len(meta["train_cpu_s"]) == SHADOWS
    again = make_context(ctx.run, "sample:0:poisoned", audited["cfg"], progress=False)
    shadows, aset = again.shadows()
    assert again.audit_info["trained_now"] == 0 and aset is not None and aset.name == "canaries"
    # the same canaries, the same shadows: the same statistics
    first, _ = ctx.shadows()
    assert np.array_equal(first.phi(ctx.canary_target), shadows.phi(again.canary_target))
    files[0].write_bytes(b"not a safetensors file")
    third = audit.ShadowSet(ctx.run, audited["cfg"], ctx.audit_settings)
    assert third.ensure()["trained_now"] == 1
