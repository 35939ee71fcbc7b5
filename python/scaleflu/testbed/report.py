"""The testbed report: JSON, plots (accuracy, bytes on air, AoI, RA/FA) and a text summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger(__name__)


def _clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


def write_report(report: Mapping[str, Any], run_dir: str | Path, plots: bool = True) -> Path:
    """Write ``report.json`` and the PNG plots into ``run_dir``; return the JSON path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "report.json"
    path.write_text(json.dumps(_clean(dict(report)), indent=1, default=str))
    if plots:
        try:
            plot_report(report, run_dir)
        except Exception:  # a plotting problem must not lose the report
            log.exception("plots failed")
    return path


def plot_report(report: Mapping[str, Any], run_dir: Path) -> list[Path]:
    """Accuracy per round, bytes on air per round, AoI per round, RA/FA per robot."""
    from scaleflu.plots import pyplot

    plt = pyplot()

    rows = report.get("rounds") or []
    out = []
    if rows:
        t = [r["round"] for r in rows]
        fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
        ax[0].plot(t, [r.get("test_acc") for r in rows], "o-", label="test accuracy")
        if any(r.get("asr") is not None for r in rows):
            ax[0].plot(t, [r.get("asr") for r in rows], "s--", label="backdoor ASR")
        un = report.get("unlearning") or {}
        sm = un.get("server_metrics") or {}
        if sm.get("test_acc") is not None:
            ax[0].plot([t[-1] + 1], [sm["test_acc"]], "r*", ms=12, label="after unlearning")
        ax[0].set(
            xlabel="round", ylabel="fraction", title="server: accuracy per round", ylim=(0, 1)
        )
        ax[0].legend(fontsize=8)
        ax[1].bar(t, [r.get("air_bytes", 0) / 1e6 for r in rows])
        if un.get("deploy_air_bytes") is not None:
            ax[1].bar(
                [t[-1] + 1],
                [un["deploy_air_bytes"] / 1e6],
                color="tab:red",
                label="unlearned model + evals",
            )
            ax[1].legend(fontsize=8)
        ax[1].set(xlabel="round", ylabel="MB", title="bytes on air (ARQ frames, all nodes)")
        ax[2].plot(t, [r.get("aoi_s") for r in rows], "o-", label="end of round")
        if un.get("aoi_after_deploy_s") is not None:
            ax[2].plot([t[-1] + 1], [un["aoi_after_deploy_s"]], "r*", ms=12, label="after deploy")
        ax[2].set(xlabel="round", ylabel="s", title="AoI of parameter groups at the robots")
        ax[2].legend(fontsize=8)
        from matplotlib.ticker import MaxNLocator

        for a in ax:
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        p = run_dir / "rounds.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(p)
    un = report.get("unlearning") or {}
    before, after = un.get("robots_before") or {}, un.get("robots_after") or {}
    robots = sorted({int(r) for r in list(before) + list(after)})
    if robots:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        labels, vb, va = [], [], []
        for r in robots:
            mb = (before.get(r) or before.get(str(r)) or {}).get("metrics", {})
            ma = (after.get(r) or after.get(str(r)) or {}).get("metrics", {})
            for key in ("ra", "fa", "test_acc", "asr"):
                if mb.get(key) is not None or ma.get(key) is not None:
                    labels.append(f"R{r} {key.upper()}")
                    vb.append(mb.get(key) or 0.0)
                    va.append(ma.get(key) or 0.0)
        x = list(range(len(labels)))
        ax.bar([i - 0.2 for i in x], vb, 0.4, label="before")
        ax.bar([i + 0.2 for i in x], va, 0.4, label="after unlearning")
        ax.set_xticks(x, labels, rotation=60, fontsize=7)
        ax.set(ylim=(0, 1), title=f"robots' own measurements ({un.get('method')})")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = run_dir / "robots_ra_fa.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        out.append(p)
    side = plot_side_by_side(un, run_dir)
    if side is not None:
        out.append(side)
    return out


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def print_summary(report: Mapping[str, Any], fh: TextIO) -> None:
    """A human-readable summary of the run (the apps print it at the end)."""
    w = fh.write
    w("\n=== SCALE testbed summary ===\n")
    w(
        f"{'round':>5} {'test acc':>8} {'ASR':>6} {'robots':>10} {'missing':>8} "
        f"{'rejected':>8} {'air MB':>7} {'AoI s':>6} {'wall s':>6}\n"
    )
    for r in report.get("rounds") or []:
        w(
            f"{r['round']:>5} {_f(r.get('test_acc')):>8} {_f(r.get('asr')):>6} "
            f"{','.join(map(str, r.get('participants', []))):>10} "
            f"{','.join(map(str, r.get('missing', []))) or '-':>8} {r.get('rejected', 0):>8} "
            f"{r.get('air_bytes', 0) / 1e6:>7.2f} {_f(r.get('aoi_s'), '{:.1f}'):>6} "
            f"{_f(r.get('wall_s'), '{:.1f}'):>6}\n"
        )
    un = report.get("unlearning")
    if un and un.get("error"):
        w(f"\nunlearning of {un.get('request', {}).get('text')} FAILED: {un['error']}\n")
    elif un:
        req = un.get("request", {})
        w(
            f"\nunlearning: robot {req.get('robot')} asked '{req.get('text')}' -> "
            f"{un.get('method')} ({un.get('mode')}), protocol {un.get('protocol')}\n"
        )
        w(
            f"  unlearning {un.get('unlearn_s', 0):.1f}s on the server, deployment "
            f"{un.get('deploy_s', 0):.1f}s, {un.get('deploy_air_bytes', 0) / 1e6:.2f} MB on air, "
            f"AoI after deploy {_f(un.get('aoi_after_deploy_s'), '{:.1f}')}s\n"
        )
        sm, so = un.get("server_metrics") or {}, un.get("server_original") or {}
        w(
            f"  server: test acc {_f(so.get('test_acc'))} -> {_f(sm.get('test_acc'))}, "
            f"FA ({un.get('protocol')}) {_f(so.get('fa_protocol'))} -> "
            f"{_f(sm.get('fa_protocol'))}, "
            f"backdoor ASR {_f(so.get('backdoor_asr'))} -> {_f(sm.get('backdoor_asr'))}\n"
        )
        w(
            f"  {'robot':>5} {'RA before':>9} {'RA after':>8} {'FA before':>9} {'FA after':>8} "
            f"{'ASR bef.':>8} {'ASR aft.':>8} {'bit-exact':>9}\n"
        )
        before, after = un.get("robots_before") or {}, un.get("robots_after") or {}
        exact = un.get("bit_exact") or {}
        for r in sorted({int(k) for k in list(before) + list(after)}):
            mb = (before.get(r) or before.get(str(r)) or {}).get("metrics", {})
            ma = (after.get(r) or after.get(str(r)) or {}).get("metrics", {})
            ex = exact.get(r, exact.get(str(r)))
            w(
                f"  {r:>5} {_f(mb.get('ra')):>9} {_f(ma.get('ra')):>8} {_f(mb.get('fa')):>9} "
                f"{_f(ma.get('fa')):>8} {_f(mb.get('asr')):>8} {_f(ma.get('asr')):>8} "
                f"{str(ex):>9}\n"
            )
    if un and not un.get("error"):
        print_side_by_side(un, fh)
    rc = report.get("rejection_counts") or {}
    w(f"\nrejected messages: {dict(rc) if rc else 'none'}\n")
    w(
        f"bytes on air (all nodes): {report.get('air_bytes_total', 0) / 1e6:.2f} MB; "
        f"FL phase {report.get('fl_s', 0):.1f}s; total {report.get('total_s', 0):.1f}s\n"
    )
    links = [(r["round"], r["link"]) for r in report.get("rounds") or [] if r.get("link")]
    if links:
        medium = any("collision_s" in lk for _, lk in links)
        w(
            f"\n{'round':>5} {'airtime s':>9} {'retx':>6} {'sched %':>7} {'grants':>6} "
            f"{'timeouts':>8} {'bcast':>6} {'repair':>6}"
            + (f" {'collided ms':>11} {'virtual s':>9}" if medium else "")
            + "   (link: server's view"
            + ("; airtime, collisions, virtual time: the shared medium's)\n" if medium else ")\n")
        )
        for t, lk in links:
            sched = lk.get("sched_overhead")
            coll = lk.get("collision_s")
            w(
                f"{t:>5} {_f(lk.get('airtime_s'), '{:.2f}'):>9} {lk.get('retransmissions', 0):>6} "
                f"{_f(None if sched is None else 100 * sched, '{:.1f}'):>7} "
                f"{lk.get('grants', '-'):>6} {lk.get('grant_timeouts', '-'):>8} "
                f"{lk.get('bcast_frames', '-'):>6} {lk.get('bcast_repair_frames', '-'):>6}"
                + (
                    f" {_f(None if coll is None else 1e3 * coll, '{:.2f}'):>11} "
                    f"{_f(lk.get('virtual_s'), '{:.2f}'):>9}"
                    if medium
                    else ""
                )
                + "\n"
            )
    for k, v in (report.get("timings") or {}).items():
        w(f"  {k}: {v:.1f}s\n")


def print_side_by_side(un: Mapping[str, Any], fh: TextIO) -> None:
    """The deployed method beside the comparison methods (``testbed.unlearn.compare``) and what
    the history store erased."""
    w = fh.write
    rows = un.get("side_by_side") or []
    if len(rows) > 1 or (rows and rows[0].get("method")):
        w("\n  same request, server-side measurements (only the first method was deployed):\n")
        w(
            f"  {'method':<14} {'ASR':>6} {'test acc':>8} {'RA':>6} {'FA':>6} {'MIA AUC':>7} "
            f"{'wall s':>7} {'CPU s':>7} {'link MB':>8} {'air MB':>7}\n"
        )
        for row in rows:
            if row.get("error"):
                w(f"  {str(row.get('method')):<14} not run: {row['error']}\n")
                continue
            link = row.get("link_bytes")
            air = row.get("air_bytes")
            w(
                f"  {str(row.get('method')):<14} {_f(row.get('asr')):>6} "
                f"{_f(row.get('test_acc')):>8} {_f(row.get('ra')):>6} {_f(row.get('fa')):>6} "
                f"{_f(row.get('mia_auc')):>7} {_f(row.get('wall_s'), '{:.1f}'):>7} "
                f"{_f(row.get('cpu_s'), '{:.1f}'):>7} "
                f"{_f(None if link is None else link / 1e6, '{:.2f}'):>8} "
                f"{_f(None if air is None else air / 1e6, '{:.2f}'):>7}\n"
            )
        w(
            "  (link MB: the method's own FedAvg traffic on the simulated link; air MB: the "
            "deployed model and evaluations on the testbed's air)\n"
        )
    er = un.get("erasure")
    if er:
        w(
            f"  erased from the history store: {er.get('updates')} stored updates of client(s) "
            f"{er.get('clients')} in rounds {er.get('rounds')} ({er.get('bytes', 0) / 1e6:.2f} "
            f"MB); final model replaced by the unlearned one: {er.get('final_model_replaced')}; "
            f"global models of rounds {_span(er.get('derived_kept_rounds'))} (computed after "
            "those updates were averaged in) kept\n"
        )


def _span(rounds: Any) -> str:
    rounds = list(rounds or [])
    if not rounds:
        return "-"
    return f"{rounds[0]}..{rounds[-1]}" if len(rounds) > 1 else str(rounds[0])


def plot_side_by_side(un: Mapping[str, Any], run_dir: Path) -> Path | None:
    """Bars of ASR, test accuracy, RA, FA and MIA AUC per method, and their times."""
    rows = [r for r in un.get("side_by_side") or [] if not r.get("error") and r.get("method")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("asr", "test_acc", "ra", "fa", "mia_auc")
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        x = [k + (i - (len(rows) - 1) / 2) * width for k in range(len(keys))]
        ax[0].bar(x, [row.get(k) or 0.0 for k in keys], width, label=str(row["method"]))
        ax[1].bar(
            [i - 0.2, i + 0.2],
            [row.get("wall_s") or 0.0, row.get("cpu_s") or 0.0],
            0.4,
            color=[f"C{i}", f"C{i}"],
            alpha=0.9,
        )
    ax[0].set_xticks(range(len(keys)), ["ASR", "test acc", "RA", "FA", "MIA AUC"])
    ax[0].set(ylim=(0, 1), title="same request, server-side measurements")
    ax[0].legend(fontsize=8)
    ax[1].set_xticks(range(len(rows)), [str(r["method"]) for r in rows], rotation=20, fontsize=8)
    ax[1].set(ylabel="s", title="wall (left) and CPU (right) time")
    fig.tight_layout()
    p = run_dir / "unlearning_side_by_side.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
