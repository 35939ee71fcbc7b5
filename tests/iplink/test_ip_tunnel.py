"""IP over the link: TUN interfaces in their own network namespaces, bridged by keyed links.

Two nodes (0 and 1) on an in-process medium (the ``memory`` kind's MemoryChannel), each with
a TUN interface in a namespace of its own: UDP and TCP pass both ways bit-exact; frames from a
node without a key -- unicast under its own id, forged under a keyed peer's id, link-level
broadcast -- never reach an interface; and without root one line says what is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scaleflu.iplink import IpLinkError, check_root
from scaleflu.iplink.bridge import (
    TUNNEL_ARQ,
    AddressPlan,
    IpBridge,
    pack_batch,
    secure_tunnel_link,
    tunnel_mtu,
)
from scaleflu.iplink.netns import (
    ROOT_MESSAGE,
    configure_interface,
    create_namespace,
    delete_namespace,
    in_namespace,
    move_to_namespace,
)
from scaleflu.iplink.tun import TunDevice
from scaleflu.link.frame import BROADCAST, encode_frame
from scaleflu.link.memory import MemoryChannel

ROOT = Path(__file__).resolve().parents[2]
KEY = bytes(range(32))


def _root_or_skip() -> None:
    try:
        check_root()
    except IpLinkError as exc:
        pytest.skip(str(exc))


@dataclass
class Pair:
    channel: MemoryChannel
    ns: list[str]
    links: list
    bridges: list[IpBridge]
    plan: AddressPlan


@pytest.fixture
def pair() -> Iterator[Pair]:
    _root_or_skip()
    tag = uuid.uuid4().hex[:6]
    plan = AddressPlan()
    ch = MemoryChannel(seed=1)
    ns, links, tuns, bridges = [], [], [], []
    try:
        for n in (0, 1):
            name = f"sflt-{tag}-{n}"
            create_namespace(name)
            ns.append(name)
            link = ch.attach(n, **TUNNEL_ARQ)
            secure_tunnel_link(link, {1 - n: KEY})
            links.append(link)
            tun = TunDevice(f"sft{tag}{n}")
            tuns.append(tun)
            move_to_namespace(tun.name, name)
            configure_interface(tun.name, plan.cidr(n), tunnel_mtu(), name)
            bridges.append(IpBridge(link, tun, plan).start())
        yield Pair(ch, ns, links, bridges, plan)
    finally:
        for b in bridges:
            b.close()
        for link in links:
            link.close()
        for tun in tuns:
            tun.close()
        ch.close()
        for name in ns:
            delete_namespace(name)


def _py(ns: str, code: str, timeout: float = 60.0, wait: bool = True):  # noqa: ANN202
    """Run Python ``code`` inside namespace ``ns`` (the repository's sources on the path)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    argv = in_namespace(ns, [sys.executable, "-c", textwrap.dedent(code)])
    if not wait:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


LISTEN = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("{addr}", {port}))
print("ready", flush=True)
s.settimeout(0.2)
got, end = [], time.time() + {secs}
while time.time() < end:
    try:
        data, src = s.recvfrom(65535)
        got.append(data.hex())
    except socket.timeout:
        pass
print(",".join(got))
"""


def test_udp_and_tcp_pass_both_ways_bit_exact(pair: Pair) -> None:
    a1 = pair.plan.address(1)
    echo = _py(
        pair.ns[1],
        f"""
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("{a1}", 5000))
        print("ready", flush=True)
        for _ in range(6):
            data, src = s.recvfrom(65535)
            s.sendto(data[::-1], src)
        t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        t.bind(("{a1}", 5001)); t.listen(1)
        print("tcp ready", flush=True)
        c, _ = t.accept()
        import hashlib
        h, n = hashlib.sha256(), 0
        while True:
            b = c.recv(65536)
            if not b:
                break
            h.update(b); n += len(b)
        c.sendall(f"{{n}} {{h.hexdigest()}}".encode()); c.close()
        """,
        wait=False,
    )
    assert echo.stdout.readline().strip() == "ready"
    out = _py(
        pair.ns[0],
        f"""
        import socket, os, hashlib, time
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(10)
        for size in (1, 64, 500, 1000, 1400, 1430):
            data = os.urandom(size)
            s.sendto(data, ("{a1}", 5000))
            back, src = s.recvfrom(65535)
            assert back == data[::-1] and src[0] == "{a1}", (size, len(back))
        for _ in range(100):
            try:
                t = socket.create_connection(("{a1}", 5001), timeout=10); break
            except ConnectionRefusedError:
                time.sleep(0.1)
        blob = os.urandom(200_000)
        t.sendall(blob); t.shutdown(socket.SHUT_WR)
        print(len(blob), hashlib.sha256(blob).hexdigest(), t.recv(200).decode())
        """,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    n, digest, n_back, digest_back = out.stdout.split()
    assert (n, digest) == (n_back, digest_back)  # 200 kB of TCP through the tunnel, intact
    echo.wait(timeout=30)
    assert pair.bridges[0].stats.to_link > 6 and pair.bridges[1].stats.to_link > 6
    assert pair.bridges[0].stats.to_tun > 6 and pair.bridges[1].stats.to_tun > 6


def _udp_packet(src: str, dst: str, port: int, payload: bytes) -> bytes:
    """An IPv4/UDP packet (checksums right: the kernel would accept it)."""
    import ipaddress
    import struct

    def csum(data: bytes) -> int:
        if len(data) % 2:
            data += b"\0"
        s = sum(struct.unpack(f"!{len(data) // 2}H", data))
        while s >> 16:
            s = (s & 0xFFFF) + (s >> 16)
        return ~s & 0xFFFF

    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    udp_len = 8 + len(payload)
    pseudo = s + d + struct.pack("!BBH", 0, 17, udp_len)
    udp = struct.pack("!HHHH", 40000, port, udp_len, 0) + payload
    udp = udp[:6] + struct.pack("!H", csum(pseudo + udp) or 0xFFFF) + udp[8:]
    head = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 1, 0, 64, 17, 0, s, d)
    head = head[:10] + struct.pack("!H", csum(head)) + head[12:]
    return head + udp


def test_unauthenticated_frames_never_reach_the_interface(pair: Pair) -> None:
    a0, a1 = str(pair.plan.address(0)), str(pair.plan.address(1))
    listener = _py(pair.ns[0], LISTEN.format(addr=a0, port=6000, secs=4), wait=False)
    assert listener.stdout.readline().strip() == "ready"
    before = pair.bridges[0].stats.to_tun
    # a keyless node on the same channel: its own id, a keyed peer's id, and broadcast
    attacker = pair.channel.attach(2)
    # well-formed tunnel messages: only the link's authentication keeps them out
    forged_src2 = pack_batch([_udp_packet("10.77.0.3", a0, 6000, b"keyless unicast")])
    attacker.send_async(0, forged_src2, timeout=2.0)
    as_peer = pack_batch([_udp_packet(a1, a0, 6000, b"forged as node 1")])
    raw = encode_frame(0, 1, 0, 77, 0, 1, as_peer)  # DATA from "node 1" to 0, no link tag
    pair.channel.transmit(2, raw)
    for src in (1, 2):
        bcast = encode_frame(
            0, src, BROADCAST, 78 + src, 0, 1, as_peer if src == 1 else forged_src2
        )
        pair.channel.transmit(2, bcast)
    time.sleep(1.5)
    # a keyed node's packet still gets through (the listener works)
    sent = _py(
        pair.ns[1],
        f"""
        import socket
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"keyed", ("{a0}", 6000))
        """,
    )
    assert sent.returncode == 0, sent.stderr
    out, _ = listener.communicate(timeout=30)
    got = [bytes.fromhex(h) for h in out.strip().splitlines()[-1].split(",") if h]
    assert got == [b"keyed"]
    assert pair.bridges[0].stats.to_tun == before + 1
    stats = pair.links[0].stats()["arq"]
    assert stats["unauthenticated"] >= 1  # the keyless node's unicast
    assert stats["auth_failures"] >= 1  # the frame claiming to be node 1's
    assert pair.links[0].broadcast_refused() == 2
    attacker.close()


def test_without_root_one_line_says_so() -> None:
    """As an unprivileged user (setpriv to nobody), opening a TUN fails with one clear line."""
    if os.geteuid() != 0:  # already unprivileged: the check itself
        with pytest.raises(IpLinkError, match="needs root"):
            check_root()
        return
    code = (
        "from scaleflu.iplink import check_root\n"
        "from scaleflu.iplink.tun import TunDevice\n"
        "for f in (check_root, lambda: TunDevice('sflnoroot')):\n"
        "    try:\n        f()\n    except Exception as e:\n        print(type(e).__name__, e)\n"
    )
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    out = subprocess.run(
        [*argv, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python"), "HOME": "/tmp"},
        cwd="/",
    )
    lines = out.stdout.strip().splitlines()
    assert lines == [f"IpLinkPermissionError {ROOT_MESSAGE}"] * 2, out.stdout + out.stderr


def test_commands_without_root_are_one_line(tmp_path: Path) -> None:
    """``scaleflu iplink testbed`` / ``node`` as an unprivileged user: exit status 2 and one
    ERROR line saying root is needed (before any file is read), no traceback."""
    prefix = []
    if os.geteuid() == 0:
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    for cmd in (
        ["testbed", "--robots", "1"],
        ["node", "--node", "1", "--keys", str(tmp_path / "link-keys-1.json")],
    ):
        out = subprocess.run(
            [*prefix, sys.executable, "-m", "scaleflu", "iplink", *cmd],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(ROOT / "python"), "HOME": "/tmp"},
            cwd="/",
        )
        errors = [line for line in out.stderr.splitlines() if "ERROR" in line]
        assert out.returncode == 2, (cmd, out.stdout, out.stderr)
        assert len(errors) == 1 and ROOT_MESSAGE in errors[0], out.stderr
        assert "Traceback" not in out.stderr


class _Device:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def read(self, timeout: float | None = None) -> bytes | None:
        return None

    def write(self, packet: bytes) -> int:
        self.written.append(packet)
        return len(packet)


class _Link:
    node_id = 0


def test_messages_are_put_back_in_order() -> None:
    """No root: the receiver's reordering (a message that overtook a repaired one waits), the
    sender's floor (a message it gave up on is not waited for), the timeout, late arrivals."""
    dev = _Device()
    bridge = IpBridge(_Link(), dev, AddressPlan(), reorder=True)  # type: ignore[arg-type]
    pk = [_udp_packet("10.77.0.2", "10.77.0.1", 9, bytes([i])) for i in range(8)]
    order = lambda: [p[-1] for p in dev.written]  # noqa: E731
    assert bridge.accept_message(1, pack_batch([pk[0]], 0, 0), now=0.0) == 1
    assert bridge.accept_message(1, pack_batch([pk[2], pk[3]], 2, 1), now=0.1) == 0  # held
    assert bridge.accept_message(1, pack_batch([pk[1]], 1, 1), now=0.2) == 3
    assert order() == [0, 1, 2, 3] and bridge.stats.reordered == 1
    # message 4 ended undelivered at the sender: message 5 carries floor 5, nothing waits
    assert bridge.accept_message(1, pack_batch([pk[5]], 5, 5), now=0.3) == 1
    # message 7 overtakes 6, which never comes: released after the timeout
    assert bridge.accept_message(1, pack_batch([pk[7]], 7, 6), now=0.4) == 0
    bridge._expire(0.4 + bridge.reorder_timeout + 0.1)
    assert order() == [0, 1, 2, 3, 5, 7] and bridge.stats.gaps_skipped == 1
    assert bridge.accept_message(1, pack_batch([pk[6]], 6, 6), now=20.0) == 1  # late: delivered
    assert bridge.stats.late == 1
    # a message from node 2 claiming node 1's address, a malformed message: dropped
    assert bridge.accept_message(2, pack_batch([pk[0]], 0, 0)) == 0
    assert bridge.accept_message(1, b"\x02garbage") == 0
    assert bridge.stats.dropped == {"rx_spoofed_source": 1, "rx_bad_message": 1}


def test_local_testbed_carries_udp_over_the_mac() -> None:
    """The IP testbed: node processes, key files, namespaces, the frame hub on one frequency
    with the server-scheduled MAC; a robot's datagram reaches the server and comes back."""
    _root_or_skip()
    from scaleflu.iplink.testbed import LocalIpTestbed

    with LocalIpTestbed(robots=1, kind="frames-shared", channel={"loss": 0.0}) as tb:
        server = tb.address(0)
        keys = sorted((tb.workdir / "keys").iterdir())
        assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in keys)
        echo = tb.popen(
            0,
            [
                sys.executable,
                "-c",
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                f"s.bind(('{server}', 7000))\nprint('ready', flush=True)\n"
                "d, a = s.recvfrom(65535)\ns.sendto(d[::-1], a)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert echo.stdout.readline().strip() == "ready"
        out = tb.run(
            1,
            [
                sys.executable,
                "-c",
                "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                f"s.settimeout(20)\ns.sendto(b'over the radio', ('{server}', 7000))\n"
                "print(s.recvfrom(100)[0].decode())\n",
            ],
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "oidar eht revo"
        # the robot sees no other interface than the tunnel and loopback
        links = tb.run(1, ["ip", "-o", "link"]).stdout
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
        assert names == sorted(["lo", f"sfl{tb.tag}1"])
