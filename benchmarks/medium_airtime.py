#!/usr/bin/env python3
"""Sample-level airtime of LeNet uploads over the shared medium (scaleflu.radio.medium).

N robots each send one LeNet-5 state dict (61,706 float32, wire format RAW) to the server
(node 0) on ONE simulated frequency. Every node is its own process with one OFDM transmitter
and one receiver (make_link("ofdm-shared")); the broker runs in a process of its own and
advances virtual sample time in lockstep. Two modes:

* ``sequential``: robot i starts when robot i-1's upload is acknowledged (what a scheduled MAC
  achieves; no overlap between robots);
* ``simultaneous``: all robots start together (no MAC: today's behaviour, bursts and ACKs
  collide).

Airtime is counted in virtual samples at the broker (a sample is "on air" for a node when its
transmitter's sample is non-zero) and converted at ``samp_rate`` (5 MS/s). Run by hand::

    .venv/bin/python benchmarks/medium_airtime.py                 # N=3, both modes, 2 seeds
    .venv/bin/python benchmarks/medium_airtime.py --robots 3 --modes sequential --seeds 1
    # -> benchmarks/results/medium_airtime.json

From other code (the frame-level MAC simulator compares its N=3 point with this)::

    from benchmarks.medium_airtime import run_airtime   # or importlib on this file
    r = run_airtime(n_robots=3, mode="sequential", seed=0)
    r["uplink_airtime_s"], r["span_s"], r["collision_s"], r["frame_airtime_s"]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
LENET_SHAPES = {
    "conv1.weight": (6, 1, 5, 5),
    "conv1.bias": (6,),
    "conv2.weight": (16, 6, 5, 5),
    "conv2.bias": (16,),
    "fc1.weight": (120, 400),
    "fc1.bias": (120,),
    "fc2.weight": (84, 120),
    "fc2.bias": (84,),
    "fc3.weight": (10, 84),
    "fc3.bias": (10,),
}


def lenet_message(robot: int) -> bytes:
    """The wire message of a LeNet-5 state dict (random weights seeded by the robot id)."""
    from scaleflu.link.wire import encode_tensors

    rng = np.random.default_rng(robot)
    sd = {k: rng.standard_normal(s).astype(np.float32) for k, s in LENET_SHAPES.items()}
    return encode_tensors(sd, sender=robot, receiver=0)


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _broker_main(cfg_dict: dict[str, Any], ready: Any, stop: Any) -> None:
    from scaleflu.radio.medium import MediumBroker, MediumConfig

    broker = MediumBroker(MediumConfig.from_dict(cfg_dict)).start()
    ready.set()
    stop.wait()
    broker.close()


def _robot_main(
    robot: int,
    address: str,
    go: Any,
    done: Any,
    results: Any,
    deadline: float,
    link_opts: dict[str, Any],
) -> None:
    os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
    from scaleflu.link.arq import SendStatus
    from scaleflu.radio.links import make_link

    link = make_link("ofdm-shared", robot, broker=address, deadline=deadline, **link_opts)
    msg = lenet_message(robot)
    try:
        go.wait()
        t0 = time.monotonic()
        h = link.send_async(0, msg)
        h.wait(deadline + 10)
        results.put(
            {
                "robot": robot,
                "ok": h.status == SendStatus.DELIVERED,
                "status": str(h.status),
                "wall_s": time.monotonic() - t0,
                "bytes": len(msg),
                "arq": link.stats().get("arq", {}),
            }
        )
    finally:
        done.set()
        time.sleep(0.5)
        link.close()


def run_airtime(
    n_robots: int = 3,
    mode: str = "sequential",
    seed: int = 0,
    snr_db: float = 20.0,
    fading: str = "rician",
    block: int = 8192,
    samp_rate: float = 5e6,
    deadline: float = 300.0,
    **link_opts: Any,
) -> dict[str, Any]:
    """Upload one LeNet state dict from each of ``n_robots`` robots; airtime counters (dict).

    ``link_opts`` go to every node's make_link (ARQ options: window, initial_rto, ...). The
    traffic is the ARQ alone (no MAC). A MAC on top can measure its own round the same way:
    ``scaleflu.radio.medium.broker_stats(address)`` before and after, difference the
    ``airtime_samples`` per node and ``collision_samples``.
    """
    os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
    from scaleflu.link.frame import max_payload
    from scaleflu.radio.links import PhyConfig, make_link
    from scaleflu.radio.medium import broker_stats
    from scaleflu.radio.ofdm import samples_per_frame

    if mode not in ("sequential", "simultaneous"):
        raise ValueError("mode must be sequential or simultaneous")
    ctx = mp.get_context("spawn")
    address = _free_address()
    nodes = list(range(n_robots + 1))
    cfg = {
        "nodes": nodes,
        "address": address,
        "seed": seed,
        "block": block,
        "samp_rate": samp_rate,
        "default": {"snr_db": snr_db, "fading": fading, "k_factor_db": 6.0, "doppler_hz": 2.0},
        "idle_speed": 0.0,
    }
    ready, stop = ctx.Event(), ctx.Event()
    broker = ctx.Process(target=_broker_main, args=(cfg, ready, stop), daemon=True)
    broker.start()
    if not ready.wait(60):
        raise RuntimeError("the medium broker did not start")
    results = ctx.Queue()
    gos = [ctx.Event() for _ in range(n_robots)]
    dones = [ctx.Event() for _ in range(n_robots)]
    robots = [
        ctx.Process(
            target=_robot_main,
            args=(r, address, gos[r - 1], dones[r - 1], results, deadline, link_opts),
            daemon=True,
        )
        for r in range(1, n_robots + 1)
    ]
    for p in robots:
        p.start()
    server = make_link("ofdm-shared", 0, broker=address, deadline=deadline, **link_opts)
    try:
        while broker_stats(address)["steps"] == 0:  # the first step needs every node joined
            time.sleep(0.2)
        before = broker_stats(address)
        t0 = time.monotonic()
        if mode == "simultaneous":
            for g in gos:
                g.set()
        got: dict[int, bool] = {}
        for r in range(1, n_robots + 1):
            if mode == "sequential":
                gos[r - 1].set()
                dones[r - 1].wait(deadline + 30)
        while len(got) < n_robots and time.monotonic() - t0 < deadline + 30:
            m = server.recv(timeout=1.0)
            if m is not None:
                got[m[0]] = m[1] == lenet_message(m[0])
        wall = time.monotonic() - t0
        robot_res = [results.get(timeout=30) for _ in range(n_robots)]
        after = broker_stats(address)
        server_stats = server.stats()
    finally:
        server.close()
        for p in robots:
            p.join(30)
        stop.set()
        broker.join(10)
    sr = samp_rate
    air = {
        k: after["airtime_samples"][k] - before["airtime_samples"].get(k, 0)
        for k in after["airtime_samples"]
    }
    msg_bytes = len(lenet_message(1))
    phy = PhyConfig()
    frames = math.ceil(msg_bytes / max_payload(phy.mtu))
    own = frames * samples_per_frame(
        phy.mtu, phy.fft_len, phy.cp_len, phy.bps_payload, phy.post_padding
    )
    virt = (after["samples"] - before["samples"]) / sr
    up = sum(v for k, v in air.items() if k != "0")
    return {
        "n_robots": n_robots,
        "mode": mode,
        "seed": seed,
        "snr_db": snr_db,
        "fading": fading,
        "block": block,
        "samp_rate": sr,
        "message_bytes": msg_bytes,
        "delivered_bit_exact": sum(got.values()),
        "robots": sorted(robot_res, key=lambda d: d["robot"]),
        "airtime_s": {k: v / sr for k, v in air.items()},
        "uplink_airtime_s": up / sr,
        "ack_airtime_s": air.get("0", 0) / sr,
        "frame_airtime_s": own / sr,  # one upload's own frames, back to back, no retransmission
        "uplink_over_own": up / (n_robots * own),
        "collision_s": (after["collision_samples"] - before["collision_samples"]) / sr,
        "span_s": (after["last_active"] - (after["first_active"] or 0)) / sr
        if after["last_active"]
        else 0.0,
        "virtual_s": virt,
        "wall_s": wall,
        "virtual_over_wall": virt / wall if wall > 0 else None,
        # speed while receivers process samples (idle steps excluded: they are paced at 1x)
        "busy_virtual_over_wall": (after["busy_samples"] - before["busy_samples"])
        / sr
        / max(1e-9, after["busy_wall_s"] - before["busy_wall_s"]),
        "retransmissions": sum(d["arq"].get("retransmissions", 0) for d in robot_res),
        "server_arq": server_stats.get("arq", {}),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the modes and seeds asked for; write benchmarks/results/medium_airtime.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--robots", type=int, default=3)
    ap.add_argument("--modes", default="sequential,simultaneous")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--fading", default="rician", choices=["none", "rayleigh", "rician"])
    ap.add_argument("--block", type=int, default=8192)
    ap.add_argument(
        "--window",
        type=int,
        default=None,
        help="ARQ window in frames (default: the OFDM default, 64); 256 sends a LeNet update "
        "as one train of frames, so the server's ACKs come after it, not under it",
    )
    ap.add_argument("--initial-rto", type=float, default=None, help="ARQ initial RTO (wall s)")
    ap.add_argument("--min-rto", type=float, default=None, help="ARQ minimum RTO (wall s)")
    ap.add_argument("--out", type=Path, default=RESULTS / "medium_airtime.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for seed in range(a.seeds):
        for mode in a.modes.split(","):  # interleaved: every mode in each seed
            extra = {
                k: v
                for k, v in (
                    ("window", a.window),
                    ("initial_rto", a.initial_rto),
                    ("min_rto", a.min_rto),
                )
                if v is not None
            }
            r = run_airtime(a.robots, mode, seed, a.snr_db, a.fading, a.block, **extra)
            runs.append(r)
            print(
                f"{mode:12s} seed {seed}: uplink {r['uplink_airtime_s']:.3f} s "
                f"(own frames {r['frame_airtime_s']:.3f} s/robot, x{r['uplink_over_own']:.2f}) "
                f"acks {r['ack_airtime_s']:.3f} s span {r['span_s']:.3f} s "
                f"collisions {r['collision_s']:.4f} s retx {r['retransmissions']} "
                f"delivered {r['delivered_bit_exact']}/{a.robots} "
                f"virtual/wall {r['virtual_over_wall']:.3f} "
                f"(busy {r['busy_virtual_over_wall']:.3f})",
                flush=True,
            )
    summary = {}
    for mode in a.modes.split(","):
        rs = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            k: {
                "min": min(r[k] for r in rs),
                "median": statistics.median(r[k] for r in rs),
                "max": max(r[k] for r in rs),
            }
            for k in (
                "busy_virtual_over_wall",
                "uplink_airtime_s",
                "span_s",
                "collision_s",
                "uplink_over_own",
                "virtual_over_wall",
                "wall_s",
            )
        }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    out = {
        "machine": {
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": {k: str(v) for k, v in vars(a).items()},
        "summary": summary,
        "runs": runs,
    }
    a.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
