"""``scaleflu iplink``: IP over the link from the command line.

* ``scaleflu iplink node ...``: one node's process (:func:`scaleflu.iplink.node.run_node`): its
  TUN interface bridged to its link until SIGTERM or SIGINT;
* ``scaleflu iplink testbed ...``: the local IP testbed (server and robots in network namespaces
  of their own, :class:`scaleflu.iplink.testbed.LocalIpTestbed`) until Ctrl-C.

Both need root; without it they say so in one line (exit status 2). Guide: docs/ip-over-radio.md.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
import threading

log = logging.getLogger("scaleflu.iplink")


def _cmd_node(args: argparse.Namespace) -> int:
    from scaleflu.iplink.netns import IpLinkError
    from scaleflu.iplink.node import run_node

    try:
        return run_node(args)
    except IpLinkError as exc:
        log.error("%s", exc)
        return 2


def _cmd_testbed(args: argparse.Namespace) -> int:
    from scaleflu.iplink.netns import IpLinkError
    from scaleflu.iplink.testbed import LocalIpTestbed

    channel = {} if args.loss is None else {"loss": args.loss}
    mac = {} if args.idle_poll is None else {"idle_poll_s": args.idle_poll}
    workdir = tempfile.mkdtemp(prefix="sfl-ip-")  # kept: the nodes' logs and counters
    try:
        tb = LocalIpTestbed(args.robots, args.kind, channel=channel, mac=mac, workdir=workdir)
        tb.start()
    except IpLinkError as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        log.error("%s", exc)
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


def add_node_args(p: argparse.ArgumentParser) -> None:
    """The options of one node (``scaleflu iplink node``)."""
    p.add_argument("--node", type=int, required=True, help="this node's link id (0: the server)")
    p.add_argument("--kind", default="frames-shared", help="link kind (scaleflu.linkkinds)")
    p.add_argument("--link-opts", default="{}", help="JSON options of open_link (hub, ...)")
    p.add_argument("--keys", required=True, help="this node's link key file (JSON, 0600)")
    p.add_argument("--netns", default=None, help="move the interface into this namespace")
    p.add_argument("--ifname", default=None, help="interface name (default sfl<node>)")
    p.add_argument("--subnet", default=None, help="the tunnel's IPv4 subnet (10.77.0.0/24)")
    p.add_argument("--mtu", type=int, default=None, help="interface MTU (default: one frame)")
    p.add_argument("--rto-min-ms", type=int, default=None, help="TCP's minimum RTO on the route")
    p.add_argument(
        "--reorder", action="store_true", help="put each sender's messages back in its order"
    )
    p.add_argument("--max-inflight", type=int, default=4, help="messages in flight per peer")
    p.add_argument("--max-batch", type=int, default=32768, help="bytes of one link message")
    p.add_argument("--ready-file", default=None, help="written once the bridge runs")
    p.add_argument("--stats-file", default=None, help="counters (JSON), rewritten periodically")
    p.add_argument("--stats-every", type=float, default=5.0, help="seconds between counters")


def add_iplink_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``scaleflu iplink {node,testbed}``."""
    p = subparsers.add_parser(
        "iplink", help="IP over the link: one node's TUN bridge, or a local IP testbed (root)"
    )
    sub = p.add_subparsers(dest="iplink_command", metavar="{node,testbed}", required=True)
    node = sub.add_parser(
        "node", help="one node: a TUN interface bridged to the node's link (root)"
    )
    add_node_args(node)
    node.set_defaults(func=_cmd_node)
    tb = sub.add_parser(
        "testbed",
        help="server and robots in network namespaces of their own, IP over the simulated "
        "radio between them, until Ctrl-C (root)",
    )
    tb.add_argument("--robots", type=int, default=2)
    tb.add_argument("--kind", default="frames-shared", help="frames, frames-shared or ofdm-shared")
    tb.add_argument("--loss", type=float, default=None, help="frame loss (frames kinds)")
    tb.add_argument("--idle-poll", type=float, default=None, help="MAC idle poll of a robot, s")
    tb.set_defaults(func=_cmd_testbed)
    return p
