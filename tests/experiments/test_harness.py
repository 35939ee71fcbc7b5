"""The experiment harness's variants (a method under its own name and settings) and cell folders
placed by the caller, as the seeded sweep and the unlearning benchmark use them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from test_table2 import Spy

from scaleflu.experiments.cells import Cell, RunKey, read_result
from scaleflu.experiments.harness import Variant, matched_budget, run_cells
from scaleflu.unlearn.base import UnlearnContext, UnlearnResult
from tiny_run_helpers import tiny_config


class Recorder(Spy):
    """A Spy that records its hyper-parameters and the context it ran in."""

    def __init__(self, name: str, calls: list[str], seen: list[dict[str, Any]], **params: Any):
        super().__init__(name, calls)
        self.seen, self.params = seen, params

    def run(self, ctx: UnlearnContext) -> UnlearnResult:
        self.seen.append({"params": self.params, "w_u": float(ctx.scale_cfg.w_u), "ctx": id(ctx)})
        result = super().run(ctx)
        result.cost["cpu_s"] = 0.5 + len(self.seen)
        return result


def test_variants_get_their_params_and_settings_and_cells_go_where_asked(
    tmp_path: Path, tiny_run_path: Path
) -> None:
    cfg = tiny_config()
    cfg["experiment"]["scenarios"] = {"client": "client:0"}
    key = RunKey("fashion_mnist", "lenet", float(cfg["data"]["alpha"]), 0)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    shutil.copytree(tiny_run_path, out / "runs" / key.slug)  # the session's trained run
    calls: list[str] = []
    seen: list[dict[str, Any]] = []

    def factory(name: str, cfg: Any, **params: Any) -> Any:
        return Recorder(name, calls, seen, **params)

    variants = {
        "retrain-b": Variant("retrain", params=(("seed", 7),)),
        "no-utility": Variant("scale", ("scale.w_u=0",), (("mode", "default"),)),
    }

    def cell_dir(c: Cell) -> Path:
        return c.dir(elsewhere if c.method == "retrain-b" else out)

    cells = [Cell(key, "client", m) for m in ("retrain", "retrain-b", "no-utility")]
    status = run_cells(
        cfg, out, cells, factory, False, variants=variants, cell_dir=cell_dir, desc="test"
    )
    assert [s["status"] for s in status.values()] == ["done"] * 3
    # the registered method under the variant's name, its hyper-parameters, its own settings
    assert calls == ["retrain:client:0", "retrain:client:0", "scale:client:0"]
    assert [s["params"] for s in seen] == [{}, {"seed": 7}, {"mode": "default"}]
    base_w_u = float(cfg["scale"]["w_u"])
    assert base_w_u != 0 and [s["w_u"] for s in seen] == [base_w_u, base_w_u, 0.0]
    assert seen[0]["ctx"] == seen[1]["ctx"] != seen[2]["ctx"]  # params share the context
    # the cell folders: where cell_dir put them, the status names them
    assert read_result(cell_dir(cells[1]) / "result.json") is not None
    assert not cells[1].dir(out).exists()
    assert str(cell_dir(cells[1])) in status and cells[0].dir(Path()).as_posix() in status
    # a rerun reuses all three, wherever they are
    calls.clear()
    run_cells(cfg, out, cells, factory, False, variants=variants, cell_dir=cell_dir)
    assert calls == []

    class Matched:
        match_cost_of = "retrain-b"

    assert matched_budget(cell_dir, cells[0], Matched()) == 2.5  # retrain-b's, through cell_dir


def _lenet_at_w_u_025(tmp_path: Path, tiny_run_path: Path) -> tuple[Any, RunKey, Path]:
    """The tiny config with one client scenario and LeNet's model setting scale.w_u=0.25, its
    key and an output folder holding the session's trained run."""
    cfg = tiny_config()
    cfg["experiment"]["scenarios"] = {"client": "client:0"}
    cfg["experiment"]["model_settings"]["lenet"] = ["scale.w_u=0.25"]
    key = RunKey("fashion_mnist", "lenet", float(cfg["data"]["alpha"]), 0)
    out = tmp_path / "out"
    shutil.copytree(tiny_run_path, out / "runs" / key.slug)
    return cfg, key, out


def test_a_reused_cell_computed_with_other_settings_is_named(
    tmp_path: Path, tiny_run_path: Path, caplog: Any
) -> None:
    """A finished cell is reused whatever the config says now; where its method's settings
    (``baselines.<section>``; SCALE's ``scale.*`` too) changed since, the run says which cells
    and settings, once."""
    cfg, key, out = _lenet_at_w_u_025(tmp_path, tiny_run_path)
    calls: list[str] = []

    def factory(name: str, cfg: Any, **params: Any) -> Any:
        return Recorder(name, calls, [], **params)

    variants = {"retrain-b": Variant("retrain", params=(("seed", 7),))}
    cells = [Cell(key, "client", m) for m in ("retrain", "retrain-b", "scale", "pga")]
    run_cells(cfg, out, cells, factory, False, variants=variants)
    assert calls == ["retrain:client:0", "retrain:client:0", "scale:client:0", "pga:client:0"]
    saved = read_result(cells[1].dir(out) / "result.json")
    assert saved is not None
    assert saved["config"]["method"]["section"] == "retrain"
    assert saved["config"]["method"]["settings"]["seed"] == 7  # the variant's param
    calls.clear()
    with caplog.at_level("WARNING", logger="scaleflu.experiments.harness"):
        run_cells(cfg, out, cells, factory, False, variants=variants)  # same settings: silent
        assert calls == [] and not caplog.records
        cfg["experiment"]["model_settings"]["lenet"] = ["scale.w_u=0.5"]
        run_cells(cfg, out, cells, factory, False, variants=variants)
        cfg["experiment"]["model_settings"]["lenet"] = ["scale.w_u=0.25"]
        cfg["baselines"]["retrain"]["rounds"] = 3
        cfg["baselines"]["retrain"]["seed"] = 5  # retrain-b's own seed still wins
        run_cells(cfg, out, cells, factory, False, variants=variants)
    assert calls == []  # still reused
    first, second = (r.getMessage() for r in caplog.records)
    assert "1 finished cell" in first and "scale.w_u: 0.25 -> 0.5" in first
    assert "client/scale" in first
    assert "2 finished cell" in second and "baselines.retrain.rounds: None -> 3" in second
    assert "baselines.retrain.seed" in second and "client/retrain:" in second
    assert "scale.w_u" not in second and "pga" not in second
    # a setting the method would refuse does not stop the reuse check (a cell that runs says so)
    cfg["baselines"]["retrain"]["bogus"] = 1
    run_cells(cfg, out, cells, factory, False, variants=variants)
    assert calls == []


def test_a_models_scale_settings_reach_its_cells_and_variants_still_win(
    tmp_path: Path, tiny_run_path: Path
) -> None:
    """experiment.model_settings.<model> may set scale.*: the model's cells run with it (its
    trained run is still reused: scale.* does not shape a run), a variant's own setting on top."""
    cfg, key, out = _lenet_at_w_u_025(tmp_path, tiny_run_path)
    calls: list[str] = []
    seen: list[dict[str, Any]] = []

    def factory(name: str, cfg: Any, **params: Any) -> Any:
        return Recorder(name, calls, seen, **params)

    variants = {"no-utility": Variant("scale", ("scale.w_u=0",))}
    cells = [Cell(key, "client", m) for m in ("scale", "no-utility")]
    status = run_cells(cfg, out, cells, factory, False, variants=variants)
    assert [s["status"] for s in status.values()] == ["done"] * 2
    assert float(cfg["scale"]["w_u"]) != 0.25
    assert [s["w_u"] for s in seen] == [0.25, 0.0]
