#!/usr/bin/env python3
"""The edge server and N robots (the testbed apps' classes) on the sample-level medium, in one
process: FL rounds over ``ofdm-shared`` with the broadcast downlink, per round the virtual and
wall time, grant timeouts, broadcast repairs and unicast fall-backs (a robot whose broadcast
repair stalled), and whether any robot registered again.

Lighter than ``apps/testbed.py`` (one process: one Python, the medium's broker and 4 OFDM
flowgraphs; no SCALE, no plots), the same server, robots, MAC and medium. ``--drop-broadcast R``
makes robot R's link lose every broadcast DATA frame (the fall-back then serves it).

    .venv/bin/python benchmarks/medium_testbed.py --rounds 3              # Rician 20 dB, K 6 dB
    .venv/bin/python benchmarks/medium_testbed.py --fading none --drop-broadcast 2

Results: ``benchmarks/results/medium_testbed-<fading>-s<seed>.json`` (per round and totals).
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from scaleflu.config import load_config
from scaleflu.link.faults import drop_broadcast_bodies
from scaleflu.linkkinds import open_link
from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig
from scaleflu.testbed.inprocess import TESTBED_OVERRIDES, run_federation
from scaleflu.testbed.protocol import generate_keys
from scaleflu.testbed.robot import RobotClient, RobotData
from scaleflu.testbed.server import EdgeServer

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fading", choices=("rician", "rayleigh", "none"), default="rician")
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1, help="the medium's seed (channel, noise)")
    ap.add_argument("--drop-broadcast", type=int, default=0, help="this robot loses broadcasts")
    ap.add_argument("--set", action="append", default=[], help="config override key=value")
    ap.add_argument(
        "--mac", action="append", default=[], help="MacConfig field=value for every node's MAC"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = load_config(
        None,
        [*TESTBED_OVERRIDES, f"testbed.rounds={args.rounds}", "testbed.unlearn.wait_s=1",
         "testbed.link=ofdm-shared", "fl.threads=1", *args.set],
    )  # fmt: skip
    chan = LinkChannel(snr_db=args.snr_db, fading=args.fading, k_factor_db=6.0, doppler_hz=2.0)
    medium = MediumConfig(
        nodes=(0, 1, 2, 3), seed=args.seed, address="tcp://127.0.0.1:0", default=chan, hub=0
    )
    keys = generate_keys([1, 2, 3])
    mac: dict[str, float] = {"contention_slots": 0}
    for item in args.mac:
        k, _, v = item.partition("=")
        mac[k] = int(v) if v.lstrip("-").isdigit() else float(v)
    dropped: list[int] = []
    w0, c0 = time.monotonic(), time.process_time()
    with MediumBroker(medium).start() as br, tempfile.TemporaryDirectory() as tmp:
        srv = open_link("ofdm-shared", 0, broker=br.address, members=(1, 2, 3), mac=mac, seed=0)
        links = {r: open_link("ofdm-shared", r, broker=br.address, mac=mac, seed=r) for r in keys}
        if args.drop_broadcast in links:  # the robot's receiver feeds this ArqLink
            drop_broadcast_bodies(links[args.drop_broadcast].arq.link, dropped)
        server = EdgeServer(srv, keys, cfg, tmp, False)
        robots = [RobotClient(links[r], r, keys[r], cfg, data=RobotData(cfg, r)) for r in keys]

        def close() -> None:
            for lk in (*links.values(), srv):
                lk.close()

        v0 = srv.virtual_time()
        report, outs = run_federation(server, robots, 3600, close)
        stats = br.stats()
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    rounds = [
        {
            "round": row["round"],
            "participants": row["participants"],
            "missing": row["missing"],
            "wall_s": round(row["wall_s"], 1),
            **{k: row["link"].get(k) for k in ("virtual_s", "airtime_s", "grant_timeouts")},
            **{k: row["link"].get(k) for k in ("bcast_frames", "bcast_repair_frames")},
            "retransmissions": row["link"].get("retransmissions"),
            "unicast_fallbacks": row["link"].get("unicast_fallbacks"),
        }
        for row in report["rounds"]
    ]
    out = {
        "args": vars(args),
        "rounds": rounds,
        "fallbacks": [e for e in report["events"] if e["event"] == "broadcast_fallback"],
        "events": report["events"],  # t: the server's wall seconds since it started
        "rejections": report.get("rejection_counts"),
        "registrations": {r: v["registrations"] for r, v in report["robots"].items()},
        "idle_reregistrations": {r: o.get("idle_reregistrations") for r, o in outs.items()},
        "uploads": {r: [x["upload"] for x in o["rounds"]] for r, o in outs.items()},
        "virtual_s": stats["virtual_s"] - v0,
        "collision_s": stats["collision_s"],
        "broadcast_frames_dropped": len(dropped),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),  # this process: every node, the broker and the training
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    path = Path(
        args.out or ROOT / f"benchmarks/results/medium_testbed-{args.fading}-s{args.seed}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
