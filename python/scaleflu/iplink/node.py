"""One node of IP over the link, as a process: ``scaleflu iplink node ...``.

Creates the node's TUN interface (in ``--netns`` if given: the interface moves there, the
process and its link stay where they are, so the link's own transport -- the frame hub or the
medium broker on 127.0.0.1 -- stays reachable while the namespace sees only the tunnel), opens
the tunnel's link (:func:`~scaleflu.iplink.bridge.open_tunnel_link`) and bridges the two until
SIGTERM or SIGINT. ``--ready-file`` is written once packets flow; ``--stats-file`` gets the
bridge's and the link's counters (JSON) every ``--stats-every`` seconds and at the end.

Key file (JSON, mode 0600): ``{"node": n, "peers": {"<peer>": "<hex key>", ...}}``: the
server's holds a key per robot, a robot's the key it shares with the server
(:func:`write_key_files`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaleflu.iplink.bridge import AddressPlan, IpBridge, open_tunnel_link, tunnel_mtu
from scaleflu.iplink.netns import (
    IpLinkError,
    check_root,
    configure_interface,
    move_to_namespace,
)
from scaleflu.iplink.tun import TunDevice

log = logging.getLogger(__name__)


def write_key_files(folder: Path, server: int, robots: Sequence[int]) -> dict[int, Path]:
    """Fresh 32-byte link keys, one per robot shared with ``server``; a key file per node
    (mode 0600) in ``folder``. Returns node -> key file."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = {r: secrets.token_bytes(32) for r in robots}
    files = {}
    peers_of = {server: {r: k for r, k in keys.items()}} | {r: {server: keys[r]} for r in robots}
    for node, peers in peers_of.items():
        path = folder / f"link-keys-{node}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"node": node, "peers": {str(p): k.hex() for p, k in peers.items()}}, fh)
        files[node] = path
    return files


def read_key_file(path: str | Path, node: int) -> dict[int, bytes]:
    """The peers' keys of ``node`` from its key file (IpLinkError naming the file if bad)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        if int(data["node"]) != int(node):
            raise ValueError(f"it is node {data['node']}'s, not node {node}'s")
        keys = {int(p): bytes.fromhex(k) for p, k in dict(data["peers"]).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IpLinkError(f"{path}: not a usable link key file ({exc})") from None
    if not keys or any(len(k) < 16 for k in keys.values()):
        raise IpLinkError(f"{path}: every link key must be at least 16 bytes")
    return keys


def node_stats(bridge: IpBridge, link: Any) -> dict[str, Any]:
    """The bridge's and the link's counters."""
    out: dict[str, Any] = {
        "node": bridge.node,
        "time": time.time(),
        "bridge": bridge.stats.as_dict(),
    }
    try:
        out["link"] = link.stats()
    except Exception:  # a back-end without stats
        out["link"] = None
    refused = getattr(link, "broadcast_refused", None)
    out["broadcast_refused"] = refused() if refused else None
    return out


def run_node(args: argparse.Namespace) -> int:
    """Set up the interface and the link, bridge until signalled.

    ``args``: the options of ``scaleflu iplink node`` (:func:`scaleflu.cli.iplink.add_node_args`).
    """
    check_root()
    keys = read_key_file(args.keys, args.node)
    plan = AddressPlan(args.subnet) if args.subnet else AddressPlan()
    opts = json.loads(args.link_opts)
    mtu = args.mtu or tunnel_mtu(int(opts.get("arq", {}).get("mtu", 1500)))
    ifname = args.ifname or f"sfl{args.node}"
    tun = TunDevice(ifname)
    link = None
    bridge = None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if args.netns:
            move_to_namespace(ifname, args.netns)
        configure_interface(ifname, plan.cidr(args.node), mtu, args.netns, args.rto_min_ms)
        link = open_tunnel_link(args.kind, args.node, keys, **opts)
        bridge = IpBridge(
            link,
            tun,
            plan,
            max_inflight=args.max_inflight,
            max_batch=args.max_batch,
            reorder=args.reorder,
        ).start()
        log.info(
            "node %d: %s %s (MTU %d)%s over %s",
            args.node,
            ifname,
            plan.cidr(args.node),
            mtu,
            f" in namespace {args.netns}" if args.netns else "",
            args.kind,
        )
        if args.ready_file:
            Path(args.ready_file).write_text(json.dumps({"node": args.node, "mtu": mtu}))
        while not stop.wait(args.stats_every):
            if args.stats_file:
                Path(args.stats_file).write_text(json.dumps(node_stats(bridge, link)))
    finally:
        if bridge is not None:
            bridge.close()
            if args.stats_file:
                Path(args.stats_file).write_text(json.dumps(node_stats(bridge, link)))
        if link is not None:
            link.close()
        tun.close()
    return 0
