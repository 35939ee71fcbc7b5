#!/usr/bin/env python3
"""The MAC over the sample-level shared medium beside the frame-level model: one round, N = 3.

Sample level: the broker (scaleflu.radio.medium) and 4 ``ofdm-shared`` links (server 0, robots
1..3, the MAC under each: scaleflu.linkkinds.open_link) in this process. The
server broadcasts a LeNet-size payload (247,210 bytes) once and repairs what the robots report
missing; each robot uploads 247,210 bytes as soon as it has the model (no training time), the
MAC schedules the uploads. The ARQ's and the MAC's timers run on the medium's virtual clock
(``SharedMediumLink.virtual_time``), so a slow machine runs slower, not differently. Airtime
comes from the broker (non-zero virtual samples per node), times from the virtual clock.

Frame level: the same round (same MacConfig, same ARQ settings, same payload size, no training
time) in ``scaleflu.link.macsim.simulate_round`` with the per-frame airtime of the PHY
(``MacConfig``: 90 us + bytes / 748,000 B/s, the OFDM PHY at 5 MS/s including its 160 zero
samples of padding; the broker counts only non-zero samples, so the frame-level airtime is
reported without the padding as well). Both are printed side by side, with their ratio.

    .venv/bin/python benchmarks/mac_sample_level.py                 # AWGN 20 dB, ~3 min on 2 cores
    .venv/bin/python benchmarks/mac_sample_level.py --fading rician # 20 dB mean, K = 6 dB
    .venv/bin/python benchmarks/mac_sample_level.py --mcs stock     # the paper's uncoded PHY

The PHY is the link kinds' default, the coded PHY with link adaptation (``--mcs``); the frame
level runs the same MCS choices (``MacConfig.mcs``) on the same channel.

Results: ``benchmarks/results/mac_sample_level[-<fading>-s<seed>].json``.

``--train-s`` / ``--train-jitter-s``: the robots train this long (on the medium's clock) between
the model and their upload, as the frame level's ``mac_fading_tail.py`` round (1.5 + up to 0.5).
``--sweep 1-5``: the sample level only, on each seed with ``--fading`` and without fading,
interleaved (the reference of the targets: median round at most 1.5 x the round without
fading, worst at most 2 x the median); table and plot in
``benchmarks/results/mac_sample_level-sweep.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import threading
import time
from pathlib import Path

from scaleflu.link.defaults import MAC_DEFAULTS
from scaleflu.link.mac import MacConfig
from scaleflu.link.mcs import FER_AWGN_1500, STOCK, mcs_name
from scaleflu.linkkinds import open_link
from scaleflu.radio.medium.framelevel import (
    LENET_BYTES,
    RX_LATENCY_S,
    START_QUANTUM_S,
    fading_snr,
    frame_level,
)


def sample_level(args: argparse.Namespace, mac: dict) -> dict:
    from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig, broker_stats

    cfg = MediumConfig(
        nodes=(0, 1, 2, 3),
        seed=args.seed,
        address="tcp://127.0.0.1:0",  # a free port (others may run a broker on the default)
        default=LinkChannel(snr_db=args.snr_db, fading=args.fading),
    )
    out: dict = {}
    w0, c0 = time.monotonic(), time.process_time()
    with MediumBroker(cfg).start() as br:
        arq = {"deadline": args.deadline}
        kw = {"broker": br.address, "mac": mac, "arq": arq, "mcs": args.mcs}
        srv = open_link("ofdm-shared", 0, members=(1, 2, 3), seed=0, **kw)
        robots = {r: open_link("ofdm-shared", r, seed=r, **kw) for r in (1, 2, 3)}
        # link adaptation starts from reports: the robots' idle polls give the server an SNR
        # of every link before the payload goes out (as registration does in the testbed)
        end = time.monotonic() + 120
        while args.mcs != STOCK and time.monotonic() < end:
            a = srv.mac.adaptation()["robots"]
            if all(a.get(r, {}).get("down_snr_db") is not None for r in robots):
                break
            time.sleep(0.2)
        rng = random.Random(args.seed)
        model = rng.randbytes(args.size)
        ups = {r: rng.randbytes(args.size) for r in robots}
        train_jitter = {r: rng.random() * args.train_jitter_s for r in robots}
        got: dict[int, bool] = {}
        t_model: dict[int, float] = {}
        sent: dict[int, str] = {}

        def robot(r: int) -> None:  # receive the model, upload at once (no training time)
            m = robots[r].recv(args.wall_limit)
            if m is None:
                return
            got[r] = m[1] == model
            t_model[r] = robots[r].virtual_time() - t0
            # training time on the medium's clock (the frame level's train_s + jitter)
            until = robots[r].virtual_time() + args.train_s + train_jitter[r]
            while robots[r].virtual_time() < until and time.monotonic() - w0 < args.wall_limit:
                time.sleep(0.005)
            res = robots[r].send(0, ups[r], timeout=args.deadline)
            sent[r] = res.status.value

        threads = [threading.Thread(target=robot, args=(r,), daemon=True) for r in robots]
        for t in threads:
            t.start()
        s0 = broker_stats(br.address)
        t0 = srv.virtual_time()
        out["t0_virtual_s"] = t0
        h = srv.broadcast(model, [1, 2, 3], timeout=args.deadline)
        rx: dict[int, bool] = {}
        t_up: dict[int, float] = {}
        while len(rx) < 3 and time.monotonic() - w0 < args.wall_limit:
            m = srv.recv(1)
            if m is not None and m[0] in ups and m[0] not in rx:
                rx[m[0]] = m[1] == ups[m[0]]
                t_up[m[0]] = srv.virtual_time() - t0
        for t in threads:
            t.join(30)
        h.wait(10)
        s1 = broker_stats(br.address)
        air0, air1 = s0["airtime_s"], s1["airtime_s"]
        air = {int(n): air1[n] - air0.get(n, 0.0) for n in air1}
        stats = {n: lk.stats() for n, lk in [(0, srv), *robots.items()]}
        out.update(
            {
                "round_s": max(t_up.values()) if len(t_up) == 3 else None,
                "models_s": t_model,
                "updates_s": t_up,
                "airtime_by_node_s": air,
                "airtime_total_s": sum(air.values()),
                "server_s": air.get(0, 0.0),
                "robots_s": sum(v for n, v in air.items() if n != 0),
                "collision_samples": s1["collision_samples"] - s0.get("collision_samples", 0),
                "bcast_passes": h.passes,
                "bcast_ok": h.ok,
                "grants": stats[0]["mac"]["grants_tx"],
                "grant_timeouts": stats[0]["mac"]["grant_timeouts"],
                "arq_retransmissions": {n: s["arq"]["retransmissions"] for n, s in stats.items()},
                "uploads": sent,
                "bit_exact": len(got) == 3
                and all(got.values())
                and len(rx) == 3
                and all(rx.values()),
                "virtual_s": s1["virtual_s"] - s0["virtual_s"],
                "adaptation": srv.mac.adaptation(),
                "busy_speed": (s1["busy_samples"] - s0.get("busy_samples", 0))
                / cfg.samp_rate
                / max(1e-9, s1["busy_wall_s"] - s0.get("busy_wall_s", 0.0)),
                "wall_s": time.monotonic() - w0,
                "cpu_s": time.process_time() - c0,
                "load": os.getloadavg(),
            }
        )
        for link in [srv, *robots.values()]:
            link.close()
    return out


def sweep(args: argparse.Namespace, mac: dict) -> int:
    """The sample-level round on several seeds, with the fading and without, interleaved."""
    import copy

    import numpy as np

    a, b = (int(x) for x in args.sweep.split("-")) if "-" in args.sweep else (int(args.sweep),) * 2
    seeds = list(range(a, b + 1))
    fading = args.fading if args.fading != "none" else "rician"
    rows: dict[str, list] = {fading: [], "none": []}
    t0, load0 = time.monotonic(), os.getloadavg()
    for seed in seeds:
        for fad in (fading, "none"):
            run = copy.copy(args)
            run.seed, run.fading = seed, fad
            r = sample_level(run, mac)
            r.pop("adaptation", None)
            r["seed"] = seed
            rows[fad].append(r)
            print(
                f"seed {seed} {fad:8s} round {r['round_s']} s virtual, bit-exact "
                f"{r['bit_exact']}, collided samples {r['collision_samples']}, grants "
                f"{r['grants']} ({r['grant_timeouts']} timed out), wall {r['wall_s']:.0f} s",
                flush=True,
            )
    summary = {}
    for fad, rs in rows.items():
        t = [r["round_s"] for r in rs if r["round_s"] is not None]
        summary[fad] = {
            "round_s": [min(t), float(np.median(t)), max(t)] if t else None,
            "unfinished": sum(r["round_s"] is None for r in rs),
            "airtime_s_median": float(np.median([r["airtime_total_s"] for r in rs])),
            "bit_exact": all(r["bit_exact"] for r in rs),
            "collision_samples": sum(r["collision_samples"] for r in rs),
            "grant_timeouts": sum(r["grant_timeouts"] for r in rs),
            "busy_speed_median": float(np.median([r["busy_speed"] for r in rs])),
        }
    f, n = summary[fading]["round_s"], summary["none"]["round_s"]
    lines = [
        f"sample level, N = 3, {args.snr_db:g} dB mean, PHY {args.mcs}, seeds {seeds}, "
        f"{time.monotonic() - t0:.0f} s wall (load {load0[0]:.1f} -> {os.getloadavg()[0]:.1f})",
        "",
        "| channel | round s: min / median / max | unfinished | airtime s (median) | bit-exact "
        "| collided samples | grant timeouts | busy medium x real time (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fad, sm in summary.items():
        rt = " / ".join(f"{x:.2f}" for x in sm["round_s"]) if sm["round_s"] else "-"
        lines.append(
            f"| {fad} | {rt} | {sm['unfinished']} | {sm['airtime_s_median']:.2f} | "
            f"{sm['bit_exact']} | {sm['collision_samples']} | {sm['grant_timeouts']} | "
            f"{sm['busy_speed_median']:.3f} |"
        )
    if f and n:
        lines += [
            "",
            f"median with {fading} / median without fading = {f[1] / n[1]:.2f} (target <= 1.5); "
            f"worst / median = {f[2] / f[1]:.2f} (target <= 2)",
        ]
    text = "\n".join(lines)
    print(text)
    dest = Path(args.out or "benchmarks/results/mac_sample_level-sweep.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(
        json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=1, default=str)
    )
    dest.with_suffix(".md").write_text(text + "\n")
    from scaleflu.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for k, (fad, rs) in enumerate(rows.items()):
        ys = [r["round_s"] for r in rs if r["round_s"] is not None]
        ax.plot([k] * len(ys), ys, "o", alpha=0.7, label=fad)
    ax.set_xticks([0, 1], list(rows))
    ax.set_ylabel("round: broadcast to the last upload in (virtual s)")
    ax.set_title(f"sample level, N = 3, {args.snr_db:g} dB, PHY {args.mcs}")
    ax.grid(True, lw=0.3)
    fig.tight_layout()
    fig.savefig(dest.with_suffix(".png"), dpi=110)
    print(f"wrote {dest} (.md, .png)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=LENET_BYTES)
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--fading", default="none", choices=("none", "rayleigh", "rician"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--mcs", default="adaptive", help="adaptive (default) | stock (the paper's PHY) | an MCS"
    )
    ap.add_argument("--turnaround-s", type=float, default=None, help="MAC turnaround (virtual s)")
    ap.add_argument("--guard-s", type=float, default=None, help="MAC guard (virtual s)")
    ap.add_argument("--deadline", type=float, default=60.0, help="virtual s")
    ap.add_argument("--wall-limit", type=float, default=1500.0)
    ap.add_argument("--sweep", default=None, help="seeds a-b: sample level, fading and not")
    ap.add_argument("--train-s", type=float, default=0.0, help="robots train this long (virtual)")
    ap.add_argument("--train-jitter-s", type=float, default=0.0, help="+ up to this, seeded")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    mac = dict(MAC_DEFAULTS["virtual"])
    if args.turnaround_s is not None:
        mac["turnaround_s"] = args.turnaround_s
    if args.guard_s is not None:
        mac["guard_s"] = args.guard_s
    mac["contention_slots"] = 0  # members configured: every transmission is scheduled
    args.mcs = mcs_name(args.mcs)
    mcfg = MacConfig(**mac, mcs=None if args.mcs == STOCK else args.mcs)
    if args.sweep:
        return sweep(args, mac)
    res = {"args": vars(args), "mac": mac}
    res["sample_level"] = sample_level(args, mac)
    # the same channel (the fading trace from the sample level's start time; or none)
    snr_fn = fading_snr(args.seed, args.snr_db, args.fading, res["sample_level"]["t0_virtual_s"])
    tkw = {"train_s": args.train_s, "train_jitter_s": args.train_jitter_s}
    res["frame_level_ideal"] = frame_level(
        args.size, mcfg, args.seed, args.deadline, False, snr_fn, **tkw
    )
    res["frame_level"] = frame_level(args.size, mcfg, args.seed, args.deadline, True, snr_fn, **tkw)
    res["fit"] = {
        "start_quantum_s": START_QUANTUM_S,
        "rx_latency_s": RX_LATENCY_S,
        "fer_awgn_1500": {k: v for k, v in FER_AWGN_1500.items()},
    }
    f0, f, s = res["frame_level_ideal"], res["frame_level"], res["sample_level"]
    rows = []
    for key in ("airtime_total_s", "server_s", "robots_s", "round_s"):
        a, b = f.get(key), s.get(key)
        ratio = None if not a or b is None else b / a
        rows.append(
            {
                "what": key,
                "frame_level_ideal": f0.get(key),
                "frame_level": a,
                "sample_level": b,
                "sample/frame": ratio,
            }
        )
    res["agreement"] = rows
    name = "mac_sample_level" + ("" if args.fading == "none" else f"-{args.fading}")
    name += "" if args.mcs == "adaptive" else f"-{args.mcs.replace('/', '')}"
    name += "" if args.seed == 1 else f"-s{args.seed}"
    dest = Path(args.out or f"benchmarks/results/{name}.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(res, indent=1, default=str))
    print(f"N = 3, {args.snr_db} dB, fading {args.fading}, seed {args.seed}, PHY {args.mcs}")
    print(
        f"{'virtual s':<16} {'frame ideal':>12} {'frame fitted':>13} {'sample level':>13} "
        f"{'sample/fitted':>13}"
    )

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        print(
            f"{r['what']:<16} {fmt(r['frame_level_ideal']):>12} {fmt(r['frame_level']):>13} "
            f"{fmt(r['sample_level']):>13} {fmt(r['sample/frame']):>13}"
        )
    print(
        f"sample level: bit-exact {s['bit_exact']}, collided samples {s['collision_samples']}, "
        f"broadcast passes {s['bcast_passes']}, grants {s['grants']} "
        f"({s['grant_timeouts']} timed out), ARQ retransmissions {s['arq_retransmissions']}, "
        f"wall {s['wall_s']:.0f} s, CPU {s['cpu_s']:.0f} s, load {s['load'][0]:.1f}, "
        f"busy medium at {s['busy_speed']:.3f} x real time"
    )
    print(f"bytes by MCS (server / robots): {s['adaptation']}")
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
