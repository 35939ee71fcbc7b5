"""Where a scheduled round's time goes on the demo's fading channel, at frame level.

One FedAvg round of 3 robots (LeNet-size model down by broadcast, 1.5-2 s of training, the
updates up under the MAC) in ``scaleflu.link.macsim.simulate_round``, its frame losses drawn
from the sample-level medium's own fading trace through the OFDM PHY's measured frame error
rate per SNR (``mac_sample_level.fading_loss``: Rician K = 6 dB, 2 Hz Doppler, 20 dB mean SNR,
as ``make demo``), its timing fitted to the sample level (lockstep block start, receiver
latency). One realisation per seed; every variant runs the same realisations, interleaved.

Variants are MacConfig / ArqConfig overrides (``--variant name:key=value,...``; the MAC keys of
``MacConfig``, ARQ keys prefixed ``arq.``). Prints per variant the round time (last update in,
virtual seconds) min / median / 90th percentile / max, lost frames and grant timeouts; writes
``benchmarks/results/mac_fading_tail.json``.

    .venv/bin/python benchmarks/mac_fading_tail.py --realisations 40 \\
        --variant g48k:grant_bytes=49152 --variant g16k:grant_bytes=16384
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from scaleflu.link.arq import ArqConfig
from scaleflu.link.defaults import MAC_DEFAULTS
from scaleflu.link.mac import MacConfig
from scaleflu.radio.medium.framelevel import LENET_BYTES, fading_loss, frame_level


def parse_variant(text: str) -> tuple[str, dict[str, float], dict[str, float]]:
    """``name:key=value,...`` -> (name, MacConfig overrides, ArqConfig overrides)."""
    name, _, rest = text.partition(":")
    if not name:
        raise SystemExit(f"--variant {text!r}: NAME:key=value,... expected")
    mac: dict[str, float] = {}
    arq: dict[str, float] = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {item!r} is not key=value")
        num = float(val)
        value = int(num) if num.is_integer() and "." not in val else num
        if key.startswith("arq."):
            if key[4:] not in ArqConfig.__dataclass_fields__:
                raise SystemExit(f"--variant {text!r}: no ArqConfig field {key[4:]!r}")
            arq[key[4:]] = value
        else:
            if key not in MacConfig.__dataclass_fields__:
                raise SystemExit(f"--variant {text!r}: no MacConfig field {key!r}")
            mac[key] = value
    return name, mac, arq


def one_round(seed: int, mac: dict, arq: dict, args: argparse.Namespace) -> dict:
    """One round on realisation ``seed`` with the variant's overrides (``frame_level``)."""
    r = frame_level(
        LENET_BYTES,
        MacConfig(**{**MAC_DEFAULTS["virtual"], **mac}),
        seed,
        args.deadline,
        True,
        fading_loss(seed, args.snr_db, args.fading, 0.0),
        robots=args.robots,
        train_s=args.train_s,
        train_jitter_s=args.train_jitter_s,
        arq=arq,
    )
    done = len(r["updates_s"]) == args.robots
    keys = ("lost_link", "collided_frames", "grant_timeouts", "grants", "bcast_passes", "bit_exact")
    return {"seed": seed, "round_s": r["round_s"] if done else None, **{k: r[k] for k in keys}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--realisations", type=int, default=20)
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,...")
    ap.add_argument("--robots", type=int, default=3)
    ap.add_argument("--snr-db", type=float, default=20.0)
    ap.add_argument("--fading", default="rician", choices=("rician", "rayleigh", "none"))
    ap.add_argument("--train-s", type=float, default=1.5)
    ap.add_argument("--train-jitter-s", type=float, default=0.5)
    ap.add_argument("--deadline", type=float, default=120.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    variants = [("default", {}, {})] + [parse_variant(v) for v in args.variant]
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    t0 = time.perf_counter()
    for seed in range(args.realisations):
        for name, mac, arq in variants:  # interleaved: every variant on the same realisation
            rows[name].append(one_round(seed, mac, arq, args))
    wall = time.perf_counter() - t0
    summary = {}
    print(f"{args.realisations} realisations, {args.fading} {args.snr_db:g} dB, {wall:.0f} s wall")
    print("variant      round s: min / median / p90 / max   unfinished  lost frames  timeouts")
    for name, rs in rows.items():
        t = [r["round_s"] for r in rs if r["round_s"] is not None]
        s = {
            "round_s": [
                float(np.min(t)),
                float(np.median(t)),
                float(np.percentile(t, 90)),
                float(np.max(t)),
            ]
            if t
            else None,
            "unfinished": sum(r["round_s"] is None for r in rs),
            "lost_frames_median": float(np.median([r["lost_link"] for r in rs])),
            "grant_timeouts_median": float(np.median([r["grant_timeouts"] for r in rs])),
            "bit_exact": all(r["bit_exact"] for r in rs),
        }
        summary[name] = s
        rt = " / ".join(f"{x:.1f}" for x in s["round_s"]) if s["round_s"] else "-"
        print(
            f"{name:12s} {rt:34s} {s['unfinished']:10d}  {s['lost_frames_median']:11.0f}  "
            f"{s['grant_timeouts_median']:8.1f}"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "mac_fading_tail.json"
    path.write_text(
        json.dumps(
            {
                "command": " ".join(sys.argv),
                "args": vars(args),
                "wall_s": wall,
                "variants": {n: {"mac": m, "arq": a} for n, m, a in variants},
                "summary": summary,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
