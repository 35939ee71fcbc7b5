"""Targets against Retrain, and one method's result scored against the reference Retrain.

Shared by the seeded sweep (:mod:`scaleflu.experiments.sweep`) and the Table II report
(:mod:`scaleflu.experiments.report`, its Retrain-level section); reads results, imports no
model code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SWEEP_FORGET_TOL = 0.05
SWEEP_RA_TOL = 0.02
SWEEP_TIME = 0.05
# the membership targets (per request, against the reference Retrain): the audit's AUC within
# 0.05 of Retrain's either way (a model less member-like than Retrain is told apart too), its TPR
# at 1 % FPR at most 0.03 above Retrain's, RA on true labels at most 0.02 below Retrain's and the
# protocol's forgetting no more than Retrain's + 0.02 (a lower TPR or a higher RA than Retrain's
# is no fault: on MobileNetV3's reduced row Retrain's RA stands well below the trained model's)
AUDIT_AUC_TOL = 0.05
AUDIT_TPR_TOL = 0.03
MEMBERSHIP_FORGET_TOL = 0.02


def forget_score(m: Mapping[str, Any], protocol: str) -> float | None:
    """The forgetting score of a result's metrics: backdoor ASR, else FA on the protocol."""
    if protocol == "backdoor":
        return m.get("backdoor_asr")
    return m.get("fa_protocol") if m.get("fa_protocol") is not None else m.get("fa")


def sweep_row(
    res: Mapping[str, Any], ref: Mapping[str, Any], control: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One method's result against the reference Retrain (and the control): values and targets."""
    m, rm = res["metrics"], ref["metrics"]
    c, rc = res["cost"], ref["cost"]
    row = {
        "method": res.get("variant", res.get("method")),
        "test_acc": m.get("test_acc"),
        "ra": m.get("ra"),
        "fa": m.get("fa_protocol") if m.get("fa_protocol") is not None else m.get("fa"),
        "asr": m.get("backdoor_asr"),
        "forget": forget_score(m, res["protocol"]),
        "mia_auc": m.get("mia_loss_auc"),
        "mia_cal_auc": m.get("mia_ref_auc"),
        "wall_s": c["wall_s"],
        "cpu_s": c.get("cpu_s"),
        "startup_s": (res.get("details") or {}).get("startup_s"),
        "timing": (res.get("details") or {}).get("timing"),
        "val_acc_before_recovery": (res.get("details") or {}).get("val_acc_before_recovery"),
        "time_ratio": c["wall_s"] / max(rc["wall_s"], 1e-9),
        # None where either CPU time was not recorded (a cell from before it was): no pass
        "cpu_ratio": (
            c["cpu_s"] / max(rc["cpu_s"], 1e-9) if c.get("cpu_s") and rc.get("cpu_s") else None
        ),
        "d_ra": (m["ra"] - rm["ra"]) if m.get("ra") is not None else None,
        # RA on D_r's clean images and true labels: RA "as held" also scores the memorised
        # canaries and label flips the protocol plants in the remaining clients
        "ra_clean": m.get("ra_clean"),
        "d_ra_clean": (
            m["ra_clean"] - rm["ra_clean"]
            if m.get("ra_clean") is not None and rm.get("ra_clean") is not None
            else None
        ),
    }
    f, rf = row["forget"], forget_score(rm, res["protocol"])
    row["d_forget"] = None if f is None or rf is None else f - rf
    for key in ("audit_auc", "audit_auc_lo", "audit_auc_hi", "audit_tpr_1fpr", "audit_tpr_01fpr"):
        row[key] = m.get(key)
    row["audit_set"] = m.get("audit_set")
    row["d_audit_auc"] = _diff(m.get("audit_auc"), rm.get("audit_auc"))
    row["d_audit_tpr"] = _diff(m.get("audit_tpr_1fpr"), rm.get("audit_tpr_1fpr"))
    ok = {
        "ra": row["d_ra"] is not None and abs(row["d_ra"]) <= SWEEP_RA_TOL,
        "forget": row["d_forget"] is not None and row["d_forget"] <= SWEEP_FORGET_TOL,
        "ra_clean": row["d_ra_clean"] is not None and abs(row["d_ra_clean"]) <= SWEEP_RA_TOL,
    }
    if row["d_audit_auc"] is not None:
        # the per-example membership audit at Retrain's level (AUC and TPR at 1 % FPR)
        ok["audit"] = (
            abs(row["d_audit_auc"]) <= AUDIT_AUC_TOL
            and row["d_audit_tpr"] is not None
            and row["d_audit_tpr"] <= AUDIT_TPR_TOL
        )
        # ... with RA on true labels at most 0.02 below Retrain's and forgetting within
        # Retrain's + 0.02
        ok["membership"] = (
            ok["audit"]
            and row["d_ra_clean"] is not None
            and row["d_ra_clean"] >= -SWEEP_RA_TOL
            and row["d_forget"] is not None
            and row["d_forget"] <= MEMBERSHIP_FORGET_TOL
        )
    if control is not None:
        cm = control["metrics"]
        cf = forget_score(cm, res["protocol"])
        row["d_forget_control"] = None if f is None or cf is None else f - cf
        row["d_ra_control"] = (
            None if m.get("ra") is None or cm.get("ra") is None else m["ra"] - cm["ra"]
        )
        # better forgetting than the control at equal (within RA_TOL) or better RA
        ok["control"] = (
            row["d_forget_control"] is not None
            and row["d_ra_control"] is not None
            and row["d_forget_control"] < 0
            and row["d_ra_control"] >= -SWEEP_RA_TOL
        )
    ok["time"] = row["time_ratio"] <= SWEEP_TIME
    ok["cpu"] = row["cpu_ratio"] is not None and row["cpu_ratio"] <= SWEEP_TIME
    row["ok"] = ok
    return row


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else float(a) - float(b)
