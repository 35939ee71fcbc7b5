"""The testbed report: the side-by-side table and plot, and the erasure line."""

from __future__ import annotations

import io
from pathlib import Path

from scaleflu.testbed.report import plot_report, print_summary
from scaleflu.testbed.unlearn_service import side_by_side_row


def _result(method: str, asr: float, acc: float, wall: float) -> dict:
    return {
        "method": method,
        "metrics": {
            "backdoor_asr": asr,
            "test_acc": acc,
            "ra": acc + 0.01,
            "fa_protocol": asr,
            "mia_loss_auc": 0.51,
        },
        "cost": {"wall_s": wall, "cpu_s": wall * 0.9, "bytes": 2_000_000, "fl_rounds": 2},
        "details": {"startup_s": 3.0},
    }


def test_side_by_side_rows_summary_and_plot(tmp_path: Path) -> None:
    side = [
        side_by_side_row(_result("scale-default", 0.12, 0.80, 4.0), air_bytes=1_500_000),
        side_by_side_row(_result("retrain", 0.10, 0.81, 40.0)),
        side_by_side_row({"method": "finetune", "error": "unknown method 'finetune'"}),
    ]
    assert side[0]["asr"] == 0.12 and side[0]["air_bytes"] == 1_500_000
    assert side[0]["startup_s"] == 3.0 and side[1]["air_bytes"] is None
    assert side[0]["mia_auc"] == 0.51 and side[2] == {
        "method": "finetune",
        "error": "unknown method 'finetune'",
    }
    un = {
        "request": {"robot": 1, "text": "client:0"},
        "method": "scale",
        "robots_before": {},
        "robots_after": {},
        "side_by_side": side,
        "erasure": {
            "clients": [0],
            "rounds": [1, 2, 3],
            "updates": 3,
            "bytes": 3_000_000,
            "final_model_replaced": True,
            "derived_kept_rounds": [1, 2, 3],
        },
    }
    buf = io.StringIO()
    print_summary({"unlearning": un}, buf)
    text = buf.getvalue()
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.strip()}
    assert "0.120" in lines["scale-default"] and "1.50" in lines["scale-default"]
    assert "40.0" in lines["retrain"] and "0.810" in lines["retrain"]
    assert "not run: unknown method" in lines["finetune"]
    assert "3 stored updates of client(s) [0] in rounds [1, 2, 3]" in text
    assert "rounds 1..3" in text
    # the MIA AUC column says what it measures and what either side of 0.5 means
    assert side[0]["mia_kind"] == "loss"
    assert "MIA AUC: how well a loss-threshold membership attack" in text
    assert "0.5: no trace left" in text and "below 0.5" in text and "above 0.5" in text
    paths = plot_report({"unlearning": un}, tmp_path)
    assert tmp_path / "unlearning_side_by_side.png" in paths
    assert (tmp_path / "unlearning_side_by_side.png").stat().st_size > 1000


def test_demo_config_compares_retrain_and_control() -> None:
    import argparse

    from scaleflu.testbed.launcher import build_config

    args = argparse.Namespace(
        robots=3,
        rounds=3,
        link="frames",
        method=None,
        config=None,
        overrides=[],
        backdoor_robot=1,
    )
    u = build_config(args)["testbed"]["unlearn"]
    assert u["compare"] == ["retrain", "finetune"] and u["method"] == "scale" and u["erase"]
    args.method, args.overrides = "retrain", ["testbed.unlearn.compare=[]"]
    u = build_config(args)["testbed"]["unlearn"]
    assert u["method"] == "retrain" and u["compare"] == [] and u["wait_s"] == 120.0
    # --unlearn none: no robot the launcher starts will ask, the server does not wait for one
    # (it waited the default 120 s after the last round); an explicit setting still wins
    args.unlearn = "none"
    assert build_config(args)["testbed"]["unlearn"]["wait_s"] == 0.0
    args.overrides = ["testbed.unlearn.wait_s=7"]
    assert build_config(args)["testbed"]["unlearn"]["wait_s"] == 7.0
    args.unlearn = "class"
    assert build_config(args)["testbed"]["unlearn"]["wait_s"] == 7.0
