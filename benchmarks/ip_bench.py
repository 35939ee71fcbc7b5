"""IP over the link against the link's own message API, on the same simulated channel.

For each repetition (interleaved):

1. **tunnel**: the local IP testbed (:class:`scaleflu.iplink.testbed.LocalIpTestbed`: server
   0 and robot 1 in namespaces of their own, the tunnel their only interface) on ``--kind``;
   inside the namespaces, plain Python sockets: 40 UDP round trips of 64 bytes (robot ->
   server -> robot: latency as ``ping`` would see it), then a TCP transfer of ``--bytes``
   robot -> server (upload: what a SuperNode's update is) and server -> robot, each timed from
   ``connect`` to the receiver's last byte; the kernel's TCP counters (``nstat``: segments
   retransmitted) of the sender's namespace.
2. **link API**: a fresh medium of the same kind and settings, the server's link in this
   process and the robot's in a process of its own (as the tunnel's nodes are), the same
   number of bytes as one message ``Link.send`` (robot -> server, then server -> robot), and
   40 round trips of a 64-byte message.

Writes ``benchmarks/results/ip_bench.json`` (every repetition and min / median / max).

    sudo PYTHONPATH=python .venv/bin/python benchmarks/ip_bench.py [--kind frames-shared]
        [--bytes 1000000] [--repeat 3] [--loss 0.02] [--idle-poll 0.5]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from scaleflu.iplink.testbed import KINDS, SERVER, LocalIpTestbed

ROOT = Path(__file__).resolve().parents[1]

log = logging.getLogger("ip_bench")

UDP_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{addr}", 7000))
while True:
    d, a = s.recvfrom(65535)
    s.sendto(d, a)
"""

UDP_PROBE = """
import json, socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5.0)
rtt, lost = [], 0
for i in range(40):
    t = time.perf_counter()
    s.sendto(i.to_bytes(4, "big") + bytes(60), ("{addr}", 7000))
    try:
        while True:
            d, _ = s.recvfrom(100)
            if int.from_bytes(d[:4], "big") == i:
                break
        rtt.append(time.perf_counter() - t)
    except socket.timeout:
        lost += 1
    time.sleep(0.05)
print(json.dumps({{"rtt_s": rtt, "lost": lost}}))
"""

TCP_SINK = """
import json, socket, time
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("{addr}", {port}))
t.listen(1)
print("ready", flush=True)
c, _ = t.accept()
n, t0 = 0, time.perf_counter()
while True:
    b = c.recv(1 << 16)
    if not b:
        break
    n += len(b)
print(json.dumps({{"bytes": n, "recv_s": time.perf_counter() - t0, "end": time.time()}}))
"""

TCP_SOURCE = """
import json, socket, time
for _ in range(200):
    try:
        t0 = time.time()
        c = socket.create_connection(("{addr}", {port}), timeout=60)
        break
    except (ConnectionRefusedError, OSError):
        time.sleep(0.1)
c.settimeout(None)  # a slow medium: the transfer may take minutes
c.sendall(bytes({nbytes}))
c.shutdown(socket.SHUT_WR)
c.recv(1)
print(json.dumps({{"start": t0}}))
"""


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _nstat(tb: LocalIpTestbed, node: int) -> dict[str, int]:
    out = tb.run(node, ["nstat", "-az", "TcpRetransSegs", "TcpOutSegs", "TcpExtTCPLostRetransmit"])
    vals = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            vals[parts[0]] = int(parts[1])
    return vals


def tcp_transfer(tb: LocalIpTestbed, src: int, dst: int, nbytes: int, port: int) -> dict[str, Any]:
    """``nbytes`` over TCP from node ``src`` to node ``dst``: seconds and goodput."""
    before = _nstat(tb, src)
    sink = tb.popen(
        dst,
        _py(TCP_SINK.format(addr=tb.address(dst), port=port)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sink.stdout is not None
    assert sink.stdout.readline().strip() == "ready"
    source = tb.run(
        src, _py(TCP_SOURCE.format(addr=tb.address(dst), port=port, nbytes=nbytes)), timeout=900
    )
    got = json.loads(sink.stdout.readline())
    sink.wait(timeout=30)
    if source.returncode != 0:
        sink.kill()
        return {"bytes": 0, "s": None, "goodput_Bps": 0.0, "error": source.stderr[-500:]}
    start = json.loads(source.stdout.strip().splitlines()[-1])["start"]
    secs = got["end"] - start
    after = _nstat(tb, src)
    return {
        "bytes": got["bytes"],
        "s": secs,
        "goodput_Bps": got["bytes"] / secs,
        "tcp": {k: after.get(k, 0) - before.get(k, 0) for k in after},
    }


def tunnel_run(args: argparse.Namespace, rep: int, reorder: bool = False) -> dict[str, Any]:
    """The tunnel's measurements on a fresh testbed."""
    channel = {} if args.loss is None else {"loss": args.loss}
    mac = {} if args.idle_poll is None else {"idle_poll_s": args.idle_poll}
    out: dict[str, Any] = {}
    with LocalIpTestbed(
        1,
        args.kind,
        channel=channel,
        mac=mac,
        seed=rep,
        rto_min_ms=args.rto_min_ms,
        reorder=reorder,
    ) as tb:
        tb.popen(SERVER, _py(UDP_ECHO.format(addr=tb.address(SERVER))))
        time.sleep(1.0)
        probe = tb.run(1, _py(UDP_PROBE.format(addr=tb.address(SERVER))), timeout=600)
        out["udp_rtt"] = json.loads(probe.stdout.strip().splitlines()[-1])
        out["tcp_up"] = tcp_transfer(tb, 1, SERVER, args.bytes, 7101)
        out["tcp_down"] = tcp_transfer(tb, SERVER, 1, args.bytes, 7102)
        time.sleep(2.5)
        st = tb.stats()
        out["tunnel"] = {
            n: {"bridge": s["bridge"], "arq": (s.get("link") or {}).get("arq")}
            for n, s in st.items()
            if s
        }
    return out


ROBOT_LINK = """
import json, sys, time
from scaleflu.linkkinds import open_link
link = open_link({kind!r}, 1, **json.loads({opts!r}))
link.set_peer_key(0, bytes(32))
print("ready", flush=True)
# receive the server's message and answer every echo request, until told to stop
while True:
    got = link.recv(600)
    if got is None:
        break
    src, data = got
    if data == b"stop":
        break
    if data[:4] == b"ping":
        link.send(0, data, timeout=30)
    elif data[:4] == b"send":
        n = int(data[4:])
        t0 = time.time()
        res = link.send(0, bytes(n), timeout=600)
        print(json.dumps({{"start": t0, "ok": res.ok}}), flush=True)
link.close()
"""


def link_api_run(args: argparse.Namespace, rep: int) -> dict[str, Any]:
    """The link's message API on a fresh medium of the same kind and settings."""
    channel = {} if args.loss is None else {"loss": args.loss}
    mac = {} if args.idle_poll is None else {"idle_poll_s": args.idle_poll}
    tb = LocalIpTestbed(1, args.kind, channel=channel, mac=mac, seed=rep)  # for its medium
    tb._start_medium()
    from scaleflu.linkkinds import open_link

    out: dict[str, Any] = {}
    robot = None
    server = None
    try:
        ropts = tb.link_opts(1)
        robot = subprocess.Popen(
            _py(ROBOT_LINK.format(kind=args.kind, opts=json.dumps(ropts))),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert robot.stdout is not None
        server = open_link(args.kind, SERVER, **tb.link_opts(SERVER))
        server.set_peer_key(1, bytes(32))
        assert robot.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        rtt = []
        for i in range(40):
            t = time.perf_counter()
            server.send(1, b"ping" + i.to_bytes(4, "big") + bytes(56), timeout=30)
            got = server.recv(30)
            if got is not None:
                rtt.append(time.perf_counter() - t)
            time.sleep(0.05)
        out["msg_rtt"] = {"rtt_s": rtt, "lost": 40 - len(rtt)}
        server.send(1, b"send" + str(args.bytes).encode(), timeout=30)
        got = server.recv(900)
        end = time.time()
        start = json.loads(robot.stdout.readline())["start"]
        out["msg_up"] = {
            "bytes": len(got[1]) if got else 0,
            "s": end - start,
            "goodput_Bps": (len(got[1]) if got else 0) / (end - start),
        }
        t0 = time.perf_counter()
        res = server.send(1, bytes(args.bytes), timeout=900)
        # the robot's receipt is the DELIVERED status (its COMPLETE ACK)
        secs = time.perf_counter() - t0
        out["msg_down"] = {
            "bytes": args.bytes if res.ok else 0,
            "s": secs,
            "goodput_Bps": args.bytes / secs,
            "ok": res.ok,
            "retransmissions": res.retransmissions,
        }
        server.send(1, b"stop", timeout=30)
    finally:
        if server is not None:
            server.close()
        if robot is not None:
            try:
                robot.wait(timeout=30)
            except subprocess.TimeoutExpired:
                robot.kill()
        tb._medium.close()
    return out


def _summary(xs: list[float]) -> dict[str, float] | None:
    return (
        {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}
        if xs
        else None
    )


def main() -> int:
    """Interleaved repetitions; ``benchmarks/results/ip_bench.json``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS, default="frames-shared")
    p.add_argument("--bytes", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--loss", type=float, default=None, help="frame loss (frame hub kinds)")
    p.add_argument("--idle-poll", type=float, default=None, help="MAC idle poll of a robot, s")
    p.add_argument(
        "--reorder-too",
        action="store_true",
        help="also run the tunnel with the receiver's reordering on (interleaved)",
    )
    p.add_argument("--rto-min-ms", type=int, default=None, help="TCP's minimum RTO (route)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ip_bench.json")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    runs = []
    for rep in range(args.repeat):
        t = tunnel_run(args, rep)
        log.info(
            "rep %d tunnel: TCP up %.0f B/s, down %.0f B/s, UDP RTT median %.1f ms",
            rep,
            t["tcp_up"]["goodput_Bps"],
            t["tcp_down"]["goodput_Bps"],
            1e3 * statistics.median(t["udp_rtt"]["rtt_s"] or [float("nan")]),
        )
        if args.reorder_too:
            t["reorder"] = u = tunnel_run(args, rep, reorder=True)
            log.info(
                "rep %d tunnel with the receiver's reordering: TCP up %.0f B/s, down %.0f B/s",
                rep,
                u["tcp_up"]["goodput_Bps"],
                u["tcp_down"]["goodput_Bps"],
            )
        m = link_api_run(args, rep)
        log.info(
            "rep %d link API: up %.0f B/s, down %.0f B/s, RTT median %.1f ms",
            rep,
            m["msg_up"]["goodput_Bps"],
            m["msg_down"]["goodput_Bps"],
            1e3 * statistics.median(m["msg_rtt"]["rtt_s"] or [float("nan")]),
        )
        runs.append({"repeat": rep, "tunnel": t, "link_api": m})
    summary = {
        "tcp_up_Bps": _summary([r["tunnel"]["tcp_up"]["goodput_Bps"] for r in runs]),
        "tcp_down_Bps": _summary([r["tunnel"]["tcp_down"]["goodput_Bps"] for r in runs]),
        "msg_up_Bps": _summary([r["link_api"]["msg_up"]["goodput_Bps"] for r in runs]),
        "msg_down_Bps": _summary([r["link_api"]["msg_down"]["goodput_Bps"] for r in runs]),
        "udp_rtt_s": _summary([x for r in runs for x in r["tunnel"]["udp_rtt"]["rtt_s"]]),
        "msg_rtt_s": _summary([x for r in runs for x in r["link_api"]["msg_rtt"]["rtt_s"]]),
        "tcp_up_reorder_Bps": _summary(
            [
                r["tunnel"]["reorder"]["tcp_up"]["goodput_Bps"]
                for r in runs
                if "reorder" in r["tunnel"]
            ]
        ),
        "tcp_down_reorder_Bps": _summary(
            [
                r["tunnel"]["reorder"]["tcp_down"]["goodput_Bps"]
                for r in runs
                if "reorder" in r["tunnel"]
            ]
        ),
        "tcp_up_retrans_segs": [r["tunnel"]["tcp_up"]["tcp"].get("TcpRetransSegs") for r in runs],
        "tcp_down_retrans_segs": [
            r["tunnel"]["tcp_down"]["tcp"].get("TcpRetransSegs") for r in runs
        ],
    }
    for k in ("up", "down"):
        ratios = [
            r["tunnel"][f"tcp_{k}"]["goodput_Bps"] / r["link_api"][f"msg_{k}"]["goodput_Bps"]
            for r in runs
        ]
        summary[f"tcp_vs_msg_{k}"] = _summary(ratios)
    tb = LocalIpTestbed(1, args.kind)
    report = {
        "setup": {
            "kind": args.kind,
            "bytes": args.bytes,
            "repeat": args.repeat,
            "channel": tb.channel if args.kind != "ofdm-shared" else tb.medium,
            "mac": tb.mac,
            "loss_override": args.loss,
            "idle_poll_override": args.idle_poll,
            "tcp_rto_min_ms": args.rto_min_ms,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "runs": runs,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(args.out.read_text()) if args.out.is_file() else {}
    key = args.kind + ("" if args.loss is None else f"-loss{args.loss}")
    key += "" if args.idle_poll is None else f"-poll{args.idle_poll}"
    key += "" if args.rto_min_ms is None else f"-rtomin{args.rto_min_ms}"
    prev[key] = report
    args.out.write_text(json.dumps(prev, indent=2))
    log.info("summary %s", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
