#!/usr/bin/env python3
"""MAC benchmark: airtime of one FedAvg round with LeNet on one frequency, N = 3, 10, 30, 100.

Run by hand (about a minute on 2 cores)::

    .venv/bin/python benchmarks/mac_bench.py           # -> benchmarks/results/mac_bench.{json,png}
    .venv/bin/python benchmarks/mac_bench.py --quick   # one seed, N = 3 and 10
    .venv/bin/python benchmarks/mac_bench.py --sample-level  # + N = 3 over the sample-level medium
    .venv/bin/python benchmarks/mac_bench.py --phy-snr-db 20 --phy-fading rician  # + the PHY

Frame-level virtual time (``scaleflu.link.macsim``): no PHY, each frame occupies the medium for
its bytes at the PHY rate plus a preamble (``MacConfig``: 748,000 B/s and 90 us, a fit of the
OFDM PHY's samples per frame at 5 MS/s: 720 samples for a 40-byte ACK, 10,480 for 1500 bytes).
Overlapping frames on the frequency collide unless 6 dB stronger. Three
ways to run the round, each with the same payloads and seeds:

* ``scheduled``: ``MacServer``/``MacStation`` (grants, reports) and one broadcast of the model;
* ``unscheduled``: today's behaviour on one frequency: every node transmits as soon as its ARQ
  has a frame, the model goes to each robot by unicast;
* ``per-pair``: the ideal per-pair channel (every pair its own collision-free frequency), a bound.

The round: the server sends the LeNet model (wire format, raw float32), each robot trains for
2 s (+ up to 0.1 s, seeded), then uploads an update of the same size. Virtual seconds, not CPU
seconds: the numbers do not depend on this machine. Targets (docs/link.md section 11): no
collision in scheduled traffic; downlink airtime independent of N within 10 %; uplink airtime
(uplink DATA plus every ACK and MAC control frame) <= 1.15 x the updates' own airtime; a round
with 1 of 10 robots out of range closes at its deadline with the other 9.

With ``--phy-snr-db`` the scheduled round runs again through a PHY model on every link (mean
SNR, ``--phy-fading``: each link its own seeded trace, ``scaleflu.link.fading``; frames lost by
the measured error rate of their MCS, ``scaleflu.link.mcs``): the coded PHY with the MAC's link
adaptation (``MacConfig.mcs="adaptive"``, frames at their MCS's airtime) beside the paper's
stock PHY on the same channel, interleaved per seed: airtime of a round at N = 3 .. 100 with
adaptation.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from scaleflu.link.mac import MacConfig
from scaleflu.link.macsim import simulate_round
from scaleflu.link.samples import LENET_SHAPES
from scaleflu.link.wire import encode_tensors


def lenet_bytes() -> int:
    """Wire size of a LeNet-5 state dict (raw float32, the testbed's bit-exact encoding)."""
    sd = {k: np.zeros(s, dtype=np.float32) for k, s in LENET_SHAPES.items()}
    return len(encode_tensors(sd))


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over seeds of the numbers that matter."""

    def stat(fn):
        vals = [fn(r) for r in rows]
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    return {
        "closed_s": stat(lambda r: r["closed_s"]),
        "downlink_s": stat(lambda r: r["airtime_s"]["downlink"]),
        "uplink_s": stat(lambda r: r["airtime_s"]["uplink"]),
        "ack_s": stat(lambda r: r["airtime_s"]["ack"]),
        "mac_s": stat(lambda r: r["airtime_s"]["mac"]),
        "uplink_ratio": stat(
            lambda r: (
                (r["airtime_s"]["uplink"] + r["control_s"]) / max(r["updates_own_airtime_s"], 1e-12)
            )
        ),
        "collided_frames": stat(lambda r: r["collided_frames"]),
        "retransmissions_on_air": stat(lambda r: r["retransmissions_on_air"]),
        "all_updates": all(r["all_updates"] for r in rows),
        "bit_exact": all(
            r["models_bit_exact"] == len(r["models_in"])
            and r["updates_bit_exact"] == len(r["updates_in"])
            for r in rows
        ),
        "wall_capped": any(r["wall_capped"] for r in rows),
        "updates_in": stat(lambda r: len(r["updates_in"])),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, N = 3 and 10")
    ap.add_argument("--out", default="benchmarks/results", help="output folder")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--sample-level",
        action="store_true",
        help="also run the N = 3 round over the sample-level shared medium "
        "(benchmarks/mac_sample_level.py, GNU Radio, about a minute) and print both side by side",
    )
    ap.add_argument("--loss", type=float, default=0.01, help="per-frame loss of the lossy runs")
    ap.add_argument(
        "--unscheduled-cpu-s", type=float, default=60.0, help="CPU cap of one unscheduled run"
    )
    ap.add_argument(
        "--phy-snr-db",
        type=float,
        default=None,
        help="also run the scheduled round through the PHY model at this mean SNR: link "
        "adaptation beside the stock PHY",
    )
    ap.add_argument("--phy-fading", default="rician", choices=("none", "rician", "rayleigh"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    ns = (3, 10) if args.quick else (3, 10, 30, 100)
    seeds = range(1 if args.quick else args.seeds)
    size = lenet_bytes()
    mac = MacConfig()
    out: dict[str, Any] = {
        "model_bytes": size,
        "mac": mac.__dict__,
        "train_s": 2.0,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": {},
        "summary": {},
    }
    t_start = time.perf_counter()
    for n in ns:
        deadline = max(120.0, 2.0 * n)
        for mode in ("scheduled", "unscheduled", "per-pair"):
            for loss in (0.0, args.loss) if mode == "scheduled" else (0.0,):
                key = f"{mode}/N={n}" + (f"/loss={loss}" if loss else "")
                rows = []
                for seed in seeds:
                    t0 = time.process_time()
                    r = simulate_round(
                        mode,
                        n,
                        size,
                        deadline_s=deadline,
                        loss=loss,
                        seed=seed,
                        mac=mac,
                        max_wall_s=args.unscheduled_cpu_s if mode == "unscheduled" else None,
                    )
                    r["cpu_s"] = time.process_time() - t0
                    r.pop("model_s", None)
                    r.pop("update_s", None)
                    rows.append(r)
                out["runs"][key] = rows
                out["summary"][key] = s = summarise(rows)
                print(
                    f"{key:34s} closed {s['closed_s']['median']:8.2f}s  "
                    f"down {s['downlink_s']['median']:7.3f}s  up {s['uplink_s']['median']:7.3f}s  "
                    f"ctl {s['ack_s']['median'] + s['mac_s']['median']:6.3f}s  "
                    f"up/own {s['uplink_ratio']['median']:5.3f}  "
                    f"coll {s['collided_frames']['median']:6.0f}  all {s['all_updates']}"
                    + ("  (CPU cap)" if s["wall_capped"] else ""),
                    flush=True,
                )
    if args.phy_snr_db is not None:
        phy_rounds(args, ns, seeds, size, out)
    # 1 of 10 robots out of range
    rows = []
    for seed in seeds:
        r = simulate_round("scheduled", 10, size, deadline_s=60.0, out_of_range=(4,), seed=seed)
        r.pop("model_s", None)
        rows.append(r)
    out["runs"]["scheduled/N=10/out_of_range=1"] = rows
    out["summary"]["scheduled/N=10/out_of_range=1"] = {
        "deadline_s": 60.0,
        "closed_s": [r["closed_s"] for r in rows],
        "updates_in": [len(r["updates_in"]) for r in rows],
        "last_update_s": [max(r["update_s"].values()) for r in rows],
        "grant_timeouts": [r["mac"]["grant_timeouts"] for r in rows],
        "bit_exact": all(r["updates_bit_exact"] == 9 and r["models_bit_exact"] == 9 for r in rows),
    }
    print("out of range:", out["summary"]["scheduled/N=10/out_of_range=1"])
    # registration by contention
    rows = []
    for n in ns:
        r = simulate_round("scheduled", n, 1000, register=True, seed=0)
        rows.append({"robots": n, **r["register"]})
    out["registration"] = rows
    for r in rows:
        print(
            f"registration N={r['robots']}: {r['seconds']:.2f}s, "
            f"max JOINs {max(r['join_attempts'].values())}, ok {r['ok']}"
        )
    if args.sample_level:  # the N = 3 point at sample level, in a fresh process
        import subprocess

        dest = Path(args.out) / "mac_sample_level.json"
        script = Path(__file__).with_name("mac_sample_level.py")
        subprocess.run([sys.executable, str(script), "--out", str(dest)], check=True)
        out["sample_level_n3"] = json.loads(dest.read_text())["agreement"]
    out["targets"] = targets(out["summary"], ns)
    out["bench_cpu_s"] = time.perf_counter() - t_start
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "mac_bench.json").write_text(json.dumps(out, indent=1, default=str))
    plot(out, ns, dest / "mac_bench.png")
    print(json.dumps(out["targets"], indent=1))
    print(f"wrote {dest / 'mac_bench.json'} and {dest / 'mac_bench.png'}")
    return 0


def phy_rounds(args: argparse.Namespace, ns: tuple[int, ...], seeds, size: int, out: dict) -> None:
    """The scheduled round through the PHY model: adaptive MCS and the stock PHY, per seed."""
    from scaleflu.link.fading import link_snr

    for n in ns:
        deadline = max(120.0, 2.0 * n)
        rows: dict[str, list] = {"adaptive": [], "stock": []}
        for seed in seeds:
            for phy in ("adaptive", "stock"):  # interleaved, the same channel realisation
                r = simulate_round(
                    "scheduled",
                    n,
                    size,
                    deadline_s=deadline,
                    seed=seed,
                    mac=MacConfig(mcs=None if phy == "stock" else phy),
                    snr_fn=link_snr(seed, args.phy_snr_db, args.phy_fading),
                )
                r.pop("model_s", None)
                r.pop("update_s", None)
                rows[phy].append(r)
        for phy, rs in rows.items():
            key = f"scheduled-{phy}-phy/N={n}"
            out["runs"][key] = rs
            out["summary"][key] = s = summarise(rs)
            by: dict[str, int] = {}
            for r in rs:
                for k, v in r["bytes_by_mcs"].items():
                    by[k] = by.get(k, 0) + v
            s["bytes_by_mcs"] = by
            s["airtime_total_s"] = {
                "median": statistics.median(sum(r["airtime_s"].values()) for r in rs)
            }
            s["lost_link"] = {"median": statistics.median(r["lost_link"] for r in rs)}
            print(
                f"{key:34s} closed {s['closed_s']['median']:8.2f}s  "
                f"airtime {s['airtime_total_s']['median']:7.3f}s  "
                f"down {s['downlink_s']['median']:7.3f}s  up {s['uplink_s']['median']:7.3f}s  "
                f"lost {s['lost_link']['median']:6.0f}  all {s['all_updates']} "
                f"bit-exact {s['bit_exact']}",
                flush=True,
            )
    out["phy_model"] = {"snr_db": args.phy_snr_db, "fading": args.phy_fading}


def targets(summary: dict[str, Any], ns: tuple[int, ...]) -> dict[str, Any]:
    """The issue's targets, checked on the medians (and worst seeds)."""
    sched = [summary[f"scheduled/N={n}"] for n in ns]
    downs = [s["downlink_s"]["max"] for s in sched] + [s["downlink_s"]["min"] for s in sched]
    oor = summary["scheduled/N=10/out_of_range=1"]
    return {
        "scheduled_collisions_max": max(s["collided_frames"]["max"] for s in sched),
        "downlink_spread": max(downs) / min(downs) - 1.0,
        "uplink_ratio_max": max(s["uplink_ratio"]["max"] for s in sched),
        "out_of_range_closes_at_deadline": all(
            abs(c - oor["deadline_s"]) < 1e-6 for c in oor["closed_s"]
        )
        and all(u == 9 for u in oor["updates_in"]),
    }


def plot(out: dict[str, Any], ns: tuple[int, ...], path: Path) -> None:
    """Airtime per round (stacked downlink/uplink/control) and round duration vs N."""
    from scaleflu.plots import pyplot

    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    modes = ("scheduled", "unscheduled", "per-pair")
    width = 0.27
    x = np.arange(len(ns))
    colors = {"downlink": "tab:blue", "uplink": "tab:orange", "control": "tab:gray"}
    for i, mode in enumerate(modes):
        s = [out["summary"][f"{mode}/N={n}"] for n in ns]
        down = np.array([v["downlink_s"]["median"] for v in s])
        up = np.array([v["uplink_s"]["median"] for v in s])
        ctl = np.array([v["ack_s"]["median"] + v["mac_s"]["median"] for v in s])
        pos = x + (i - 1) * width
        ax1.bar(pos, down, width, color=colors["downlink"], label="downlink" if i == 0 else None)
        ax1.bar(
            pos, up, width, bottom=down, color=colors["uplink"], label="uplink" if i == 0 else None
        )
        ax1.bar(
            pos,
            ctl,
            width,
            bottom=down + up,
            color=colors["control"],
            label="control (ACK, MAC)" if i == 0 else None,
        )
        for p, tot in zip(pos, down + up + ctl, strict=True):
            ax1.text(p, tot, mode[:5], ha="center", va="bottom", fontsize=7, rotation=90)
        closed = [v["closed_s"]["median"] for v in s]
        lo = [v["closed_s"]["median"] - v["closed_s"]["min"] for v in s]
        hi = [v["closed_s"]["max"] - v["closed_s"]["median"] for v in s]
        ax2.errorbar(ns, closed, yerr=[lo, hi], marker="o", capsize=3, label=mode)
    ax1.set_xticks(x, [f"N={n}" for n in ns])
    ax1.set_ylabel("airtime of one round (virtual s)")
    ax1.set_yscale("log")
    ax1.set_ylim(bottom=0.1)
    ax1.legend(fontsize=8)
    ax1.set_title("LeNet FedAvg round on one frequency: airtime")
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("robots")
    ax2.set_ylabel("round closes after (virtual s)")
    ax2.set_title("round duration (median, range over seeds)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
