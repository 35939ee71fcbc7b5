"""A Linux TUN interface: IP packets in and out through a file descriptor."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import struct

from scaleflu.iplink.netns import ROOT_MESSAGE, IpLinkError, IpLinkPermissionError

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65535


class TunDevice:
    """A TUN interface ``name`` (IFF_TUN, no packet information header): ``read`` gives one IP
    packet the kernel routed to it, ``write`` hands one IP packet to the kernel.

    The interface exists while the device is open; configure it with
    :func:`scaleflu.iplink.netns.configure_interface` (after moving it into a namespace, if
    any: the open file follows it).
    """

    def __init__(self, name: str) -> None:
        if not 0 < len(name.encode()) < 16:
            raise IpLinkError(f"interface name {name!r} must be 1..15 bytes")
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            raise IpLinkPermissionError(ROOT_MESSAGE) from None
        except FileNotFoundError:
            raise IpLinkError("/dev/net/tun does not exist (modprobe tun)") from None
        try:
            fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EPERM, errno.EACCES):
                raise IpLinkPermissionError(ROOT_MESSAGE) from None
            raise IpLinkError(f"TUNSETIFF {name}: {exc.strerror}") from None
        self.name = name
        self.fd = fd
        self.closed = False

    def fileno(self) -> int:
        """The device's file descriptor."""
        return self.fd

    def read(self, timeout: float | None = None) -> bytes | None:
        """The next packet, or None when none came within ``timeout`` seconds (or closed)."""
        if self.closed:
            return None
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout)
        except (OSError, ValueError):  # closed under us
            return None
        if not ready:
            return None
        try:
            return os.read(self.fd, MAX_PACKET)
        except OSError:
            return None

    def write(self, packet: bytes) -> int:
        """Hand one IP packet to the kernel (as if it arrived on the interface)."""
        return os.write(self.fd, packet)

    def close(self) -> None:
        """Close the device (the interface disappears)."""
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def __enter__(self) -> TunDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
