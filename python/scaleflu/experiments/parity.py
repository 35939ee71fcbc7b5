"""Every method against Retrain's level, over the runs of one or more Table II outputs.

A method is at Retrain's level on a request when the per-example membership audit cannot tell
it from Retrain (AUC within 0.05 either way, TPR at 1 % FPR at most 0.03 above), RA on clean
images with true labels stays within 0.02 (at most that much below) and the forgetting within
Retrain's + 0.02, at a CPU time of at most 5 % of Retrain's
(:mod:`scaleflu.experiments.criteria`; issue 26's item 2). Each cell is scored against the
Retrain cell of the same run and request (:func:`~.criteria.sweep_row`); this module pools
those pairs per model, request and method and reads them two ways:

* **per run**: how many runs meet each target, and all at once. A second, independently seeded
  Retrain meets the per-run targets against the first on only some runs (Retrain's own spread;
  docs/results/scale.md), so a per-run count is bounded by that spread, not only by the method.
* **at the mean**: the mean paired difference over the runs with its 95 % confidence interval
  (Student's t over runs); the mean is at Retrain's level when every interval lies inside its
  target (an equivalence test: too few runs give intervals too wide to show it) and the CPU
  ratio is within 5 % on every run.

The fine-tune control is scored the same way: where it passes the audit as often as the method,
the audit has no power on that request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import t as student_t

from scaleflu.experiments.cells import Cell, RunKey, read_result
from scaleflu.experiments.criteria import (
    AUDIT_AUC_TOL,
    AUDIT_TPR_TOL,
    MEMBERSHIP_FORGET_TOL,
    SWEEP_RA_TOL,
    SWEEP_TIME,
    sweep_row,
)
from scaleflu.experiments.markdown import table_head, table_row
from scaleflu.plots import pyplot

__all__ = ["load_cells", "parity_rows", "parity_table", "plot_parity"]

REFERENCE = "retrain"
# the mean differences read, the tolerance band each must lie in: (low, high)
BANDS = {
    "d_audit_auc": (-AUDIT_AUC_TOL, AUDIT_AUC_TOL),
    "d_audit_tpr": (-math.inf, AUDIT_TPR_TOL),
    "d_ra_clean": (-SWEEP_RA_TOL, math.inf),
    "d_forget": (-math.inf, MEMBERSHIP_FORGET_TOL),
}
BAND_NAMES = {"d_audit_auc": "AUC", "d_audit_tpr": "TPR", "d_ra_clean": "RA", "d_forget": "FA"}


def load_cells(outs: Iterable[str | Path]) -> dict[Cell, dict[str, Any]]:
    """Every valid cell result under the Table II outputs ``outs``
    (``OUT/cells/<dataset>/<model>/a<alpha>/s<seed>/<request>/<method>/result.json``); a cell
    found under several outputs is taken from the last one given."""
    found: dict[Cell, dict[str, Any]] = {}
    for out in outs:
        root = Path(out)
        if not (root / "cells").is_dir():
            raise FileNotFoundError(f"{root}: no cells/ folder (not a Table II output)")
        for path in sorted(root.glob("cells/*/*/a*/s*/*/*/result.json")):
            ds, model, a, s, scenario, method = path.parts[-7:-1]
            try:
                key = RunKey(ds, model, float(a[1:]), int(s[1:]))
            except ValueError:
                continue  # not a cell folder
            res = read_result(path)
            if res is not None:
                found[Cell(key, scenario, method)] = res
    return found


def _ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and its 95 % Student-t interval (one value: the interval is unbounded)."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, -math.inf, math.inf
    half = float(student_t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return mean, mean - half, mean + half


def parity_rows(results: Mapping[Cell, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (dataset, model, request, method other than Retrain): the paired rows pooled.

    Only cells with a Retrain cell of the same run and request and an audit score count; the
    row lists the alphas and seeds it pooled, the per-run counts (``audit``, ``membership``,
    ``cpu``, ``all``: membership and cpu) and per difference the mean with its 95 % interval.
    """
    groups: dict[tuple[str, str, str, str], list[tuple[RunKey, dict[str, Any]]]] = {}
    for cell, res in sorted(results.items()):
        if cell.method == REFERENCE:
            continue
        ref = results.get(Cell(cell.run, cell.scenario, REFERENCE))
        if ref is None:
            continue
        row = sweep_row(res, ref)
        if row["d_audit_auc"] is not None:
            key = (cell.run.dataset, cell.run.model, cell.scenario, cell.method)
            groups.setdefault(key, []).append((cell.run, row))
    out = []
    for (ds, model, scenario, method), pairs in groups.items():
        rows = [row for _, row in pairs]
        ok = [r["ok"] for r in rows]
        entry: dict[str, Any] = {
            "dataset": ds,
            "model": model,
            "scenario": scenario,
            "method": method,
            "n": len(rows),
            "alphas": sorted({run.alpha for run, _ in pairs}),
            "seeds": sorted({run.seed for run, _ in pairs}),
            "runs_audit": sum(bool(o["audit"]) for o in ok),
            "runs_membership": sum(bool(o["membership"]) for o in ok),
            "runs_cpu": sum(bool(o["cpu"]) for o in ok),
            "runs_all": sum(bool(o["membership"] and o["cpu"]) for o in ok),
        }
        misses = []  # the targets the mean misses, by name
        for name, (lo_tol, hi_tol) in BANDS.items():
            vals = [r[name] for r in rows if r[name] is not None]
            entry[name] = None
            if vals:
                mean, lo, hi = _ci(vals)
                entry[name] = {"mean": mean, "lo": lo, "hi": hi, "n": len(vals)}
            if not vals or lo < lo_tol or hi > hi_tol:
                misses.append(BAND_NAMES[name])
        if entry["runs_cpu"] < len(rows):
            misses.append("cost")
        cpu = [r["cpu_ratio"] for r in rows if r["cpu_ratio"] is not None]
        entry["cpu_ratio"] = {
            "median": float(np.median(cpu)) if cpu else math.nan,
            "max": float(max(cpu)) if cpu else math.nan,
        }
        entry["misses"] = misses
        entry["at_the_mean"] = not misses
        out.append(entry)
    return out


def _fmt_ci(d: Mapping[str, float] | None) -> str:
    if d is None:
        return "--"
    lo = "-inf" if math.isinf(d["lo"]) else f"{d['lo']:+.3f}"
    hi = "inf" if math.isinf(d["hi"]) else f"{d['hi']:+.3f}"
    return f"{d['mean']:+.3f} [{lo}, {hi}]"


def parity_table(rows: Sequence[Mapping[str, Any]], labels: Mapping[str, str] | None = None) -> str:
    """Markdown of :func:`parity_rows` (empty string when there is no paired row)."""
    if not rows:
        return ""
    labels = labels or {}
    head = [
        "Model",
        "Request",
        "Method",
        "runs (alphas)",
        "per run: audit / membership / cost / all",
        "ΔAUC [95 % CI]",
        "ΔTPR@1%FPR [95 % CI]",
        "ΔRA clean [95 % CI]",
        "ΔFA [95 % CI]",
        "CPU / Retrain median / max",
        "at the mean",
    ]
    lines = table_head("Against Retrain's level (paired per run)", head)
    for e in sorted(rows, key=lambda r: (r["dataset"], r["model"], r["scenario"], r["method"])):
        n = e["n"]
        if e["at_the_mean"]:
            verdict = "yes"
        elif n < 2:
            verdict = "no (one run: no interval)"
        else:
            verdict = f"no ({', '.join(e['misses'])})"
        lines.append(
            table_row(
                [
                    e["model"],
                    e["scenario"],
                    labels.get(e["method"], e["method"]),
                    f"{n} ({', '.join(f'{a:g}' for a in e['alphas'])})",
                    f"{e['runs_audit']}/{n} / {e['runs_membership']}/{n} / "
                    f"{e['runs_cpu']}/{n} / {e['runs_all']}/{n}",
                    _fmt_ci(e["d_audit_auc"]),
                    _fmt_ci(e["d_audit_tpr"]),
                    _fmt_ci(e["d_ra_clean"]),
                    _fmt_ci(e["d_forget"]),
                    f"{e['cpu_ratio']['median']:.3f} / {e['cpu_ratio']['max']:.3f}",
                    verdict,
                ]
            )
        )
    lines += [
        "",
        f"Each cell against the Retrain cell of its run and request. Targets: the audit's AUC "
        f"within {AUDIT_AUC_TOL} of Retrain's and TPR at 1 % FPR at most {AUDIT_TPR_TOL} above "
        f"(audit); with RA on clean images and true labels at most {SWEEP_RA_TOL} below and the "
        f"forgetting (backdoor ASR, else FA) at most Retrain's + {MEMBERSHIP_FORGET_TOL} "
        f"(membership); CPU at most {SWEEP_TIME:.0%} of Retrain's (cost). Per run: runs meeting "
        "each, and all at once. At the mean: every 95 % interval (Student's t over the runs) "
        "inside its target and the cost met on every run; a few runs give wide intervals, so "
        "'no' can mean 'not shown'. A second, independently seeded Retrain meets the per-run "
        "targets against the first on only some runs: the per-run count is bounded by Retrain's "
        "own spread. The control failing the audit is the audit's power.",
    ]
    return "\n".join(lines)


def plot_parity(
    rows: Sequence[Mapping[str, Any]], path: str | Path, labels: Mapping[str, str] | None = None
) -> Path | None:
    """A forest plot of :func:`parity_rows`: per difference a panel, per (model, request,
    method) a line with the mean and its 95 % interval, the target shaded. None: no row."""
    if not rows:
        return None
    plt = pyplot()
    labels = labels or {}
    rows = sorted(rows, key=lambda r: (r["dataset"], r["model"], r["scenario"], r["method"]))
    names = [
        f"{r['model']} {r['scenario']} {labels.get(r['method'], r['method'])} (n={r['n']})"
        for r in rows
    ]
    panels = [
        ("d_audit_auc", "ΔAUC (audit)"),
        ("d_audit_tpr", "ΔTPR @ 1 % FPR"),
        ("d_ra_clean", "ΔRA (clean, true labels)"),
        ("d_forget", "ΔFA (or backdoor ASR)"),
    ]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3.6 * len(panels), 1.0 + 0.32 * len(rows)), sharey=True
    )
    ys = np.arange(len(rows))[::-1]
    for ax, (key, title) in zip(axes, panels, strict=True):
        lo_tol, hi_tol = BANDS[key]
        means, lo, hi = [], [], []
        for r in rows:
            d = r[key]
            m = math.nan if d is None else d["mean"]
            means.append(m)
            lo.append(0.0 if d is None or not math.isfinite(d["lo"]) else m - d["lo"])
            hi.append(0.0 if d is None or not math.isfinite(d["hi"]) else d["hi"] - m)
        finite = [
            abs(v)
            for m, a, b in zip(means, lo, hi, strict=True)
            for v in (m - a, m + b)
            if math.isfinite(v)
        ]
        span = max([0.1, *finite]) * 1.3
        ax.axvspan(max(lo_tol, -span), min(hi_tol, span), color="tab:green", alpha=0.15)
        ax.axvline(0.0, color="0.4", lw=0.8)
        colors = ["tab:blue" if r["at_the_mean"] else "tab:red" for r in rows]
        for y, m, a, b, c in zip(ys, means, lo, hi, colors, strict=True):
            if math.isfinite(m):
                ax.errorbar(m, y, xerr=[[a], [b]], fmt="o", color=c, ms=4, capsize=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlim(-span, span)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels(names, fontsize=7)
    fig.suptitle(
        "Against Retrain's level: mean paired difference and 95 % interval "
        "(green: the target; blue: at Retrain's level at the mean)",
        fontsize=9,
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
