"""The sweep's noise-floor table (``benchmarks/unlearn_bench.py --sweep --noise-floor``) on
made-up rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from test_table2 import Spy

from scaleflu.experiments import sweep
from scaleflu.experiments.cells import Cell
from tiny_run_helpers import tiny_config


def _row(seed: int, d_scale: float, d_b: float, d_ctl: float, fgt_vs_ctl: float) -> dict:
    return {
        "setting": "cpu-alpha0.3",
        "scenario": "client",
        "seed": seed,
        "methods": [
            {"method": "retrain", "d_ra": 0.0},
            {
                "method": "scale-default",
                "d_ra": d_scale,
                "d_forget_control": fgt_vs_ctl,
                "d_ra_control": d_scale - d_ctl,
            },
            {"method": "finetune", "d_ra": d_ctl},
            {"method": sweep.NOISE_FLOOR_METHOD, "d_ra": d_b},
        ],
    }


def test_noise_floor_counts() -> None:
    rows = [
        _row(0, -0.01, 0.05, 0.0, -0.9),  # within 0.02; beats the control
        _row(1, -0.04, 0.05, 0.0, -0.9),  # outside 0.02, inside its floor 0.05; beats it too
        _row(2, -0.04, 0.01, 0.0, -0.9),  # outside both (floor 0.02); RA 0.04 below the control
        _row(3, 0.00, 0.00, 0.0, +0.1),  # within; forgets less than the control
    ]
    lines = sweep.noise_floor_table({"rows": rows})
    scale = next(x for x in lines if "| scale-default |" in x).split(" | ")
    # |dRA| of retrain-b min/median/max, its mean; SCALE's; counts: retrain-b within 0.02,
    # SCALE within 0.02, within the floor, no farther than retrain-b, beats the control
    assert scale[3] == "0.000 / 0.030 / 0.050" and scale[4] == "+0.028"
    assert scale[6] == "0.000 / 0.025 / 0.040" and scale[7] == "-0.022"
    assert scale[8:] == ["2/4", "2/4", "3/4", "3/4", "2/4 |"]
    ctl = next(x for x in lines if "| finetune |" in x)
    assert ctl.endswith("| - |")
    # no independent Retrain in the rows: no table
    plain = [{**r, "methods": r["methods"][:3]} for r in rows]
    assert sweep.noise_floor_table({"rows": plain}) == []


def test_noise_floor_on_clean_labels() -> None:
    """The second table scores RA on clean images (``d_ra_clean``): its own counts, and the
    control comparison uses the clean RA of SCALE and the control, not the protocol's."""
    rows = [
        _row(0, -0.06, 0.00, 0.0, -0.9),  # protocol: far; clean: within, beats the control
        _row(1, -0.06, 0.00, 0.0, -0.9),  # protocol: far; clean: 0.03 below the control
    ]
    clean = [(-0.01, 0.005, 0.0), (-0.03, 0.01, 0.0)]  # scale, retrain-b, finetune
    for r, (cs, cb, cc) in zip(rows, clean, strict=True):
        for m in r["methods"]:
            m["d_ra_clean"] = {
                "scale-default": cs,
                sweep.NOISE_FLOOR_METHOD: cb,
                "finetune": cc,
                "retrain": 0.0,
            }[m["method"]]
    lines = sweep.noise_floor_table({"rows": rows})
    heads = [i for i, x in enumerate(lines) if x.startswith("## Retrain's own spread")]
    assert len(heads) == 2 and "`d_ra_clean`" in lines[heads[1]]
    prot = next(x for x in lines[: heads[1]] if "| scale-default |" in x).split(" | ")
    cl = next(x for x in lines[heads[1] :] if "| scale-default |" in x).split(" | ")
    assert prot[8:] == ["2/2", "0/2", "0/2", "0/2", "0/2 |"]
    assert cl[7] == "-0.020"
    assert cl[8:] == ["2/2", "1/2", "1/2", "0/2", "1/2 |"]


def test_federation_runs_on_the_harness_interleaved_and_resumable(
    tmp_path: Path, tiny_run_path: Path
) -> None:
    """Retrain and SCALE alternate which goes first; Retrain's cells stay with the run (``WORK``),
    the others under ``OUT``; a second call recomputes nothing and keeps the rows."""
    requests = [("client", "client:0"), ("class", "class:1")]
    fed = sweep.Federation(
        "tiny", 0, sweep.federation_config(tiny_config(), [], requests), {"backdoor_client": 0}
    )
    out, work = tmp_path / "out", tmp_path / "work"
    shutil.copytree(tiny_run_path, work / "sweep" / "tiny" / "runs" / fed.key.slug)
    calls: list[str] = []

    def factory(name: str, cfg: Any, **params: Any) -> Any:
        calls.append(f"{name}{params.get('seed', '')}")
        return Spy(name, [])

    data = sweep.run_federation(fed, out, work, noise_floor=True, factory=factory)
    assert data["complete"] and json.loads(sweep.federation_path(out, fed).read_text()) == data
    # seed 0: request 0 Retrain first, request 1 SCALE first; the independent Retrain last
    assert calls == ["retrain", "scale", "finetune", "retrain1000"] + [
        "scale",
        "retrain",
        "finetune",
        "retrain1000",
    ]
    cell = Cell(fed.key, "client", "retrain")
    assert (cell.dir(work / "sweep" / "tiny") / "result.json").is_file()
    scale = Cell(fed.key, "client", "scale-default")
    assert (scale.dir(out / "unlearn_sweep" / "tiny") / "result.json").is_file()
    assert [r["scenario"] for r in data["rows"]] == ["client", "class"]
    row = data["rows"][0]
    assert [m["method"] for m in row["methods"]] == [
        "retrain",
        "scale-default",
        "finetune",
        sweep.NOISE_FLOOR_METHOD,
    ]
    assert all(m["d_ra"] == 0.0 for m in row["methods"])  # every Spy returns Theta
    calls.clear()
    again = sweep.run_federation(fed, out, work, noise_floor=True, factory=factory)
    assert calls == [] and again["rows"] == data["rows"]


def test_cpu_federation_draws_its_clients_from_the_seed() -> None:
    a, b = sweep.cpu_federation(3, 0.3), sweep.cpu_federation(3, 0.3)
    assert a.cfg == b.cfg and a.drawn == b.drawn
    bd, lf = a.drawn["backdoor_client"], a.drawn["label_flip_client"]
    assert bd != lf
    assert list(a.cfg.data.poison.backdoor_clients) == [bd]
    assert [s for s, _ in a.requests] == ["client", "class", "sample", "sample-bd"]
    assert dict(a.requests)["client"] == f"client:{bd}"
    assert a.key.alpha == 0.3 and a.key.seed == 3 and a.name == "cpu-alpha0.3-s3"
