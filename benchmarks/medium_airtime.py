#!/usr/bin/env python3
"""Sample-level airtime of LeNet uploads over the shared medium (scaleflu.radio.medium).

N robots each send one LeNet-5 state dict (61,706 float32, wire format RAW) to the server
(node 0) on ONE simulated frequency. Every node is its own process with one OFDM transmitter
and one receiver (scaleflu.radio.links.SharedMediumLink, without a MAC); the broker runs in a
process of its own and advances virtual sample time in lockstep. Two modes:

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
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
from mac_bench import LENET_SHAPES  # noqa: E402 - one table of the LeNet tensors (script dir)


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
    from scaleflu.radio.links import SharedMediumLink

    link = SharedMediumLink(robot, address, deadline=deadline, **link_opts)
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

    ``link_opts`` go to every node's SharedMediumLink (ARQ options: window, initial_rto, ...). The
    traffic is the ARQ alone (no MAC). A MAC on top can measure its own round the same way:
    ``scaleflu.radio.medium.broker_stats(address)`` before and after, difference the
    ``airtime_samples`` per node and ``collision_samples``.
    """
    os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
    from scaleflu.link.frame import max_payload
    from scaleflu.radio.links import SharedMediumLink
    from scaleflu.radio.medium import broker_stats
    from scaleflu.radio.ofdm import samples_per_frame
    from scaleflu.radio.phy import PhyConfig

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
        # idle virtual time runs at 1x wall (the default): the ARQ waits in wall time, and an
        # unpaced idle medium would spin through thousands of virtual seconds meanwhile
        "idle_speed": 1.0,
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
    server = SharedMediumLink(0, address, deadline=deadline, **link_opts)
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


def _frame_trains(n_robots: int, phy: Any) -> dict[int, list[np.ndarray]]:
    """Each robot's LeNet message as the list of its frames' samples (unit burst power)."""
    import pmt
    from gnuradio import blocks, gr

    from scaleflu.link.frame import FrameType, encode_frame, max_payload
    from scaleflu.radio.blocks import frame_to_pdu
    from scaleflu.radio.medium.port import unit_amplitude

    amp = unit_amplitude(phy)
    trains: dict[int, list[np.ndarray]] = {}
    for r in range(1, n_robots + 1):
        msg = lenet_message(r)
        step = max_payload(phy.mtu)
        chunks = [msg[i : i + step] for i in range(0, len(msg), step)]
        tb = gr.top_block()
        tx = phy.tx(r, amplitude=amp)
        sink = blocks.vector_sink_c()
        tb.connect(tx, sink)
        tb.start()
        for seq, c in enumerate(chunks):
            raw = encode_frame(FrameType.DATA, r, 0, 7, seq, len(chunks), c, phy.mtu)
            tx.framer.to_basic_block()._post(pmt.intern("in"), frame_to_pdu(raw))
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if len([t for t in sink.tags() if pmt.symbol_to_string(t.key) == "packet_len"]) >= len(
                chunks
            ):
                break
            time.sleep(0.05)
        time.sleep(0.2)
        tb.stop()
        tb.wait()
        x = np.asarray(sink.data(), np.complex64)
        starts = sorted(
            (t.offset, pmt.to_long(t.value))
            for t in sink.tags()
            if pmt.symbol_to_string(t.key) == "packet_len"
        )
        trains[r] = [x[o : o + n] for o, n in starts[: len(chunks)]]
        if len(trains[r]) != len(chunks) or sum(map(len, trains[r])) > len(x):
            raise RuntimeError("the transmitter did not put out every frame")
    return trains


def scheduled_airtime(
    n_robots: int = 3,
    seed: int = 0,
    snr_db: float = 20.0,
    fading: str = "rician",
    block: int = 8192,
    samp_rate: float = 5e6,
    guard_blocks: int = 1,
    max_rounds: int = 5,
) -> dict[str, Any]:
    """Perfectly scheduled uploads at sample level, without the ARQ's wall-clock timers.

    Robot 1's whole frame train, then robot 2's, ... (one block of silence between robots)
    go through the medium to the server's real OFDM receiver; the frames it did not decode are
    sent again in a repair round (all robots' missing frames, in turn), until none is missing.
    The server's grants/ACKs are not on air here: ``ack_airtime_s`` adds one 64-byte control
    frame per robot and round (analytic). A frame-level model of the same schedule should give
    the same airtime up to its model of frame loss.
    """
    import pmt
    from gnuradio import blocks, gr

    from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumClient, MediumConfig
    from scaleflu.radio.medium.port import MediumPort
    from scaleflu.radio.ofdm import samples_per_frame
    from scaleflu.radio.phy import PhyConfig

    phy = PhyConfig()
    trains = _frame_trains(n_robots, phy)
    cfg = MediumConfig(
        nodes=tuple(range(n_robots + 1)),
        address="tcp://127.0.0.1:0",
        seed=seed,
        block=block,
        samp_rate=samp_rate,
        default=LinkChannel(snr_db=snr_db, fading=fading, k_factor_db=6.0, doppler_hz=2.0),
        idle_speed=0.0,
    )
    missing = {r: set(range(len(t))) for r, t in trains.items()}
    rounds = []
    t_wall = time.monotonic()
    with MediumBroker(cfg).start() as br:
        port = MediumPort(0, br.address, timeout=60)
        tb = gr.top_block()
        tx, rx = phy.tx(0), phy.rx(0)
        dbg = blocks.message_debug()
        tb.connect(tx, port.tx_sink)
        tb.connect(port.rx_source, rx)
        tb.msg_connect(rx, "out", dbg, "store")
        tb.start()
        port.start()
        clients = {r: MediumClient(r, br.address, timeout=60) for r in trains}
        seen = 0
        for _ in range(max_rounds):
            if not any(missing.values()):
                break
            # the round's timeline: robots in turn, each a contiguous train of its missing frames
            streams: dict[int, np.ndarray] = {}
            at = 2 * block
            for r in sorted(trains):
                if not missing[r]:
                    continue
                x = np.concatenate([trains[r][i] for i in sorted(missing[r])])
                streams[r] = (at, x)
                at += len(x) + guard_blocks * block
            n_steps = math.ceil(at / block) + 4

            def run(r: int, streams=streams, n_steps=n_steps) -> None:
                c = clients[r]
                start, x = streams.get(r, (0, np.zeros(0, np.complex64)))
                for k in range(n_steps):
                    lo, hi = k * block, (k + 1) * block
                    blk = np.zeros(block, np.complex64)
                    a, b = max(lo, start), min(hi, start + len(x))
                    if a < b:
                        blk[a - lo : b - lo] = x[a - start : b - start]
                    c.exchange(blk if blk.any() else None)

            threads = [threading.Thread(target=run, args=(r,)) for r in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join(600)
            end = time.monotonic() + 10
            while port.rx_source.q.qsize() and time.monotonic() < end:
                time.sleep(0.05)
            time.sleep(1.5)
            lost_before = sum(len(m) for m in missing.values())
            for i in range(seen, dbg.num_messages()):
                meta = pmt.car(dbg.get_message(i))
                src = pmt.to_long(pmt.dict_ref(meta, pmt.intern("src"), pmt.from_long(-1)))
                seq = pmt.to_long(pmt.dict_ref(meta, pmt.intern("seq"), pmt.from_long(-1)))
                if src in missing:
                    missing[src].discard(seq)
            seen = dbg.num_messages()
            rounds.append(
                {"frames_sent": lost_before, "frames_missing": sum(map(len, missing.values()))}
            )
        stats = br.stats()
        for c in clients.values():
            c.close()
        port.close()
        tb.stop()
        tb.wait()
    sr = samp_rate
    up = sum(stats["airtime_samples"].get(str(r), 0) for r in trains)
    own = sum(sum(map(len, t)) for t in trains.values())
    ack = len(rounds) * n_robots * samples_per_frame(64)
    return {
        "n_robots": n_robots,
        "seed": seed,
        "snr_db": snr_db,
        "fading": fading,
        "block": block,
        "samp_rate": sr,
        "rounds": rounds,
        "complete": not any(missing.values()),
        "uplink_airtime_s": up / sr,
        "own_airtime_s": own / sr,
        "uplink_over_own": up / own,
        "ack_airtime_s": ack / sr,
        "collision_s": stats["collision_samples"] / sr,
        "wall_s": time.monotonic() - t_wall,
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
    ap.add_argument("--max-rto", type=float, default=None, help="ARQ maximum RTO (wall s)")
    ap.add_argument(
        "--scheduled",
        action="store_true",
        help="also run scheduled_airtime (perfect schedule, repair rounds, no ARQ timers)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "medium_airtime.json")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for seed in range(a.seeds):
        for mode in [m for m in a.modes.split(",") if m]:  # interleaved: every mode per seed
            extra = {
                k: v
                for k, v in (
                    ("window", a.window),
                    ("initial_rto", a.initial_rto),
                    ("min_rto", a.min_rto),
                    ("max_rto", a.max_rto),
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
    sched = []
    if a.scheduled:
        for seed in range(a.seeds):
            r = scheduled_airtime(a.robots, seed, a.snr_db, a.fading, a.block)
            sched.append(r)
            print(
                f"scheduled    seed {seed}: uplink {r['uplink_airtime_s']:.3f} s "
                f"(x{r['uplink_over_own']:.3f} own frames) acks {r['ack_airtime_s']:.4f} s "
                f"rounds {r['rounds']} collisions {r['collision_s']:.4f} s",
                flush=True,
            )
    summary = {}
    for mode in [m for m in a.modes.split(",") if m]:
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
        "scheduled": sched,
    }
    a.out.write_text(json.dumps(out, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
