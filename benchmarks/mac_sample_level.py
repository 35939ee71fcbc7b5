#!/usr/bin/env python3
"""The MAC over the sample-level shared medium: one LeNet-size round with N = 3 robots.

The broker (scaleflu.radio.medium, issue 11's radio side) and 4 ``ofdm-shared`` links (server 0,
robots 1..3) with the MAC under them (scaleflu.link.kinds.open_link -> attach_mac) run in this
process: the server broadcasts a 247,210-byte payload once (repaired as robots report gaps),
then the 3 robots upload 247,210 bytes each at once; the MAC schedules them. Airtime comes from
the broker in virtual samples. Compare with ``benchmarks/mac_bench.py`` (frame level). Run by
hand (about 3 minutes on 2 cores)::

    .venv/bin/python benchmarks/mac_sample_level.py   # -> benchmarks/results/mac_sample_level.json

The MAC's timers run on wall-clock time while the medium runs in virtual time (slower than real
time here), so the grant guard is wide (``--guard-s``, 3 s) and registration slots are off.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import threading
import time
from pathlib import Path

from scaleflu.link.kinds import open_link

SIZE = 247210  # the LeNet-5 state dict in the wire format (raw float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=SIZE)
    ap.add_argument("--guard-s", type=float, default=3.0)
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--fading", default="rician")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/mac_sample_level.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig, broker_stats

    cfg = MediumConfig(
        nodes=(0, 1, 2, 3),
        seed=args.seed,
        address="tcp://127.0.0.1:0",  # a free port (others may run a broker on the default)
        default=LinkChannel(snr_db=args.snr_db, fading=args.fading),
    )
    mac = {"guard_s": args.guard_s, "contention_slots": 0}
    out: dict = {"args": vars(args)}
    t0 = time.monotonic()
    with MediumBroker(cfg).start() as br:
        srv = open_link("ofdm-shared", 0, broker=br.address, members=(1, 2, 3), seed=0, mac=mac)
        robots = {
            r: open_link("ofdm-shared", r, broker=br.address, seed=r, mac=mac) for r in (1, 2, 3)
        }
        rng = random.Random(args.seed)
        model = rng.randbytes(args.size)
        h = srv.broadcast(model, [1, 2, 3], timeout=600)
        got = {r: robots[r].recv(600) for r in robots}
        h.wait(60)
        s0 = broker_stats(br.address)
        out["broadcast"] = {
            "ok": h.ok,
            "passes": h.passes,
            "bit_exact": {r: g is not None and g[1] == model for r, g in got.items()},
            "wall_s": time.monotonic() - t0,
        }
        ups = {r: rng.randbytes(args.size) for r in robots}
        res: dict[int, bool] = {}
        threads = [
            threading.Thread(
                target=lambda r=r: res.__setitem__(r, robots[r].send(0, ups[r], timeout=900).ok)
            )
            for r in robots
        ]
        for t in threads:
            t.start()
        rx: dict[int, bool] = {}
        while len(rx) < 3 and time.monotonic() - t0 < 1500:
            m = srv.recv(5)
            if m is not None:
                rx[m[0]] = m[1] == ups[m[0]]
        for t in threads:
            t.join(30)
        s1 = broker_stats(br.address)
        out["uploads"] = {"delivered": res, "bit_exact": rx, "wall_s": time.monotonic() - t0}
        out["broker_after_broadcast"] = {k: v for k, v in s0.items() if k != "links"}
        out["broker_after_uploads"] = {k: v for k, v in s1.items() if k != "links"}
        out["mac_server"] = srv.stats().get("mac")
        out["airtime_total_s"] = sum(s1["airtime_s"].values())
        for link in [srv, *robots.values()]:
            link.close()
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({k: out[k] for k in ("broadcast", "uploads", "airtime_total_s")}, default=str))
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
