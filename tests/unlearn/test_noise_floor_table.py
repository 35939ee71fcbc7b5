"""The sweep's noise-floor table (benchmarks/unlearn_bench.py --noise-floor) on made-up rows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import unlearn_bench as ub  # noqa: E402


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
            {"method": ub.NOISE_FLOOR_METHOD, "d_ra": d_b},
        ],
    }


def test_noise_floor_counts() -> None:
    rows = [
        _row(0, -0.01, 0.05, 0.0, -0.9),  # within 0.02; beats the control
        _row(1, -0.04, 0.05, 0.0, -0.9),  # outside 0.02, inside its floor 0.05; beats it too
        _row(2, -0.04, 0.01, 0.0, -0.9),  # outside both (floor 0.02); RA 0.04 below the control
        _row(3, 0.00, 0.00, 0.0, +0.1),  # within; forgets less than the control
    ]
    lines = ub.noise_floor_table({"rows": rows})
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
    assert ub.noise_floor_table({"rows": plain}) == []


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
                ub.NOISE_FLOOR_METHOD: cb,
                "finetune": cc,
                "retrain": 0.0,
            }[m["method"]]
    lines = ub.noise_floor_table({"rows": rows})
    heads = [i for i, x in enumerate(lines) if x.startswith("## Retrain's own spread")]
    assert len(heads) == 2 and "`d_ra_clean`" in lines[heads[1]]
    prot = next(x for x in lines[: heads[1]] if "| scale-default |" in x).split(" | ")
    cl = next(x for x in lines[heads[1] :] if "| scale-default |" in x).split(" | ")
    assert prot[8:] == ["2/2", "0/2", "0/2", "0/2", "0/2 |"]
    assert cl[7] == "-0.020"
    assert cl[8:] == ["2/2", "1/2", "1/2", "0/2", "1/2 |"]
