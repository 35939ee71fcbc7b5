"""Table II (markdown + CSV) and the paper's figures from the harness's finished cells."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scaleflu.config import Config, as_config
from scaleflu.experiments.cells import Cell, plan_cells, read_result
from scaleflu.experiments.markdown import table_head, table_row
from scaleflu.experiments.paper import paper_value
from scaleflu.experiments.parity import parity_rows, parity_table, plot_parity

log = logging.getLogger(__name__)

METHOD_LABELS = {
    "retrain": "Retrain",
    "fedraser": "F-E",
    "pga": "PGA",
    "fused": "FUSED",
    "scale": "SCALE",
    "finetune": "Control",
    "finetune_matched": "Control (cost)",
    "not": "NoT",
}
COST_KEYS = ("wall_s", "cpu_s", "link_s", "bytes", "fl_rounds")
CONTROLS = ("finetune", "finetune_matched")  # no unlearning: k plain FedAvg rounds of D_r
# the protocol with power's columns: label, metrics key (docs/reproducing.md)
PROTOCOL_KEYS = (
    ("RA_clean", "ra_clean"),
    ("FA_clean", "fa_clean"),
    ("MIA_AUC", "mia_ref_auc"),
    ("MIA_TPR", "mia_ref_tpr_1fpr"),
    ("MIA_cm_loss_AUC", "mia_cm_loss_auc"),
    ("MIA_canary_AUC", "mia_canary_auc"),
    ("MIA_canary_TPR", "mia_canary_tpr_1fpr"),
    # the per-example membership audit (unlearn.audit): AUC, its interval, TPR at 1 % / 0.1 % FPR
    ("AUDIT_AUC", "audit_auc"),
    ("AUDIT_AUC_lo", "audit_auc_lo"),
    ("AUDIT_AUC_hi", "audit_auc_hi"),
    ("AUDIT_TPR1", "audit_tpr_1fpr"),
    ("AUDIT_TPR01", "audit_tpr_01fpr"),
    ("AUDIT_n", "audit_n"),
)
ORIGINAL = "original"  # pseudo-method: the trained model before unlearning (every cell has it)


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    for p in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(p)
    return d


def load_results(out: Path, cells: Sequence[Cell]) -> dict[Cell, dict[str, Any]]:
    """Valid results of the given cells (missing and failed cells left out)."""
    res = {}
    for c in cells:
        r = read_result(c.dir(out) / "result.json")
        if r is not None:
            res[c] = r
    return res


def load_failures(out: Path, cells: Sequence[Cell]) -> dict[Cell, str]:
    """The reason of every cell that failed and has no result (its ``error.json``)."""
    res = {}
    for c in cells:
        d = c.dir(out)
        if read_result(d / "result.json") is not None:
            continue
        try:
            err = json.loads((d / "error.json").read_text())
        except (OSError, ValueError):
            continue
        res[c] = str(err.get("error") or "failed") if isinstance(err, dict) else "failed"
    return res


def cell_values(r: Mapping[str, Any], fa_metric: str, aoi_metric: str) -> dict[str, float | None]:
    """RA, FA, Avg AoI and cost numbers of one result."""
    vals: dict[str, float | None] = {
        "RA": _get(r, "metrics", "ra"),
        "FA": _get(r, "metrics", fa_metric),
        "AoI_s": (
            _get(r, "details", "aoi_time_avg_s")
            if aoi_metric == "time_avg"
            else _get(r, "aoi", aoi_metric)
        ),
        "test_acc": _get(r, "metrics", "test_acc"),
    }
    for k in COST_KEYS:
        vals[k] = _get(r, "cost", k)
    for label, key in PROTOCOL_KEYS:
        vals[label] = _get(r, "metrics", key)
    return vals


def original_values(
    r: Mapping[str, Any], fa_metric: str, aoi_metric: str
) -> dict[str, float | None]:
    """The same numbers for the trained model before unlearning (the result's ``original``)."""
    vals = cell_values({"metrics": r.get("original") or {}}, fa_metric, aoi_metric)
    vals["AoI_s"] = None
    for k in COST_KEYS:
        vals[k] = None
    return vals


def _stats(xs: Sequence[float | None]) -> tuple[float, float, int]:
    v = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not v:
        return float("nan"), float("nan"), 0
    return float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, len(v)


def summarise(
    cfg: Config,
    results: Mapping[Cell, Mapping[str, Any]],
    alpha: float,
    failures: Mapping[Cell, str] | None = None,
) -> list[dict[str, Any]]:
    """Long-format rows: dataset, model, scenario, method, metric, mean, std, n, delta.

    ``failures`` (cell -> reason): every row of a method also counts its failed seeds
    (``failed``) and names the first reason (``failed_reason``); they are never scored.
    """
    failures = failures or {}
    exp = cfg.experiment
    fa_metric, aoi_metric = str(exp.fa_metric), str(exp.aoi_metric)
    rows = []
    for ds in exp.datasets:
        for model in exp.models:
            for sc in exp.scenarios:
                per_method: dict[str, dict[int, dict[str, float | None]]] = {}
                for c, r in results.items():
                    k = c.run
                    if (k.dataset, k.model, k.alpha, c.scenario) != (ds, model, alpha, sc):
                        continue
                    per_method.setdefault(c.method, {})[k.seed] = cell_values(
                        r, fa_metric, aoi_metric
                    )
                    per_method.setdefault(ORIGINAL, {}).setdefault(
                        k.seed, original_values(r, fa_metric, aoi_metric)
                    )
                ref = per_method.get("retrain", {})
                labels = [p[0] for p in PROTOCOL_KEYS]
                for m in [*exp.methods, ORIGINAL]:
                    seeds = per_method.get(m, {})
                    why = sorted(
                        (c.run.seed, r)
                        for c, r in failures.items()
                        if c.method == m
                        and (c.run.dataset, c.run.model, c.run.alpha, c.scenario)
                        == (ds, model, alpha, sc)
                    )
                    for metric in ("RA", "FA", "AoI_s", "test_acc", *COST_KEYS, *labels):
                        mean, std, n = _stats([v[metric] for v in seeds.values()])
                        deltas = [
                            (v[metric] - ref[s][metric])
                            if s in ref and v[metric] is not None and ref[s][metric] is not None
                            else None
                            for s, v in seeds.items()
                        ]
                        dm, ds_, dn = _stats(deltas)
                        rows.append(
                            {
                                "dataset": ds,
                                "model": model,
                                "scenario": sc,
                                "method": m,
                                "metric": metric,
                                "mean": mean,
                                "std": std,
                                "n": n,
                                "delta_mean": dm if dn else float("nan"),
                                "delta_std": ds_ if dn else float("nan"),
                                "failed": len(why),
                                "failed_reason": why[0][1] if why else "",
                            }
                        )
    return rows


def _fmt(mean: float, std: float, n: int, digits: int = 2) -> str:
    if n == 0 or not math.isfinite(mean):
        return "--"
    s = f"{mean:.{digits}f}"
    if n > 1:
        s += f"±{std:.{digits}f}"
    return s


def _fmt_row(r: Mapping[str, Any] | None, digits: int = 2) -> str:
    """A summarised cell, or ``FAILED`` (never scored) when every seed failed; ``[k failed]``
    after the value when some did."""
    if r is None:
        return "--"
    failed = int(r.get("failed") or 0)
    if failed and not r["n"]:
        return "FAILED"
    txt = _fmt(r["mean"], r["std"], r["n"], digits)
    return txt + (f" [{failed} failed]" if failed else "")


def _fmt_delta(dm: float, digits: int = 2) -> str:
    if not math.isfinite(dm):
        return ""
    return f" ({dm:+.{digits}f})"


def _fmt_paper(ds: str, sc: str, model: str, method: str, metric: str, digits: int) -> str:
    """`` [paper x]`` when the paper's Table II has a value for this cell, else ``""``."""
    v = paper_value(ds, sc, model, method, metric)
    return "" if v is None else f" [paper {v:.{digits}f}]"


def markdown_table(cfg: Config, rows: Sequence[Mapping[str, Any]], title: str) -> str:
    """Table II shape: rows model x scenario; RA, FA, Avg AoI (s) per method with deltas."""
    exp = cfg.experiment
    methods = list(exp.methods)
    idx = {(r["dataset"], r["model"], r["scenario"], r["method"], r["metric"]): r for r in rows}
    head = ["Dataset", "Scenario", "Model"]
    for metric, arrow in (("RA", "↑"), ("FA", "↓"), ("Avg AoI (s)", "↓")):
        head += [f"{metric} {arrow} {METHOD_LABELS.get(m, m)}" for m in methods]
    lines = table_head(title, head)
    for ds in exp.datasets:
        for sc in exp.scenarios:
            for model in exp.models:
                cells = [ds, sc, model]
                for metric, digits in (("RA", 2), ("FA", 2), ("AoI_s", 2)):
                    for m in methods:
                        r = idx.get((ds, model, sc, m, metric))
                        if r is None:
                            cells.append("--")
                            continue
                        txt = _fmt_row(r, digits)
                        if m != "retrain" and r["n"]:
                            txt += _fmt_delta(r["delta_mean"], digits)
                        cells.append(txt + _fmt_paper(ds, sc, model, m, metric, digits))
                lines.append(table_row(cells))
    lines.append("")
    lines.append(
        "Values: mean over seeds (± sample std when more than one seed); in parentheses the "
        "mean of the per-seed difference to Retrain; in brackets the paper's Table II value "
        "of the cell (none for the controls). `--`: no finished cell. FAILED: every seed's "
        "cell failed (e.g. a non-finite model), never scored; `[k failed]`: k seeds failed and "
        "the value is over the others; the reasons are listed under the tables."
    )
    return "\n".join(lines)


def protocol_table(cfg: Config, rows: Sequence[Mapping[str, Any]]) -> str:
    """The protocol with power per scenario and method, the trained model as the first anchor."""
    exp = cfg.experiment
    idx = {(r["dataset"], r["model"], r["scenario"], r["method"], r["metric"]): r for r in rows}
    cols = [
        ("RA", "RA (held labels)"),
        ("RA_clean", "RA (true labels)"),
        ("FA", f"FA ({exp.fa_metric})"),
        ("FA_clean", "FA (true labels)"),
        ("MIA_AUC", "MIA AUC (calibrated)"),
        ("MIA_TPR", "TPR @ 1 % FPR"),
        ("MIA_cm_loss_AUC", "MIA AUC (loss, class-matched)"),
        ("MIA_canary_AUC", "canary MIA AUC (calibrated)"),
        ("MIA_canary_TPR", "canary TPR @ 1 % FPR"),
        ("test_acc", "test acc"),
    ]
    head = ["Dataset", "Scenario", "Model", "Method", *[c[1] for c in cols]]
    lines = table_head("Protocol with power", head)
    for ds in exp.datasets:
        for sc in exp.scenarios:
            for model in exp.models:
                for m in [ORIGINAL, *exp.methods]:
                    cells = [
                        ds,
                        sc,
                        model,
                        "Original (trained)" if m == ORIGINAL else METHOD_LABELS.get(m, m),
                    ]
                    for metric, _ in cols:
                        r = idx.get((ds, model, sc, m, metric))
                        txt = _fmt_row(r, 3)
                        cells.append(txt + _fmt_paper(ds, sc, model, m, metric, 2))
                    lines.append(table_row(cells))
    lines.append("")
    lines.append(
        "Original = the trained model before unlearning; Retrain and Original are the anchors. "
        "MIA: reference-model attack on D_u against class-matched held-out non-members "
        "(0.5 AUC / 0.01 TPR: no trace of D_u); canary MIA: the same attack on D_u's membership "
        "canaries against their held-out twins (data.poison.canaries); `--`: not measured (no "
        "reference models, or no canary in D_u); [paper x]: the paper's Table II value."
    )
    return "\n".join(lines)


def audit_table(
    cfg: Config, rows: Sequence[Mapping[str, Any]], sets: Mapping[tuple[str, str, str], str]
) -> str:
    """The per-example membership audit per scenario and method (a Table II column group).

    ``sets``: (dataset, model, scenario) -> what was audited (canaries / forget sample, n).
    """
    exp = cfg.experiment
    idx = {(r["dataset"], r["model"], r["scenario"], r["method"], r["metric"]): r for r in rows}
    head = [
        "Dataset",
        "Scenario",
        "Model",
        "audited",
        "Method",
        "AUC",
        "AUC 95 % CI (mean of seeds)",
        "ΔAUC vs Retrain",
        "TPR @ 1 % FPR",
        "TPR @ 0.1 % FPR",
    ]
    lines = table_head("Membership audit (per example, offline LiRA on shadow federations)", head)
    any_row = False
    for ds in exp.datasets:
        for sc in exp.scenarios:
            for model in exp.models:
                what = sets.get((ds, model, sc), "--")
                for m in [ORIGINAL, *exp.methods]:
                    r = idx.get((ds, model, sc, m, "AUDIT_AUC"))
                    if r is None or (not r["n"] and not r.get("failed")):
                        continue
                    any_row = True
                    lo = idx.get((ds, model, sc, m, "AUDIT_AUC_lo"))
                    hi = idx.get((ds, model, sc, m, "AUDIT_AUC_hi"))
                    ci = "--"
                    if lo and hi and lo["n"] and hi["n"]:
                        ci = f"[{lo['mean']:.3f}, {hi['mean']:.3f}]"
                    delta = ""
                    if m not in ("retrain", ORIGINAL) and r["n"]:
                        delta = _fmt_delta(r["delta_mean"], 3).strip(" ()")
                    lines.append(
                        table_row(
                            [
                                ds,
                                sc,
                                model,
                                what,
                                "Original (trained)" if m == ORIGINAL else METHOD_LABELS.get(m, m),
                                _fmt_row(r, 3),
                                ci,
                                delta or "--",
                                _fmt_row(idx.get((ds, model, sc, m, "AUDIT_TPR1")), 3),
                                _fmt_row(idx.get((ds, model, sc, m, "AUDIT_TPR01")), 3),
                            ]
                        )
                    )
    if not any_row:
        return ""
    lines.append("")
    lines.append(
        "Per request: D_u's membership canaries against their held-out twins (or, with fewer "
        "than `scale.eval.canary_min` canaries in D_u, a class-matched sample of D_u against "
        "held-out images), each scored against the mean of the shadow federations that did not "
        'hold it (docs/reproducing.md, "The membership audit"). 0.5 AUC: the forgotten '
        "examples look like never-seen ones; compare with Retrain's. With n negatives the "
        "smallest resolvable FPR is 1/n: below it the TPR counts positives above every negative."
    )
    return "\n".join(lines)


def audit_cost(out: Path) -> str:
    """What the audit's shadow federations cost per run (their ``meta.json``), one line."""
    per_run = []
    what = set()
    for meta in sorted(out.glob("runs/*/audit/*/meta.json")):
        try:
            d = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        cpu = d.get("train_cpu_s") or {}
        if cpu:
            per_run.append(sum(float(v) for v in cpu.values()))
            what.add(f"{d.get('shadows')} shadows of {d.get('rounds')} rounds")
    if not per_run:
        return ""
    return (
        f"Audit cost: {', '.join(sorted(what))} per run, trained once and shared by every cell "
        f"of the run: {np.mean(per_run):.0f} CPU s per run on average ({min(per_run):.0f}-"
        f"{max(per_run):.0f}, {len(per_run)} runs; {sum(per_run):.0f} CPU s in all)."
    )


def failure_list(out: Path, failures: Mapping[Cell, str]) -> str:
    """Every failed cell and its reason (Markdown list)."""
    if not failures:
        return ""
    lines = ["### Failed cells (not scored)", ""]
    for c, why in sorted(failures.items()):
        lines.append(f"* `{c.dir(Path()).as_posix()}`: {why}")
    return "\n".join(lines)


def control_verdicts(cfg: Config, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each method against each control present: does it forget more at equal RA?

    Equal RA: the method's mean RA is at least the control's minus ``experiment.control_ra_tol``.
    Beating it: mean FA, or a calibrated MIA AUC's distance from 0.5 (class-matched, on the
    membership canaries, or the per-example audit's), lower than the control's by more than
    ``experiment.control_margin``.
    An AUC far *below* 0.5 is a trace too (the attack separates D_u with the sign flipped, as
    after a collapse of the model), not forgetting. Otherwise the verdict says that it does not
    beat the control.
    """
    exp = cfg.experiment
    tol = float(exp.control_ra_tol)
    margin = float(exp.control_margin)
    idx = {(r["dataset"], r["model"], r["scenario"], r["method"], r["metric"]): r for r in rows}

    def mean(ds: str, model: str, sc: str, m: str, metric: str) -> float | None:
        r = idx.get((ds, model, sc, m, metric))
        return r["mean"] if r is not None and r["n"] and math.isfinite(r["mean"]) else None

    out = []
    for ds in exp.datasets:
        for model in exp.models:
            for sc in exp.scenarios:
                for ctl in (c for c in CONTROLS if c in exp.methods):
                    for m in exp.methods:
                        if m in CONTROLS:
                            continue
                        v = {
                            k: (mean(ds, model, sc, m, k), mean(ds, model, sc, ctl, k))
                            for k in ("RA", "FA", "MIA_AUC", "MIA_canary_AUC", "AUDIT_AUC")
                        }
                        if v["RA"][0] is None or v["RA"][1] is None:
                            continue
                        better = [
                            k
                            for k in ("FA", "MIA_AUC", "MIA_canary_AUC", "AUDIT_AUC")
                            if None not in v[k] and _trace(k, v[k][0]) + margin < _trace(k, v[k][1])
                        ]
                        if v["RA"][0] < v["RA"][1] - tol:
                            verdict = "lower RA than the control" + (
                                f" (forgets more on {', '.join(better)})" if better else ""
                            )
                        elif better:
                            verdict = f"beats the control on {', '.join(better)}"
                        else:
                            verdict = "does NOT beat the control (FA, MIA) at equal RA"
                        out.append(
                            {
                                "dataset": ds,
                                "model": model,
                                "scenario": sc,
                                "method": m,
                                "control": ctl,
                                "verdict": verdict,
                                **{f"{k}_{w}": v[k][i] for k in v for i, w in enumerate("mc")},
                            }
                        )
    return out


def _trace(metric: str, value: float) -> float:
    """What the verdict compares: FA itself, an MIA AUC's distance from 0.5 (no trace)."""
    return abs(value - 0.5) if metric.startswith(("MIA", "AUDIT")) else value


def verdict_table(verdicts: Sequence[Mapping[str, Any]]) -> str:
    """Markdown of :func:`control_verdicts`."""
    head = [
        "Scenario",
        "Model",
        "Method",
        "vs",
        "RA",
        "RA ctl",
        "FA",
        "FA ctl",
        "MIA",
        "MIA ctl",
        "canary MIA",
        "canary MIA ctl",
        "audit AUC",
        "audit AUC ctl",
        "verdict",
    ]
    lines = table_head("Against the control", head)

    def f(x: float | None) -> str:
        return "--" if x is None else f"{x:.3f}"

    for v in verdicts:
        lines.append(
            table_row(
                [
                    v["scenario"],
                    v["model"],
                    METHOD_LABELS.get(v["method"], v["method"]),
                    METHOD_LABELS.get(v["control"], v["control"]),
                    f(v["RA_m"]),
                    f(v["RA_c"]),
                    f(v["FA_m"]),
                    f(v["FA_c"]),
                    f(v["MIA_AUC_m"]),
                    f(v["MIA_AUC_c"]),
                    f(v["MIA_canary_AUC_m"]),
                    f(v["MIA_canary_AUC_c"]),
                    f(v["AUDIT_AUC_m"]),
                    f(v["AUDIT_AUC_c"]),
                    v["verdict"],
                ]
            )
        )
    return "\n".join(lines)


def cost_table(cfg: Config, rows: Sequence[Mapping[str, Any]]) -> str:
    """Cost per method and scenario: wall seconds, link seconds, MB on the link, FL rounds."""
    exp = cfg.experiment
    idx = {(r["dataset"], r["model"], r["scenario"], r["method"], r["metric"]): r for r in rows}
    head = [
        "Dataset",
        "Scenario",
        "Model",
        "Method",
        "wall (s)",
        "CPU (s)",
        "link (s)",
        "MB",
        "FL rounds",
        "test acc",
    ]
    lines = table_head("Cost", head)
    for ds in exp.datasets:
        for sc in exp.scenarios:
            for model in exp.models:
                for m in exp.methods:

                    def g(metric: str, scale: float = 1.0, digits: int = 1) -> str:
                        r = idx.get((ds, model, sc, m, metric))  # noqa: B023
                        if r is None or not r["n"]:
                            return "--"
                        return _fmt(r["mean"] * scale, r["std"] * scale, r["n"], digits)

                    lines.append(
                        table_row(
                            [
                                ds,
                                sc,
                                model,
                                METHOD_LABELS.get(m, m),
                                g("wall_s"),
                                g("cpu_s"),
                                g("link_s"),
                                g("bytes", 1e-6, 2),
                                g("fl_rounds", 1.0, 0),
                                g("test_acc", 1.0, 3),
                            ]
                        )
                    )
    return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Long-format CSV of :func:`summarise` rows, with the paper's value where it has one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = [
        "dataset",
        "model",
        "scenario",
        "method",
        "metric",
        "mean",
        "std",
        "n",
        "delta_mean",
        "delta_std",
        "paper",
    ]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            paper = paper_value(r["dataset"], r["scenario"], r["model"], r["method"], r["metric"])
            w.writerow({**{k: r[k] for k in cols[:-1]}, "paper": "" if paper is None else paper})
    return path


# ----------------------------------------------------------------------------- figures


# matplotlib set-up and smoothing: scaleflu.plots (one place for every figure's plumbing).
from scaleflu.plots import pyplot as _plt  # noqa: E402
from scaleflu.plots import smooth as _smooth  # noqa: E402


def _first_scale_result(
    results: Mapping[Cell, Mapping[str, Any]], ds: str, model: str, scenario: str, alpha: float
) -> Mapping[str, Any] | None:
    """SCALE's result of the lowest seed for one (data set, model, scenario, alpha), if any."""
    seeds = sorted(
        (
            (c.run.seed, r)
            for c, r in results.items()
            if c.method == "scale"
            and c.scenario == scenario
            and c.run.model == model
            and c.run.dataset == ds
            and c.run.alpha == alpha
        ),
        key=lambda item: item[0],
    )
    return seeds[0][1] if seeds else None


def plot_table2_ppo(
    cfg: Config, results: Mapping[Cell, Mapping[str, Any]], alpha: float, out: Path
) -> list[Path]:
    """PPO episode return per scenario (one panel each), one line per model (first seed)."""
    plt = _plt()
    exp = cfg.experiment
    paths = []
    scen = list(exp.scenarios)
    for ds in exp.datasets:
        fig, axes = plt.subplots(1, len(scen), figsize=(4.2 * len(scen), 3.2), squeeze=False)
        any_line = False
        for ax, sc in zip(axes[0], scen, strict=True):
            for model in exp.models:
                first = _first_scale_result(results, ds, model, sc, alpha)
                if first is None:
                    continue
                ret = np.asarray(first["details"].get("episode_returns") or [], float)
                if len(ret) == 0:
                    continue
                x, y = _smooth(ret)
                ax.plot(x, y, label=model)
                any_line = True
            ax.set_title(f"{sc} unlearning reward")
            ax.set_xlabel("episode")
            ax.set_ylabel("return (smoothed)")
            if ax.get_legend_handles_labels()[0]:  # an empty panel gets no empty legend
                ax.legend(fontsize=8)
        if any_line:
            fig.tight_layout()
            p = out / f"ppo_convergence_{ds}.png"
            fig.savefig(p, dpi=120)
            paths.append(p)
        plt.close(fig)
    return paths


def plot_table2_sensitivity(
    cfg: Config, results: Mapping[Cell, Mapping[str, Any]], alpha: float, out: Path
) -> list[Path]:
    """SCALE's combined layer sensitivity per model, one bar group per scenario (first seed)."""
    plt = _plt()
    exp = cfg.experiment
    paths = []
    for ds in exp.datasets:
        for model in exp.models:
            per_sc = {}
            for sc in exp.scenarios:
                first = _first_scale_result(results, ds, model, sc, alpha)
                sens = _get(first, "details", "sensitivity") if first else None
                if sens:
                    per_sc[sc] = sens
            if not per_sc:
                continue
            layers = [e["layer"] for e in next(iter(per_sc.values()))["layers"]]
            fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(layers) + 2), 3.4))
            w = 0.8 / len(per_sc)
            for i, (sc, sens) in enumerate(per_sc.items()):
                score = {e["layer"]: e["score"] for e in sens["layers"]}
                top = set(sens.get("top") or [])
                xs = [j + (i - (len(per_sc) - 1) / 2) * w for j in range(len(layers))]
                color = f"C{i}"
                for x, n in zip(xs, layers, strict=True):
                    sel = n in top
                    ax.bar(
                        x,
                        score.get(n, 0.0),
                        w,
                        color=color,
                        alpha=1.0 if sel else 0.35,
                        hatch="//" if sel else None,
                        edgecolor="k" if sel else color,
                        label=sc if n == layers[0] else None,
                    )
            ax.set_xticks(range(len(layers)))
            ax.set_xticklabels(
                [n.removesuffix(".weight") for n in layers], rotation=45, ha="right", fontsize=7
            )
            ax.set_ylabel("sensitivity S_l")
            ax.set_title(f"{model} layer sensitivity ({ds}; top-M hatched)")
            ax.legend(fontsize=8)
            fig.tight_layout()
            p = out / f"layer_sensitivity_{ds}_{model}.png"
            fig.savefig(p, dpi=120)
            plt.close(fig)
            paths.append(p)
    return paths


def plot_table2_sum_aoi(
    cfg: Config, results: Mapping[Cell, Mapping[str, Any]], alpha: float, out: Path
) -> list[Path]:
    """Sum AoI over SCALE's unlearning steps: one panel per model, one line per scenario."""
    plt = _plt()
    exp = cfg.experiment
    paths = []
    models = list(exp.models)
    for ds in exp.datasets:
        fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.2), squeeze=False)
        any_line = False
        for ax, model in zip(axes[0], models, strict=True):
            for sc in exp.scenarios:
                first = _first_scale_result(results, ds, model, sc, alpha)
                tr = _get(first, "aoi", "sum_s_trace") if first else None
                if tr:
                    ax.plot(range(1, len(tr) + 1), tr, marker="o", ms=3, label=sc)
                    any_line = True
            ax.set_title(f"Sum AoI with {model}")
            ax.set_xlabel("unlearning step")
            ax.set_ylabel("Sum AoI (s)")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        if any_line:
            fig.tight_layout()
            p = out / f"sum_aoi_{ds}.png"
            fig.savefig(p, dpi=120)
            paths.append(p)
        plt.close(fig)
    return paths


def plot_table2_alpha(
    cfg: Config, results: Mapping[Cell, Mapping[str, Any]], out: Path
) -> list[Path]:
    """RA and FA against the Dirichlet alpha per scenario, a line per model x method."""
    plt = _plt()
    exp = cfg.experiment
    sweep = exp.alpha_sweep
    alphas = sorted({float(a) for a in sweep.alphas})
    if not alphas:
        return []
    alphas = sorted(set(alphas) | {float(cfg.data.alpha)})
    scen = list(sweep.scenarios or exp.scenarios)
    methods = list(sweep.methods or exp.methods)
    models = list(sweep.models or exp.models)
    fa_metric = str(exp.fa_metric)
    paths = []
    for ds in exp.datasets:
        fig, axes = plt.subplots(2, len(scen), figsize=(4.2 * len(scen), 6), squeeze=False)
        any_line = False
        for j, sc in enumerate(scen):
            for model in models:
                for m in methods:
                    ra, fa, xs = [], [], []
                    for a in alphas:
                        vals = [
                            cell_values(r, fa_metric, "mean_s")
                            for c, r in results.items()
                            if c.method == m
                            and c.scenario == sc
                            and c.run.model == model
                            and c.run.dataset == ds
                            and c.run.alpha == a
                        ]
                        if vals:
                            xs.append(a)
                            ra.append(_stats([v["RA"] for v in vals])[0])
                            fa.append(_stats([v["FA"] for v in vals])[0])
                    if xs:
                        lab = f"{model} {METHOD_LABELS.get(m, m)}"
                        axes[0][j].plot(xs, ra, marker="o", label=lab)
                        axes[1][j].plot(xs, fa, marker="s", label=lab)
                        any_line = True
            axes[0][j].set_title(f"{sc} unlearning")
            axes[0][j].set_ylabel("RA")
            axes[1][j].set_ylabel(f"FA ({fa_metric})")
            axes[1][j].set_xlabel("Dirichlet alpha")
            axes[0][j].legend(fontsize=7)
        if any_line:
            fig.tight_layout()
            p = out / f"alpha_sweep_{ds}.png"
            fig.savefig(p, dpi=120)
            paths.append(p)
        plt.close(fig)
    return paths


def write_report(cfg: Config | Config, out: str | Path) -> dict[str, Path]:
    """Write table2.md, table2.csv and figures/*.png from the finished cells under ``out``."""
    cfg = as_config(cfg)
    out = Path(out)
    main, sweep = plan_cells(cfg)
    results = load_results(out, main + sweep)
    failures = load_failures(out, main + sweep)
    alpha = float(cfg.data.alpha)
    rows = summarise(cfg, results, alpha, failures)
    exp = cfg.experiment
    n_missing = len(main) - sum(1 for c in main if c in results)
    title = (
        f"Table II (measured): alpha={alpha:g}, seeds {list(exp.seeds)}, "
        f"FA = {exp.fa_metric}, Avg AoI = aoi.{exp.aoi_metric}"
    )
    md = [markdown_table(cfg, rows, title), "", protocol_table(cfg, rows), ""]
    sets = {}
    for c, r in results.items():
        name = _get(r, "metrics", "audit_set")
        if name and c.run.alpha == alpha:
            n = _get(r, "metrics", "audit_n")
            sets[(c.run.dataset, c.run.model, c.scenario)] = f"{name} ({n})"
    audit = audit_table(cfg, rows, sets)
    if audit:
        md += [audit, ""]
        cost = audit_cost(out)
        if cost:
            md += [cost, ""]
    par_rows = parity_rows(results)
    parity = parity_table(par_rows, METHOD_LABELS)
    if parity:
        md += [parity, "", "![against Retrain's level](figures/parity.png)", ""]
    verdicts = control_verdicts(cfg, rows)
    if verdicts:
        md += [verdict_table(verdicts), ""]
    md.append(cost_table(cfg, rows))
    fails = failure_list(out, failures)
    if fails:
        md += ["", fails]
    if n_missing:
        md.append(f"\n{n_missing} of {len(main)} cells have no finished result (see summary.json).")
    paths: dict[str, Path] = {}
    paths["markdown"] = out / "table2.md"
    paths["markdown"].write_text("\n".join(md) + "\n")
    paths["csv"] = write_csv(rows, out / "table2.csv")
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    par_fig = plot_parity(par_rows, figs / "parity.png", METHOD_LABELS)
    if par_fig is not None:
        paths["parity"] = par_fig
    for p in (
        plot_table2_ppo(cfg, results, alpha, figs)
        + plot_table2_sensitivity(cfg, results, alpha, figs)
        + plot_table2_sum_aoi(cfg, results, alpha, figs)
        + plot_table2_alpha(cfg, results, figs)
    ):
        paths[p.stem] = p
    return paths
