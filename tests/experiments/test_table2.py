"""The Table II harness: resumable cells, failures recorded, table/CSV/figures, CLI, planning."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from scaleflu.experiments.cells import Cell, RunKey, plan_cells, read_result
from scaleflu.experiments.harness import default_factory
from scaleflu.experiments.table2 import run_table2
from scaleflu.unlearn.aoi import AoITracker
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from tiny_run_helpers import tiny_config


class Spy:
    """A cheap Unlearner: returns Theta itself, with SCALE-like details for the figures."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name = name
        self.calls = calls

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        self.calls.append(f"{self.name}:{ctx.request.request.text}")
        self.state = ctx.original_state()
        layers = list(ctx.groups)
        sens = {
            "top": layers[:2],
            "layers": [{"layer": n, "score": 1.0 / (i + 1)} for i, n in enumerate(layers)],
        }
        return ctx.make_result(
            self.name,
            self.state,
            wall_s=0.01,
            bytes_=100,
            link_s=0.5,
            fl_rounds=1,
            aoi=AoITracker.from_history(ctx.run.history),
            sum_aoi_trace=[3.0, 2.0, 1.0],
            details={
                "episode_returns": [0.1 * i for i in range(30)],
                "sensitivity": sens,
                "aoi_time_avg_s": 0.25,
            },
        )


class Boom:
    """An Unlearner that always fails."""

    name = "boom"

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        self.calls.append("boom")
        raise RuntimeError("deliberate failure in a cell")


def _setup(tmp_path: Path, tiny_run_path: Path, methods: list[str]) -> tuple[dict[str, Any], Path]:
    cfg = tiny_config()
    cfg["experiment"]["methods"] = methods
    cfg["experiment"]["scenarios"] = {"client": "client:0", "class": "class:1"}
    out = tmp_path / "out"
    key = RunKey("fashion_mnist", "lenet", float(cfg["data"]["alpha"]), 0)
    shutil.copytree(tiny_run_path, out / "runs" / key.slug)  # reuse the session's trained run
    return cfg, out


def test_harness_resumes_records_failures_and_reports(tmp_path: Path, tiny_run_path: Path) -> None:
    """Finished cells are skipped on a rerun; a failing cell is recorded and the others go on."""
    calls: list[str] = []

    def factory(name: str, cfg: Mapping[str, Any]) -> Any:
        if name == "boom":
            return Boom(calls)
        if name in ("retrain", "scale"):
            return Spy(name, calls)
        return default_factory(name, cfg)

    cfg, out = _setup(tmp_path, tiny_run_path, ["retrain", "boom", "fedraser", "scale"])
    summary = run_table2(cfg, out, factory=factory, progress=False)
    assert summary["cells"] == 8 and summary["done"] == 6
    assert len(summary["failed"]) == 2 and all(f.endswith("/boom") for f in summary["failed"])
    cell = Cell(RunKey("fashion_mnist", "lenet", 1.0, 0), "client", "boom").dir(out)
    err = json.loads((cell / "error.json").read_text())
    assert "deliberate failure" in err["error"] and err["stage"] == "unlearn"
    assert "RuntimeError" in (cell / "traceback.txt").read_text()
    assert not (cell / "result.json").exists()
    real = Cell(RunKey("fashion_mnist", "lenet", 1.0, 0), "client", "fedraser").dir(out)
    res = read_result(real / "result.json")
    assert res is not None and res["details"]["aoi_time_avg_s"] is not None
    assert sorted(calls) == sorted(
        ["retrain:client:0", "retrain:class:1", "scale:client:0", "scale:class:1", "boom", "boom"]
    )
    # Report: Table II markdown and CSV with deltas to Retrain, the figures.
    md = (out / "table2.md").read_text()
    assert "RA ↑ Retrain" in md and "FA ↓ F-E" in md and "Avg AoI (s) ↓ SCALE" in md
    # the paper's value beside every cell it has: LeNet/FashionMNIST client Retrain RA 0.92,
    # class F-E FA 0.27, client SCALE AoI 2.01 (tab:main_results)
    lines: dict[str, str] = {}
    for ln in md.splitlines():  # the first table (Table II's shape) comes first
        if ln.startswith("| fashion_mnist"):
            lines.setdefault(ln.split(" | ")[1], ln)
    assert "[paper 0.92]" in lines["client"] and "[paper 2.01]" in lines["client"]
    assert "[paper 0.27]" in lines["class"] and "[paper 0.92]" not in lines["class"]
    rows = (out / "table2.csv").read_text().splitlines()
    assert rows[0] == "dataset,model,scenario,method,metric,mean,std,n,delta_mean,delta_std,paper"
    assert [r for r in rows if ",client,retrain,RA," in r][0].endswith(",0.92")
    assert [r for r in rows if ",client,retrain,RA_clean," in r][0].endswith(",")
    scale_ra = [r for r in rows if ",client,scale,RA," in r][0].split(",")
    assert float(scale_ra[8]) == pytest.approx(0.0, abs=1e-9)  # same model as the Retrain spy
    figs = {p.name for p in (out / "figures").glob("*.png")}
    assert {
        "ppo_convergence_fashion_mnist.png",
        "layer_sensitivity_fashion_mnist_lenet.png",
        "sum_aoi_fashion_mnist.png",
    } <= figs

    # Rerun: nothing finished is recomputed, the failed cells are retried (and fail again).
    calls.clear()
    summary2 = run_table2(cfg, out, factory=factory, progress=False)
    assert calls == ["boom", "boom"]
    assert summary2["done"] == 6
    # A damaged result is not a finished cell: it is recomputed.
    victim = Cell(RunKey("fashion_mnist", "lenet", 1.0, 0), "class", "scale").dir(out)
    (victim / "result.json").write_text("{not json")
    calls.clear()
    run_table2(cfg, out, factory=factory, progress=False, report=False)
    assert sorted(calls) == ["boom", "boom", "scale:class:1"]
    assert read_result(victim / "result.json") is not None


class NonFinite:
    """An Unlearner whose model holds a NaN: the cell must fail, never be scored."""

    name = "nonfinite"

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        state = ctx.original_state()
        key = next(k for k, v in state.items() if v.is_floating_point())
        state[key] = state[key].clone()
        state[key].view(-1)[0] = float("nan")
        return ctx.make_result(
            self.name,
            state,
            wall_s=0.01,
            bytes_=1,
            link_s=0.1,
            fl_rounds=0,
            aoi=AoITracker.from_history(ctx.run.history),
            details={"failure": "ascent diverged"},
        )


def test_a_non_finite_model_is_a_failed_cell_never_scored(
    tmp_path: Path, tiny_run_path: Path
) -> None:
    def factory(name: str, cfg: Mapping[str, Any]) -> Any:
        return NonFinite() if name == "nonfinite" else Spy(name, [])

    cfg, out = _setup(tmp_path, tiny_run_path, ["retrain", "nonfinite"])
    summary = run_table2(cfg, out, factory=factory, progress=False)
    assert summary["done"] == 2 and len(summary["failed"]) == 2
    cell = Cell(RunKey("fashion_mnist", "lenet", 1.0, 0), "client", "nonfinite").dir(out)
    err = json.loads((cell / "error.json").read_text())
    assert err["error"].startswith("UnlearningFailedError: nonfinite produced a model with")
    assert "non-finite values in 1 of" in err["error"] and "ascent diverged" in err["error"]
    assert not (cell / "result.json").exists()
    md = (out / "table2.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| fashion_mnist | client"))
    assert row.count("FAILED") == 3  # RA, FA and Avg AoI of the failed method
    assert "### Failed cells (not scored)" in md and "ascent diverged" in md
    csv_rows = (out / "table2.csv").read_text().splitlines()
    ra = next(r for r in csv_rows if ",client,nonfinite,RA," in r).split(",")
    assert ra[7] == "0"  # n: no seed scored


def test_plan_cells_with_alpha_sweep() -> None:
    """The sweep adds only its methods/scenarios at other alphas, never duplicating main cells."""
    cfg = tiny_config("experiment.alpha_sweep.alphas=[0.1,1.0]", "experiment.seeds=[0,1]")
    main, sweep = plan_cells(cfg)
    assert len(main) == 1 * 1 * 2 * 3 * 5
    assert len(sweep) == 2 * 3 * 1  # alpha 0.1 only: 1.0 is the main alpha (already planned)
    assert {c.method for c in sweep} == {"scale"} and {c.run.alpha for c in sweep} == {0.1}
    assert not set(main) & set(sweep)


def test_cli_registers_table2() -> None:
    """``scaleflu experiment table2`` parses its options and finds packaged configs by name."""
    from scaleflu.cli import build_parser
    from scaleflu.config import load_config, resolve_config_path

    args = build_parser().parse_args(
        ["experiment", "table2", "--config", "table2_cpu", "--set", "fl.rounds=2", "--out", "x"]
    )
    assert args.out == "x" and args.overrides == ["fl.rounds=2"] and callable(args.func)
    for name in ("table2_cpu", "table2_paper"):
        cfg = load_config(resolve_config_path(name))
        methods = cfg["experiment"]["methods"]
        assert set(methods) == {
            "retrain",
            "fedraser",
            "pga",
            "fused",
            "scale",
            "not",
            "finetune",
            "finetune_matched",
        }  # the six methods and the control, twice
        assert methods.index("scale") < methods.index("finetune_matched")
    paper = load_config(resolve_config_path("table2_paper"))
    assert paper["data"]["num_clients"] == 100 and paper["fl"]["rounds"] == 100
    assert paper["fl"]["local_epochs"] == 10
    assert set(paper["experiment"]["models"]) == {"lenet", "mobilenetv3", "resnet18"}
    assert set(paper["experiment"]["datasets"]) == {"fashion_mnist", "cifar100"}


def test_matched_control_reads_scale_cpu_time(tmp_path: Path) -> None:
    """finetune_matched's budget is SCALE's cpu_s on the same run and scenario; else an error."""
    from scaleflu.experiments.harness import matched_budget
    from scaleflu.unlearn.baselines import get_method

    key = RunKey("fashion_mnist", "lenet", 0.3, 0)
    cell = Cell(key, "client", "finetune_matched")
    m = get_method("finetune_matched", tiny_config())
    assert m.match_cost_of == "scale"
    with pytest.raises(RuntimeError, match="no result with cpu_s"):
        matched_budget(tmp_path, cell, m)
    sdir = Cell(key, "client", "scale").dir(tmp_path)
    sdir.mkdir(parents=True)
    res = {"schema": 1, "metrics": {"ra": 0.8}, "aoi": {}, "cost": {"cpu_s": 12.5}}
    (sdir / "result.json").write_text(json.dumps(res))
    assert matched_budget(tmp_path, cell, m) == 12.5
    other = Cell(RunKey("fashion_mnist", "lenet", 0.3, 1), "client", "finetune_matched")
    with pytest.raises(RuntimeError):
        matched_budget(tmp_path, other, m)  # another seed's SCALE is not this one's budget


def test_control_verdicts_call_out_methods_that_do_not_beat_the_control() -> None:
    """Equal RA and no lower FA/MIA -> 'does NOT beat'; lower FA -> beats; low RA -> says so."""
    from scaleflu.experiments.report import control_verdicts, protocol_table, verdict_table

    cfg = tiny_config()
    cfg["experiment"]["methods"] = ["retrain", "scale", "pga", "fused", "fedraser", "finetune"]
    cfg["experiment"]["scenarios"] = {"client": "client:0"}
    vals = {
        "retrain": (0.80, 0.05, 0.50, 0.50),
        "scale": (0.80, 0.30, 0.60, 0.90),  # same as the control: no better
        "pga": (0.79, 0.10, 0.60, 0.90),  # forgets more at equal RA (within 0.02)
        "fused": (0.60, 0.05, 0.50, 0.50),  # forgets, but loses RA
        "fedraser": (0.80, 0.30, 0.20, 0.05),  # AUCs far below 0.5: a trace, not forgetting
        "finetune": (0.80, 0.30, 0.60, 0.90),
        "original": (0.82, 0.95, 0.70, 0.97),
    }
    rows = [
        {
            "dataset": "fashion_mnist",
            "model": "lenet",
            "scenario": "client",
            "method": m,
            "metric": metric,
            "mean": v[i],
            "std": 0.0,
            "n": 1,
        }
        for m, v in vals.items()
        for i, metric in enumerate(("RA", "FA", "MIA_AUC", "MIA_canary_AUC"))
    ]
    got = {v["method"]: v["verdict"] for v in control_verdicts(cfg, rows)}
    assert got["scale"].startswith("does NOT beat the control")
    assert got["pga"] == "beats the control on FA"
    assert got["fused"].startswith("lower RA than the control")
    assert got["fedraser"].startswith("does NOT beat the control")
    assert got["retrain"] == "beats the control on FA, MIA_AUC, MIA_canary_AUC"
    assert "finetune" not in got
    md = verdict_table(control_verdicts(cfg, rows))
    assert "| client | lenet | SCALE | Control | 0.800 |" in md
    table = protocol_table(cfg, rows)
    assert "Original (trained)" in table and "0.950" in table
    assert "canary MIA AUC (calibrated)" in table and "0.970" in table
    assert "| 0.600 | 0.900 | 0.900 |" in md  # the canary MIA beside the control's
