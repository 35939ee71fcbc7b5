"""Send or receive one test message over any link kind and print the result as JSON.

Check a link end to end before running FL over it, e.g. two processes over ZeroMQ::

    python -m scaleflu.cli.linktest --kind ofdm-pairs --node 1 --peers 0 --recv 1
    python -m scaleflu.cli.linktest --kind ofdm-pairs --node 0 --peers 1 --send 250000

or three processes on one simulated frequency (scaleflu.radio.medium; node 0 schedules the
MAC, the others are its members)::

    python -m scaleflu.cli.medium --nodes 0,1
    python -m scaleflu.cli.linktest --kind ofdm-shared --node 1 --recv 1
    python -m scaleflu.cli.linktest --kind ofdm-shared --node 0 --send 250000 --dst 1

or two radios (one command per machine; no MAC)::

    python -m scaleflu.cli.linktest --kind uhd --node 1 \\
        --tx-args type=b200,master_clock_rate=20e6 --recv 1
    python -m scaleflu.cli.linktest --kind uhd --node 0 --tx-args type=b200 \\
        --rx-args type=x300,addr=192.168.40.2,master_clock_rate=200e6 --send 250000 --dst 1

The payload is seeded random bytes; both sides print its SHA-256. A missing radio ends the
program with one line (RadioNotFound: ...) and exit status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time

import numpy as np

from scaleflu.linkkinds import UnknownLinkKindError, canonical_kind, close_links, open_link

KINDS_HERE = ("ofdm-pairs", "ofdm-shared", "uhd", "ofdm-loopback", "memory")


def _kind(text: str) -> str:
    try:
        kind = canonical_kind(text)
    except UnknownLinkKindError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if kind not in KINDS_HERE:
        raise argparse.ArgumentTypeError(f"{kind!r} is not one of {', '.join(KINDS_HERE)}")
    return kind


def payload(size: int, seed: int) -> bytes:
    """The seeded random test payload."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scaleflu.cli.linktest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--kind", default="ofdm-pairs", type=_kind, help=", ".join(KINDS_HERE))
    p.add_argument("--node", type=int, required=True, help="this node's id")
    p.add_argument("--peers", default="", help="ofdm-pairs peers: ids or id@host, comma-separated")
    p.add_argument("--dst", type=int, default=None, help="destination (default: first peer)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--send", type=int, metavar="BYTES", help="send one message of BYTES")
    g.add_argument("--recv", type=int, metavar="N", help="receive N messages")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--linger", type=float, default=2.0, help="seconds to keep ACKing after recv")
    p.add_argument("--base-port", type=int, default=52000)
    p.add_argument(
        "--broker",
        default="tcp://127.0.0.1:53100",
        help="ofdm-shared: medium broker (python -m scaleflu.cli.medium --nodes 0,1)",
    )
    p.add_argument("--snr-db", type=float, default=None, help="ofdm-pairs: receive-side AWGN")
    p.add_argument("--cfo", type=float, default=0.0)
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--tx-args", default="type=b200,master_clock_rate=20e6")
    p.add_argument("--rx-args", default=None)
    p.add_argument("--freq", type=float, default=2.45e9)
    p.add_argument("--samp-rate", type=float, default=5e6)
    p.add_argument("--tx-gain", type=float, default=60.0)
    p.add_argument("--rx-gain", type=float, default=30.0)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one send or receive; print JSON; exit 0 on success."""
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    peers = [s.strip() for s in a.peers.split(",") if s.strip()]
    opts: dict = {}
    if a.kind == "ofdm-pairs":
        opts = {"peers": peers, "base_port": a.base_port, "drop_rate": a.drop_rate, "cfo": a.cfo}
        if a.snr_db is not None:
            opts["snr_db"] = a.snr_db
    elif a.kind == "ofdm-shared":  # node 0 schedules the MAC; every node is a member from the start
        members = [int(x.split("@")[0]) for x in peers] or ([a.dst] if a.dst is not None else [])
        opts = {
            "broker": a.broker,
            "timeout": a.timeout,
            "members": tuple(members) if a.node == 0 else (a.node,),
            "seed": a.seed + a.node,
        }
    elif a.kind == "uhd":
        opts = {
            "tx_args": a.tx_args,
            "rx_args": a.rx_args,
            "freq": a.freq,
            "samp_rate": a.samp_rate,
            "tx_gain": a.tx_gain,
            "rx_gain": a.rx_gain,
        }
    try:
        link = open_link(a.kind, a.node, **opts)
    except (RuntimeError, ValueError) as exc:  # no radio, no broker, bad options: one line
        line = getattr(exc, "line", None)
        print(line() if callable(line) else f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        if a.send is not None:
            dst = a.dst if a.dst is not None else int(peers[0].split("@")[0])
            data = payload(a.send, a.seed)
            res = link.send(dst, data, timeout=a.timeout)
            out = {
                "status": res.status.value,
                "reason": res.reason,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "elapsed": res.elapsed,
                "frames_sent": res.frames_sent,
                "retransmissions": res.retransmissions,
            }
            print(json.dumps(out), flush=True)
            return 0 if res.ok else 2
        got = []
        end = time.monotonic() + a.timeout
        while len(got) < a.recv and time.monotonic() < end:
            item = link.recv(timeout=max(0.01, end - time.monotonic()))
            if item is not None:
                src, data = item
                got.append(
                    {"src": src, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                )
                print(json.dumps(got[-1]), flush=True)
        time.sleep(a.linger)  # keep answering retransmissions with ACKs
        return 0 if len(got) == a.recv else 3
    finally:
        link.close()
        close_links()


if __name__ == "__main__":
    sys.exit(main())
