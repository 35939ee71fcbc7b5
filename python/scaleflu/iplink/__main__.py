"""``python -m scaleflu.iplink node ...`` (one node) | ``testbed ...`` (a local IP testbed)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence


def _testbed(argv: Sequence[str]) -> int:
    from scaleflu.iplink.netns import IpLinkError
    from scaleflu.iplink.testbed import KINDS, LocalIpTestbed

    p = argparse.ArgumentParser(
        prog="python -m scaleflu.iplink testbed",
        description="Server and robots in network namespaces of their own, IP over the "
        "simulated radio between them; runs until Ctrl-C.",
    )
    p.add_argument("--robots", type=int, default=2)
    p.add_argument("--kind", choices=KINDS, default="frames-shared")
    p.add_argument("--loss", type=float, default=None, help="frame loss (frames kinds)")
    p.add_argument("--idle-poll", type=float, default=None, help="MAC idle poll of a robot, s")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    channel = {} if args.loss is None else {"loss": args.loss}
    mac = {} if args.idle_poll is None else {"idle_poll_s": args.idle_poll}
    try:
        tb = LocalIpTestbed(args.robots, args.kind, channel=channel, mac=mac).start()
    except IpLinkError as exc:
        logging.getLogger("scaleflu.iplink").error("%s", exc)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for n in tb.nodes:
            role = "server" if n == 0 else f"robot {n}"
            sys.stdout.write(
                f"{role}: {tb.address(n)} in namespace {tb.namespaces[n]} "
                f"(sudo ip netns exec {tb.namespaces[n]} bash)\n"
            )
        sys.stdout.write(f"logs and counters in {tb.workdir}; Ctrl-C stops\n")
        sys.stdout.flush()
        stop.wait()
    finally:
        tb.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to ``node`` or ``testbed``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("node", "testbed"):
        sys.stderr.write("usage: python -m scaleflu.iplink {node,testbed} ... (--help)\n")
        return 2
    if argv[0] == "node":
        from scaleflu.iplink.node import main as node_main

        return node_main(argv[1:])
    return _testbed(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
