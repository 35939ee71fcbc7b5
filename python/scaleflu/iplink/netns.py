"""Network namespaces and interface set-up through ``ip`` (iproute2), with one-line errors."""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence

log = logging.getLogger(__name__)

ROOT_MESSAGE = (
    "IP over the link needs root (CAP_NET_ADMIN) to create TUN interfaces and network "
    "namespaces; run it as root (sudo)"
)


class IpLinkError(RuntimeError):
    """Setting up IP over the link failed (the ``ip`` command's own message included)."""


class IpLinkPermissionError(IpLinkError, PermissionError):
    """Not root: TUN interfaces and namespaces cannot be created."""


def check_root() -> None:
    """Raise :class:`IpLinkPermissionError` (one line) unless this process can set up IP."""
    if os.geteuid() != 0:
        raise IpLinkPermissionError(ROOT_MESSAGE)
    if shutil.which("ip") is None:
        raise IpLinkError("the 'ip' command (iproute2) is not installed: apt install iproute2")
    if not os.path.exists("/dev/net/tun"):
        raise IpLinkError("/dev/net/tun does not exist (the tun kernel module: modprobe tun)")


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; IpLinkError with its message when it fails."""
    cmd = ["ip", *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise IpLinkError(f"{' '.join(cmd)}: {msg[-1] if msg else f'exit {out.returncode}'}")
    return out.stdout


def namespaces() -> list[str]:
    """Names of the existing network namespaces."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def create_namespace(name: str) -> None:
    """A new network namespace ``name`` with its loopback up (IpLinkError if it exists)."""
    if name in namespaces():
        raise IpLinkError(f"network namespace {name} exists already (ip netns del {name})")
    ip("netns", "add", name)
    ip("-n", name, "link", "set", "lo", "up")


def delete_namespace(name: str) -> None:
    """Delete namespace ``name`` (nothing when it does not exist)."""
    if name in namespaces():
        ip("netns", "del", name, check=False)


def move_to_namespace(ifname: str, ns: str) -> None:
    """Move interface ``ifname`` into namespace ``ns`` (a TUN keeps its open file)."""
    ip("link", "set", "dev", ifname, "netns", ns)


def configure_interface(
    ifname: str, address: str, mtu: int, ns: str | None = None, rto_min_ms: int | None = None
) -> None:
    """Give ``ifname`` (in ``ns``) its address (``a.b.c.d/len``) and MTU, bring it up; IPv6
    off on it (the tunnel carries IPv4). ``rto_min_ms``: TCP's minimum retransmission timeout
    on the tunnel's route (Linux's default is 200 ms; the link repairs a lost frame itself,
    which on a scheduled medium takes longer, and TCP timing out first sends it again)."""
    pre = ["-n", ns] if ns else []
    sysctl = ["sysctl", "-qw", f"net.ipv6.conf.{ifname}.disable_ipv6=1"]
    cmd = (["ip", "netns", "exec", ns] if ns else []) + sysctl
    subprocess.run(cmd, capture_output=True)  # best effort: the kernel may lack IPv6
    ip(*pre, "link", "set", "dev", ifname, "mtu", str(int(mtu)))
    ip(*pre, "addr", "add", address, "dev", ifname)
    ip(*pre, "link", "set", "dev", ifname, "up")
    if rto_min_ms:
        net = ipaddress.IPv4Interface(address).network
        ip(
            *pre,
            "route",
            "replace",
            str(net),
            "dev",
            ifname,
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            address.split("/")[0],
            "rto_min",
            f"{int(rto_min_ms)}ms",
        )


def in_namespace(ns: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside namespace ``ns`` (``ip netns exec``); as is for None."""
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
