"""Every figure scaleflu draws for a run or the testbed, and the one place matplotlib is set up.

matplotlib is imported lazily (``scaleflu --help`` and the library never pay for it) and always
with the non-interactive Agg back-end, so figures are written on machines without a display.
The Table II report's grid figures (``scaleflu.experiments.report``) draw through
:func:`pyplot` too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DPI = 120


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg back-end (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def smooth(x: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A running mean over 1/20 of the series (x positions, values); the series if too short."""
    a = np.asarray(x, dtype=float)
    w = max(1, len(a) // 20)
    if w == 1:
        return np.arange(len(a)), a
    return np.arange(w - 1, len(a)), np.convolve(a, np.ones(w) / w, "valid")


def _save(fig: Any, path: str | Path) -> Path:
    plt = pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def plot_training(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> Path:
    """Test accuracy (and backdoor ASR when recorded) and test loss per FedAvg round."""
    plt = pyplot()
    evaluated = [r for r in rows if r.get("test_acc") is not None]
    rounds = [int(r["round"]) for r in evaluated]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax_acc.plot(rounds, [_num(r["test_acc"]) for r in evaluated], marker="o", ms=3, label="test")
    if any(r.get("asr") is not None for r in evaluated):
        asr = [_num(r.get("asr")) for r in evaluated]
        ax_acc.plot(rounds, asr, marker="s", ms=3, label="backdoor ASR")
    ax_acc.set_xlabel("round")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0.0, 1.0)
    ax_acc.legend(fontsize=8)
    ax_loss.plot(
        rounds, [_num(r.get("test_loss")) for r in evaluated], marker="o", ms=3, color="C3"
    )
    ax_loss.set_xlabel("round")
    ax_loss.set_ylabel("test loss")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_acc, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    fig.suptitle(title or "FedAvg training")
    return _save(fig, path)


def plot_rewards(returns: Sequence[float], path: str | Path, title: str = "") -> Path:
    """PPO episode return over training episodes, raw and smoothed (the paper's Fig. 3)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    if len(returns):
        r = np.asarray(returns, dtype=float)
        ax.plot(r, alpha=0.35, label="episode return")
        x, y = smooth(r)
        if len(y) < len(r):
            ax.plot(x, y, label="mean")
    ax.set_xlabel("episode")
    ax.set_ylabel("return")
    ax.set_title(title or "SCALE PPO training")
    if len(returns):
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_sum_aoi(trace: Sequence[float], path: str | Path, title: str = "") -> Path:
    """Sum AoI (seconds) over the rollout's steps (the paper's Fig. 5)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(trace) + 1), trace, marker="o")
    ax.set_xlabel("step")
    ax.set_ylabel("Sum AoI (s)")
    ax.set_title(title or "Sum AoI over unlearning steps")
    return _save(fig, path)


def plot_sensitivity(report: Any, path: str | Path, title: str = "") -> Path:
    """Bar chart of S^a, S^d and S per layer, selected layers marked (the paper's Fig. 4).

    ``report`` is a :class:`scaleflu.unlearn.sensitivity.SensitivityReport` (``layers``,
    ``alignment``, ``impact``, ``score``, ``top``, ``mode``).
    """
    plt = pyplot()
    names = report.layers
    x = range(len(names))
    sa, sd = dict(report.alignment), dict(report.impact)
    if report.mode == "default":  # plot what is mixed: each score over its layer maximum
        ma, md = max(sa.values(), default=0.0), max(sd.values(), default=0.0)
        sa = {n: v / ma if ma > 0 else 0.0 for n, v in sa.items()}
        sd = {n: v / md if md > 0 else 0.0 for n, v in sd.items()}
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(names) + 2), 3.6))
    wdt = 0.27
    ax.bar([i - wdt for i in x], [sa[n] for n in names], wdt, label="alignment $S^a$")
    ax.bar(list(x), [sd[n] for n in names], wdt, label="impact $S^d$")
    ax.bar(
        [i + wdt for i in x],
        [report.score[n] for n in names],
        wdt,
        label="combined $S$",
        edgecolor=["k" if n in report.top else "none" for n in names],
        linewidth=1.5,
    )
    ax.set_xticks(list(x))
    ax.set_xticklabels([n.removesuffix(".weight") for n in names], rotation=45, ha="right")
    ax.set_ylabel("sensitivity" + (" (normalised)" if report.mode == "default" else ""))
    ax.set_title(title or f"Layer sensitivity ({report.mode} mode; top-M outlined)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_testbed_report(report: Mapping[str, Any], run_dir: Path) -> list[Path]:
    """The testbed's figures: accuracy, bytes on air and AoI per round (``rounds.png``), RA/FA
    per robot (``robots_ra_fa.png``), the side-by-side methods (:func:`plot_side_by_side`)."""
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


def plot_side_by_side(un: Mapping[str, Any], run_dir: Path) -> Path | None:
    """Bars of ASR, test accuracy, RA, FA, MIA AUC and the membership audit's AUC per method,
    and their times."""
    rows = [r for r in un.get("side_by_side") or [] if not r.get("error") and r.get("method")]
    if not rows:
        return None
    plt = pyplot()

    keys = ("asr", "test_acc", "ra", "fa", "mia_auc", "audit_auc")
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
    ax[0].set_xticks(range(len(keys)), ["ASR", "test acc", "RA", "FA", "MIA AUC", "audit AUC"])
    ax[0].set(ylim=(0, 1), title="same request, server-side measurements")
    ax[0].legend(fontsize=8)
    ax[1].set_xticks(range(len(rows)), [str(r["method"]) for r in rows], rotation=20, fontsize=8)
    ax[1].set(ylabel="s", title="wall (left) and CPU (right) time")
    fig.tight_layout()
    p = run_dir / "unlearning_side_by_side.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
