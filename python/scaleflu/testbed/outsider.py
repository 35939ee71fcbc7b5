"""A keyless outsider on the frame hub: floods the link while the apps run (a test tool).

``python -m scaleflu.testbed.outsider --hub tcp://127.0.0.1:PORT --robots 3`` connects to a
:class:`scaleflu.link.hub.FrameHub` as node ``--node`` (default 77, holding no key) and sends
``--rate`` frames per second, cycling through these kinds:

* ``keyless_partial``: DATA fragments of 64-fragment messages from its own id to the server
  (partial messages that try to fill the server's reassembly and evict the robots');
* ``keyless_message``: complete one-fragment messages from its own id to the server (they reach
  the server's message parser, which refuses them);
* ``forged_data``, ``forged_ack``, ``forged_nack``: DATA, COMPLETE ACK and REFUSED NACK frames
  claiming to come from a robot (a keyed peer of the server) with no valid link tag;
* ``forged_server_nack``: REFUSED NACKs to a robot claiming to come from the server;
* ``garbage``: random bytes (no frame at all).

Forged ACK/NACK frames use small message ids, so they hit the ids of sends in flight. On exit
(``--duration`` elapsed, SIGTERM or Ctrl-C) it writes ``{"frames": {kind: count}, ...}`` to
``--summary``. For the tests and ``apps/testbed.py --outsider-rate``; not a tool for real
radios.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq

from scaleflu.link.frame import FrameType, encode_frame

SERVER = 0
KINDS = (
    "keyless_partial",
    "keyless_message",
    "forged_data",
    "forged_ack",
    "forged_nack",
    "forged_server_nack",
    "garbage",
)
_NODE = struct.Struct(">H")


def make_frame(kind: str, node: int, robots: Sequence[int], rng: random.Random) -> bytes:
    """One frame of ``kind`` (see the module docstring)."""
    r = rng.choice(list(robots))
    mid = rng.randrange(0, 64) if kind.startswith("forged") else rng.randrange(1 << 32)
    if kind == "keyless_partial":
        return encode_frame(
            FrameType.DATA, node, SERVER, mid % 256, rng.randrange(64), 64, rng.randbytes(200)
        )
    if kind == "keyless_message":
        return encode_frame(FrameType.DATA, node, SERVER, mid, 0, 1, rng.randbytes(120))
    if kind == "forged_data":
        return encode_frame(FrameType.DATA, r, SERVER, mid, 0, 2, rng.randbytes(200))
    if kind == "forged_ack":  # COMPLETE, count 1, base 1, empty bitmap
        return encode_frame(
            FrameType.ACK, r, SERVER, mid, 0, 1, b"\x01" + struct.pack(">IIH", 1, 1, 0)
        )
    if kind == "forged_nack":  # REFUSED
        return encode_frame(FrameType.NACK, r, SERVER, mid, 0, 1, struct.pack(">BI", 2, 1))
    if kind == "forged_server_nack":
        return encode_frame(FrameType.NACK, SERVER, r, mid, 0, 1, struct.pack(">BI", 2, 1))
    if kind == "garbage":
        return rng.randbytes(rng.randrange(1, 300))
    raise ValueError(f"unknown frame kind {kind!r}")


def flood(
    hub: str,
    robots: Sequence[int],
    node: int = 77,
    rate: float = 400.0,
    duration: float = 60.0,
    seed: int = 0,
    stop: Any = None,
) -> dict[str, Any]:
    """Send ``rate`` frames/s to the hub for ``duration`` s (or until ``stop()`` is true)."""
    ctx = zmq.Context.instance()
    tx = ctx.socket(zmq.DEALER)
    tx.setsockopt(zmq.IDENTITY, b"T" + _NODE.pack(node))
    tx.setsockopt(zmq.LINGER, 0)
    tx.connect(hub)
    rx = ctx.socket(zmq.DEALER)  # registered as a receiver too (a node on the medium)
    rx.setsockopt(zmq.IDENTITY, b"R" + _NODE.pack(node))
    rx.setsockopt(zmq.LINGER, 0)
    rx.connect(hub)
    rx.send(b"")
    rng = random.Random(seed)
    counts = dict.fromkeys(KINDS, 0)
    t0 = time.monotonic()
    n = 0
    last_ping = t0
    try:
        while time.monotonic() - t0 < duration and not (stop and stop()):
            kind = KINDS[n % len(KINDS)]
            try:
                tx.send(make_frame(kind, node, robots, rng), zmq.NOBLOCK)
                counts[kind] += 1
            except zmq.ZMQError:
                pass
            n += 1
            while rx.poll(0):  # drain what the medium sends us (ACKs of the keyless frames)
                rx.recv()
            now = time.monotonic()
            if now - last_ping > 1.0:
                rx.send(b"", zmq.NOBLOCK)
                last_ping = now
            wait = t0 + n / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
    finally:
        tx.close(0)
        rx.close(0)
    return {"node": node, "rate": rate, "seconds": time.monotonic() - t0, "frames": counts}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scaleflu.testbed.outsider``."""
    p = argparse.ArgumentParser(prog="python -m scaleflu.testbed.outsider", description=__doc__)
    p.add_argument("--hub", required=True, help="the frame hub's address (tcp://...)")
    p.add_argument("--robots", type=int, default=3, help="robot ids 1..N to impersonate")
    p.add_argument("--node", type=int, default=77, help="its own node id (no key)")
    p.add_argument("--rate", type=float, default=400.0, help="frames per second")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--summary", default=None, help="write the frame counts here (JSON)")
    args = p.parse_args(argv)
    stopped = {"flag": False}

    def _stop(signum: int, frame: Any) -> None:
        stopped["flag"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    out = flood(
        args.hub,
        list(range(1, args.robots + 1)),
        args.node,
        args.rate,
        args.duration,
        args.seed,
        stop=lambda: stopped["flag"],
    )
    if args.summary:
        Path(args.summary).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
