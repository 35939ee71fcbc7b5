"""The testbed report: JSON, plots (accuracy, bytes on air, AoI, RA/FA) and a text summary."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from scaleflu.plots import plot_side_by_side
from scaleflu.plots import plot_testbed_report as plot_report

log = logging.getLogger(__name__)

__all__ = ["plot_report", "plot_side_by_side", "print_summary", "write_report"]


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
        ucast = any("unicast_fallbacks" in lk for _, lk in links)  # a broadcast downlink
        w(
            f"\n{'round':>5} {'airtime s':>9} {'retx':>6} {'sched %':>7} {'grants':>6} "
            f"{'timeouts':>8} {'bcast':>6} {'repair':>6}"
            + (f" {'unicast':>7}" if ucast else "")
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
                + (f" {lk.get('unicast_fallbacks', '-'):>7}" if ucast else "")
                + (
                    f" {_f(None if coll is None else 1e3 * coll, '{:.2f}'):>11} "
                    f"{_f(lk.get('virtual_s'), '{:.2f}'):>9}"
                    if medium
                    else ""
                )
                + "\n"
            )
    print_adaptation(report, fh)
    for k, v in (report.get("timings") or {}).items():
        w(f"  {k}: {v:.1f}s\n")


def _audit_cell(row: Mapping[str, Any]) -> str:
    """``0.512 [0.41,0.62]``: the audit's AUC and its interval (``--`` without the audit)."""
    auc = row.get("audit_auc")
    if auc is None:
        return "--"
    lo, hi = row.get("audit_auc_lo"), row.get("audit_auc_hi")
    if lo is None or hi is None:
        return f"{auc:.3f}"
    return f"{auc:.3f} [{lo:.2f},{hi:.2f}]"


def print_adaptation(report: Mapping[str, Any], fh: TextIO) -> None:
    """Per round and robot the SNRs both ends reported and the MCS each way; the bytes each MCS
    carried (the robots' uploads the server received, and the server's own frames)."""
    w = fh.write
    rows = [
        (r["round"], r["link"]["adaptation"])
        for r in report.get("rounds") or []
        if (r.get("link") or {}).get("adaptation")
    ]
    if not rows:
        return
    w(
        f"\n  link adaptation ({rows[0][1].get('mode')}): SNR the server measured of each robot "
        "(up) and the robot reported of the server (down), the MCS each way at the round's end\n"
    )
    w(f"  {'round':>5} {'robot':>5} {'up dB':>6} {'down dB':>7} {'up MCS':>10} {'down MCS':>10}"
      f" {'lost/sent':>9}  bytes up by MCS\n")  # fmt: skip
    total: dict[str, int] = {}
    server: dict[str, int] = {}
    for t, a in rows:
        for k, v in (a.get("server_bytes_by_mcs") or {}).items():
            server[k] = server.get(k, 0) + v
        for r, x in sorted(a.get("robots", {}).items(), key=lambda kv: int(kv[0])):
            by = x.get("bytes_up_by_mcs") or {}
            for k, v in by.items():
                total[k] = total.get(k, 0) + v
            w(
                f"  {t:>5} {int(r):>5} {_f(x.get('up_snr_db'), '{:.1f}'):>6} "
                f"{_f(x.get('down_snr_db'), '{:.1f}'):>7} {str(x.get('up_mcs')):>10} "
                f"{str(x.get('down_mcs')):>10} "
                f"{x.get('up_lost', 0):>4}/{x.get('up_frames', 0):<4}  "
                + ", ".join(f"{k} {v / 1e3:.0f} kB" for k, v in by.items())
                + "\n"
            )
        if a.get("broadcast_mcs"):
            w(f"  {t:>5}   (broadcast at {a['broadcast_mcs']})\n")
    w(
        "  bytes by MCS over the run: robots' uploads received "
        + (", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in total.items()) or "-")
        + "; the server's frames "
        + (", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in server.items()) or "-")
        + "\n"
    )


def print_side_by_side(un: Mapping[str, Any], fh: TextIO) -> None:
    """The deployed method beside the comparison methods (``testbed.unlearn.compare``) and what
    the history store erased."""
    w = fh.write
    rows = un.get("side_by_side") or []
    if len(rows) > 1 or (rows and rows[0].get("method")):
        w("\n  same request, server-side measurements (only the first method was deployed):\n")
        w(
            f"  {'method':<14} {'ASR':>6} {'test acc':>8} {'RA':>6} {'FA':>6} {'MIA AUC':>7} "
            f"{'audit AUC [95% CI]':>20} {'TPR@1%':>6} {'@0.1%':>6} "
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
                f"{_f(row.get('mia_auc')):>7} {_audit_cell(row):>20} "
                f"{_f(row.get('audit_tpr_1fpr')):>6} {_f(row.get('audit_tpr_01fpr')):>6} "
                f"{_f(row.get('wall_s'), '{:.1f}'):>7} "
                f"{_f(row.get('cpu_s'), '{:.1f}'):>7} "
                f"{_f(None if link is None else link / 1e6, '{:.2f}'):>8} "
                f"{_f(None if air is None else air / 1e6, '{:.2f}'):>7}\n"
            )
        w(
            "  (link MB: the method's own FedAvg traffic on the simulated link; air MB: the "
            "deployed model and evaluations on the testbed's air; audit: per-example membership "
            "of the forgotten data against shadow federations, 0.5 = as never seen, compare with "
            "Retrain's; -- when scale.eval.audit is off)\n"
        )
        kinds = {row.get("mia_kind") for row in rows if row.get("mia_kind")}
        if kinds:
            attack = (
                "a reference-model calibrated membership attack"
                if kinds == {"calibrated"}
                else "a loss-threshold membership attack"
                if kinds == {"loss"}
                else "a membership attack (calibrated where run, else loss-threshold)"
            )
            w(
                f"  (MIA AUC: how well {attack} tells the forgotten data from test images nobody "
                "trained on. 0.5: no trace left; above 0.5: the model still treats it as "
                "training data; below 0.5: it fits the forgotten data worse than unseen data, "
                "as when a trigger or wrong labels it carried are no longer followed)\n"
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
