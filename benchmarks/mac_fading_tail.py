"""Where a scheduled round's time goes on the demo's fading channel, at frame level.

One FedAvg round of 3 robots (LeNet-size model down by broadcast, 1.5-2 s of training, the
updates up under the MAC) in ``scaleflu.link.macsim.simulate_round``, each frame's SNR from the
sample-level medium's own fading trace (``framelevel.fading_snr``: Rician K = 6 dB, 2 Hz
Doppler, 20 dB mean SNR, as ``make demo``), lost by the PHY's measured frame error rate at its
MCS (``scaleflu.link.mcs.frame_error_rate``), its timing fitted to the sample level (lockstep
block start, receiver latency). One realisation per seed; every variant runs the same
realisations, interleaved.

Built-in variants: the coded PHY with link adaptation (``mcs=adaptive``, the default of the
link kinds) and the paper's stock PHY (``mcs=stock``), each on the fading channel and on the
same channel without fading (``fading=none``: the reference of the targets). More with
``--variant name:key=value,...``: ``mcs`` (adaptive | stock | an MCS name), ``fading``
(rician | rayleigh | none), ``snr_db``, the keys of ``MacConfig`` and ArqConfig keys prefixed
``arq.``. Prints per variant the round time (last update in, virtual seconds) min / median /
90th percentile / max, lost frames and grant timeouts, the targets (adaptive: median at most
1.5 x the round without fading, worst at most 2 x the median); writes
``benchmarks/results/mac_fading_tail.{json,md,png}``.

    .venv/bin/python benchmarks/mac_fading_tail.py --realisations 40
    .venv/bin/python benchmarks/mac_fading_tail.py --variant g16k:grant_bytes=16384,mcs=stock
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from scaleflu.link.arq import ArqConfig
from scaleflu.link.defaults import MAC_DEFAULTS
from scaleflu.link.mac import MacConfig
from scaleflu.link.mcs import STOCK, mcs_name
from scaleflu.radio.medium.framelevel import LENET_BYTES, fading_snr, frame_level

BUILT_IN = [
    ("adaptive", {"mcs": "adaptive", "fading": "rician"}),
    ("adaptive-nofade", {"mcs": "adaptive", "fading": "none"}),
    ("stock", {"mcs": STOCK, "fading": "rician"}),
    ("stock-nofade", {"mcs": STOCK, "fading": "none"}),
]
_SPECIAL = ("mcs", "fading", "snr_db")


def parse_variant(text: str) -> tuple[str, dict]:
    """``name:key=value,...`` -> (name, settings); ``mcs``/``fading`` stay strings."""
    name, _, rest = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: NAME:key=value,... expected")
    out: dict = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        if key in ("mcs", "fading"):
            out[key] = val
            continue
        num = float(val)
        value = int(num) if num.is_integer() and "." not in val else num
        if key.startswith("arq."):
            if key[4:] not in ArqConfig.__dataclass_fields__:
                raise SystemExit(f"--variant {text!r}: no ArqConfig field {key[4:]!r}")
        elif key not in _SPECIAL and key not in MacConfig.__dataclass_fields__:
            raise SystemExit(f"--variant {text!r}: no MacConfig field {key!r}")
        out[key] = value
    return name, out


def one_round(seed: int, spec: dict, args: argparse.Namespace) -> dict:
    """One round on realisation ``seed`` with the variant's settings (``frame_level``)."""
    mac = {k: v for k, v in spec.items() if k not in _SPECIAL and not k.startswith("arq.")}
    arq = {k[4:]: v for k, v in spec.items() if k.startswith("arq.")}
    mcs = mcs_name(spec.get("mcs", "adaptive"))
    fading = spec.get("fading", args.fading)
    snr = float(spec.get("snr_db", args.snr_db))
    r = frame_level(
        LENET_BYTES,
        MacConfig(**{**MAC_DEFAULTS["virtual"], **mac, "mcs": None if mcs == STOCK else mcs}),
        seed,
        args.deadline,
        True,
        fading_snr(seed, snr, fading, 0.0),
        robots=args.robots,
        train_s=args.train_s,
        train_jitter_s=args.train_jitter_s,
        arq=arq,
    )
    done = len(r["updates_s"]) == args.robots
    keys = ("lost_link", "collided_frames", "grant_timeouts", "grants", "bcast_passes", "bit_exact")
    return {
        "seed": seed,
        "round_s": r["round_s"] if done else None,
        "airtime_s": r["airtime_total_s"],
        "bytes_by_mcs": r["bytes_by_mcs"],
        **{k: r[k] for k in keys},
    }


def summarise(rs: list[dict]) -> dict:
    t = [r["round_s"] for r in rs if r["round_s"] is not None]
    by_mcs: dict[str, int] = {}
    for r in rs:
        for k, v in r["bytes_by_mcs"].items():
            by_mcs[k] = by_mcs.get(k, 0) + v
    return {
        "round_s": [
            float(np.min(t)),
            float(np.median(t)),
            float(np.percentile(t, 90)),
            float(np.max(t)),
        ]
        if t
        else None,
        "unfinished": sum(r["round_s"] is None for r in rs),
        "airtime_s_median": float(np.median([r["airtime_s"] for r in rs])),
        "lost_frames_median": float(np.median([r["lost_link"] for r in rs])),
        "grant_timeouts_median": float(np.median([r["grant_timeouts"] for r in rs])),
        "bit_exact": all(r["bit_exact"] for r in rs),
        "bytes_by_mcs": by_mcs,
    }


def targets(summary: dict) -> dict:
    """The adaptive PHY's targets: median <= 1.5 x without fading, max <= 2 x median."""
    out = {}
    for name, ref in (("adaptive", "adaptive-nofade"), ("stock", "stock-nofade")):
        a, b = summary.get(name, {}).get("round_s"), summary.get(ref, {}).get("round_s")
        if a and b:
            out[name] = {
                "median_over_nofade_median": a[1] / b[1],
                "max_over_median": a[3] / a[1],
            }
    return out


def plot(rows: dict, path: Path) -> None:
    from scaleflu.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, rs in rows.items():
        t = sorted(r["round_s"] for r in rs if r["round_s"] is not None)
        if t:
            ax.step(t, np.arange(1, len(t) + 1) / len(rs), where="post", label=name)
    ax.set_xlabel("round: broadcast to the last update in (virtual s)")
    ax.set_ylabel("fraction of realisations")
    ax.set_xscale("log")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=8)
    ax.set_title("one LeNet round, 3 robots, frame level (Rician K = 6 dB, 2 Hz)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--realisations", type=int, default=20)
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,...")
    ap.add_argument("--only", default=None, help="comma-separated variant names to run")
    ap.add_argument("--robots", type=int, default=3)
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--fading", default="rician", choices=("rician", "rayleigh", "none"))
    ap.add_argument("--train-s", type=float, default=1.5)
    ap.add_argument("--train-jitter-s", type=float, default=0.5)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    variants = BUILT_IN + [parse_variant(v) for v in args.variant]
    if args.only:
        keep = set(args.only.split(","))
        variants = [v for v in variants if v[0] in keep]
    rows: dict[str, list[dict]] = {name: [] for name, _ in variants}
    t0, load0 = time.perf_counter(), os.getloadavg()
    for seed in range(args.realisations):
        for name, spec in variants:  # interleaved: every variant on the same realisation
            rows[name].append(one_round(seed, spec, args))
    wall = time.perf_counter() - t0
    summary = {name: summarise(rs) for name, rs in rows.items()}
    tg = targets(summary)
    lines = [
        f"{args.realisations} realisations, {args.snr_db:g} dB mean, {args.robots} robots, "
        f"{wall:.0f} s wall (load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f})",
        "",
        "| variant | round s: min / median / p90 / max | unfinished | airtime s (median) "
        "| lost frames (median) | grant timeouts (median) | bit-exact |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        rt = " / ".join(f"{x:.2f}" for x in s["round_s"]) if s["round_s"] else "-"
        lines.append(
            f"| {name} | {rt} | {s['unfinished']} | {s['airtime_s_median']:.2f} | "
            f"{s['lost_frames_median']:.0f} | {s['grant_timeouts_median']:.1f} | "
            f"{s['bit_exact']} |"
        )
    lines.append("")
    for name, t in tg.items():
        lines.append(
            f"{name}: median / median without fading = {t['median_over_nofade_median']:.2f}"
            f" (target <= 1.5 for adaptive), max / median = {t['max_over_median']:.2f}"
            " (target <= 2)"
        )
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "mac_fading_tail.json"
    path.write_text(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "args": vars(args),
                "wall_s": wall,
                "load": [load0, os.getloadavg()],
                "variants": dict(variants),
                "summary": summary,
                "targets": tg,
                "rows": rows,
            },
            indent=1,
        )
    )
    (out / "mac_fading_tail.md").write_text(text + "\n")
    plot(rows, out / "mac_fading_tail.png")
    print(f"wrote {path} (.md, .png)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
