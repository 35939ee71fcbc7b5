"""The bridge between a node's TUN interface and its Link, and the tunnel's link.

IP packets go to the node whose address is their destination (:class:`AddressPlan`: node n is
host n + 1 of the tunnel's subnet) as link messages: one packet when the link is idle, the
packets that queued meanwhile when it is busy (:class:`IpBridge`, :func:`pack_batch`). The
link delivers a message whole or not at all: its ARQ repairs frame losses underneath IP, so
TCP sees delay, not loss, up to the send ``deadline``; a message still undelivered then is
dropped, as a router drops packets, and TCP's own retransmission takes over.

What the bridge accepts from the link, before anything reaches the interface: an IPv4 packet
whose header is consistent (version, header length, total length), whose destination is this
node's address and whose source is the *sending node's* address (a node with a key cannot
forge another's address). Everything else is counted and dropped.

:func:`open_tunnel_link` opens the link a tunnel runs on: any link kind
(:func:`scaleflu.linkkinds.open_link`) with every peer's key set (HMAC-SHA256 tags on every
frame, docs/link.md 4.2), ``require_auth`` (frames from a node without a key are dropped) and
link-level broadcast DATA refused (broadcast frames carry no tag: the tunnel never uses them;
the MAC's own control frames still pass). So a node without a key reaches nobody's interface.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scaleflu.link.api import Link
from scaleflu.link.arq import SendStatus
from scaleflu.link.frame import (
    BROADCAST,
    DEFAULT_MTU,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    RESERVED_MSG_ID,
    max_payload,
)
from scaleflu.linkkinds import open_link

log = logging.getLogger(__name__)

DEFAULT_SUBNET = "10.77.0.0/24"
TAG_SIZE = 16  # the link tag a keyed frame carries (docs/link.md 4.2)
# the tunnel's ARQ over the kind's defaults: a packet is worth little after a few seconds
# (TCP retransmits it), one COMPLETE ACK repeat instead of three per packet
TUNNEL_ARQ = {"require_auth": True, "deadline": 5.0, "complete_ack_repeats": 1}


def tunnel_mtu(link_mtu: int = DEFAULT_MTU, keyed: bool = True) -> int:
    """The interface MTU that puts a lone IP packet in one link frame (1447 B at link MTU
    1500 with keys: 1474 B of frame payload, less the 16-byte tag and the 11 bytes of
    :func:`pack_batch`)."""
    return max_payload(link_mtu) - (TAG_SIZE if keyed else 0) - _HEAD.size - _LEN.size


@dataclass(frozen=True)
class AddressPlan:
    """Node n <-> host n + 1 of ``subnet`` (node 0, the edge server: 10.77.0.1)."""

    subnet: str = DEFAULT_SUBNET

    @property
    def network(self) -> ipaddress.IPv4Network:
        """The subnet."""
        return ipaddress.IPv4Network(self.subnet)

    def address(self, node: int) -> ipaddress.IPv4Address:
        """Node ``node``'s address."""
        net = self.network
        if not 0 <= node < min(net.num_addresses - 2, BROADCAST):
            raise ValueError(f"node {node} has no address in {net}")
        return net.network_address + node + 1

    def cidr(self, node: int) -> str:
        """``a.b.c.d/len`` of node ``node`` (for ``ip addr add``)."""
        return f"{self.address(node)}/{self.network.prefixlen}"

    def node_of(self, addr: bytes) -> int | None:
        """The node a 4-byte IPv4 address names (None: outside the plan)."""
        a = ipaddress.IPv4Address(addr)
        net = self.network
        if a not in net or a in (net.network_address, net.broadcast_address):
            return None
        n = int(a) - int(net.network_address) - 1
        return n if 0 <= n < BROADCAST else None


@dataclass
class BridgeStats:
    """Packets and bytes each way, and why packets were dropped."""

    messages: int = 0  # link messages sent (each carries one or more packets)
    to_link: int = 0
    to_link_bytes: int = 0
    to_tun: int = 0
    to_tun_bytes: int = 0
    delivered: int = 0  # messages the link confirmed
    undelivered: int = 0  # messages that ended FAILED or UNCONFIRMED (deadline)
    reordered: int = 0  # messages that arrived before an earlier one (held back)
    late: int = 0  # messages that arrived after their gap was skipped
    gaps_skipped: int = 0  # waits given up after reorder_timeout
    dropped: dict[str, int] = field(default_factory=dict)

    def drop(self, why: str) -> None:
        """Count a dropped packet."""
        self.dropped[why] = self.dropped.get(why, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready snapshot."""
        return {
            "messages": self.messages,
            "to_link": self.to_link,
            "to_link_bytes": self.to_link_bytes,
            "to_tun": self.to_tun,
            "to_tun_bytes": self.to_tun_bytes,
            "delivered": self.delivered,
            "undelivered": self.undelivered,
            "reordered": self.reordered,
            "late": self.late,
            "gaps_skipped": self.gaps_skipped,
            "dropped": dict(self.dropped),
        }


_IPV4 = struct.Struct("!BBHHHBBH4s4s")


def ipv4_header(packet: bytes) -> tuple[bytes, bytes] | None:
    """(source, destination) of a well-formed IPv4 packet (None: not one)."""
    if len(packet) < _IPV4.size:
        return None
    vihl, _tos, total, _id, _frag, _ttl, _proto, _csum, src, dst = _IPV4.unpack_from(packet)
    if vihl >> 4 != 4 or (vihl & 0xF) < 5 or total != len(packet) or (vihl & 0xF) * 4 > total:
        return None
    return src, dst


class PacketDevice:
    """What the bridge needs of an interface (a :class:`~scaleflu.iplink.tun.TunDevice`)."""

    def read(self, timeout: float | None = None) -> bytes | None:  # pragma: no cover
        """The next packet routed to the interface (None: none within ``timeout``)."""
        raise NotImplementedError

    def write(self, packet: bytes) -> int:  # pragma: no cover
        """Hand a packet to the kernel."""
        raise NotImplementedError


class IpBridge:
    """Carry IP packets between ``device`` and ``link`` (node ``link.node_id``).

    Packets routed to a peer wait in that peer's queue; while fewer than ``max_inflight``
    messages to it are on the link, the queue goes out as one message of at most
    ``max_batch`` bytes (:func:`pack_batch`): an idle link carries each packet at once, a busy
    one aggregates what queued meanwhile (fewer messages, fewer ACKs and MAC grants per byte,
    as 802.11n aggregates frames). A queue holding ``max_queue`` bytes drops new packets (a
    router's tail drop: it bounds memory and the delay a burst builds up). ``deadline``:
    seconds a message may take on the link. ``reorder``: put each sender's messages back in
    its order (:meth:`accept_message`); off (the default), a message is written the moment it
    arrives: Linux's TCP tolerates the reordering (its fast retransmit repairs a hole sooner
    than the link's retransmission timer on a scheduled medium), while holding later packets
    behind a message under repair stalled it (docs/ip-over-radio.md: 0.3-0.6 x the goodput).
    """

    def __init__(
        self,
        link: Link,
        device: PacketDevice,
        plan: AddressPlan | None = None,
        max_inflight: int = 4,
        max_batch: int = 32768,
        max_queue: int = 262144,
        deadline: float = TUNNEL_ARQ["deadline"],
        reorder: bool = False,
    ) -> None:
        self.link = link
        self.device = device
        self.plan = plan or AddressPlan()
        self.node = int(link.node_id)
        self.address = self.plan.address(self.node).packed
        self.max_inflight = int(max_inflight)
        self.max_batch = int(max_batch)
        self.max_queue = int(max_queue)
        self.deadline = float(deadline)
        self.stats = BridgeStats()
        self._inflight: dict[int, list[tuple[int, Any]]] = {}  # peer -> [(seq, handle)]
        self._next_seq: dict[int, int] = {}  # peer -> sequence number of the next message
        self._rx: dict[int, _Reorder] = {}  # src -> its messages put back in order
        self.reorder = bool(reorder)
        self.reorder_timeout = 2.0 * float(deadline)
        self._queues: dict[int, deque[bytes]] = {}
        self._queued_bytes: dict[int, int] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._uplink, name=f"ip-tx-{self.node}", daemon=True),
            threading.Thread(target=self._downlink, name=f"ip-rx-{self.node}", daemon=True),
        ]

    def start(self) -> IpBridge:
        """Start the two pumps (interface -> link, link -> interface)."""
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        """Stop the pumps (the link and the device stay open: their owner closes them)."""
        self._stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=2.0)

    # -- interface -> link -----------------------------------------------------------------

    def _settle(self, peer: int) -> list[tuple[int, Any]]:
        """The peer's messages still in flight (finished ones counted and forgotten)."""
        keep = []
        for seq, h in self._inflight.get(peer, []):
            if h.status is SendStatus.PENDING:
                keep.append((seq, h))
            elif h.status is SendStatus.DELIVERED:
                self.stats.delivered += 1
            else:
                self.stats.undelivered += 1
        self._inflight[peer] = keep
        return keep

    def queue_packet(self, packet: bytes) -> bool:
        """Route one packet from the interface to its peer's queue (False: dropped, counted)."""
        head = ipv4_header(packet)
        if head is None:
            self.stats.drop("not_ipv4" if packet[:1] and packet[0] >> 4 != 4 else "malformed")
            return False
        peer = self.plan.node_of(head[1])
        if peer is None:
            self.stats.drop("no_route")
            return False
        if peer == self.node:
            self.stats.drop("to_self")
            return False
        if self._queued_bytes.get(peer, 0) + len(packet) > self.max_queue:
            self.stats.drop("queue_full")
            return False
        self._queues.setdefault(peer, deque()).append(packet)
        self._queued_bytes[peer] = self._queued_bytes.get(peer, 0) + len(packet)
        return True

    def flush(self) -> bool:
        """Send what the queues hold while the peers have room in flight; True if packets
        are left waiting."""
        waiting = False
        for peer, q in self._queues.items():
            while q and len(self._settle(peer)) < self.max_inflight:
                batch: list[bytes] = []
                size = 1
                while q and (not batch or size + 2 + len(q[0]) <= self.max_batch):
                    pkt = q.popleft()
                    batch.append(pkt)
                    size += 2 + len(pkt)
                    self._queued_bytes[peer] -= len(pkt)
                seq = self._next_seq.get(peer, 0)
                self._next_seq[peer] = (seq + 1) & 0xFFFFFFFF
                # the oldest message still in flight: below it, the receiver waits for nothing
                floor = self._inflight[peer][0][0] if self._inflight[peer] else seq
                try:
                    handle = self.link.send_async(
                        peer, pack_batch(batch, seq, floor), timeout=self.deadline
                    )
                except Exception as exc:  # a closed link, a peer the link refuses
                    for _ in batch:
                        self.stats.drop("link_error")
                    log.debug("node %d: send to %d failed: %s", self.node, peer, exc)
                    continue
                self._inflight[peer].append((seq, handle))
                self.stats.messages += 1
                self.stats.to_link += len(batch)
                self.stats.to_link_bytes += sum(len(p) for p in batch)
            waiting = waiting or bool(q)
        return waiting

    def _uplink(self) -> None:
        waiting = False
        while not self._stop.is_set():
            # with packets waiting for room in flight, look again soon (sends finish without
            # telling this thread); else sleep in the read
            packet = self.device.read(0.002 if waiting else 0.2)
            while packet:
                self.queue_packet(packet)
                packet = self.device.read(0.0)  # everything already there joins the batch
            waiting = self.flush()

    # -- link -> interface -----------------------------------------------------------------

    def accept(self, src: int, packet: bytes) -> bool:
        """Write a packet the link delivered from node ``src`` to the interface if it is an
        IPv4 packet from ``src``'s address to this node's (False: dropped, counted)."""
        head = ipv4_header(packet)
        if head is None:
            self.stats.drop("rx_malformed")
            return False
        if head[1] != self.address:
            self.stats.drop("rx_not_for_us")
            return False
        if self.plan.node_of(head[0]) != src:
            self.stats.drop("rx_spoofed_source")
            return False
        self.device.write(packet)
        self.stats.to_tun += 1
        self.stats.to_tun_bytes += len(packet)
        return True

    def accept_message(self, src: int, message: bytes, now: float | None = None) -> int:
        """The packets of a tunnel message from ``src`` (:func:`unpack_batch`); with
        ``reorder``, in the order ``src`` sent its messages: a message that overtook an earlier
        one waits until that one arrives, ``src`` says it ended (its floor moved past it) or
        ``reorder_timeout`` passed. Returns how many packets reached the interface."""
        got = unpack_batch(message)
        if got is None:
            self.stats.drop("rx_bad_message")
            return 0
        seq, floor, packets = got
        if not self.reorder:
            return sum(self.accept(src, p) for p in packets)
        now = time.monotonic() if now is None else now
        ro = self._rx.setdefault(src, _Reorder())
        written = 0
        for batch in ro.push(seq, floor, packets, now, self):
            written += sum(self.accept(src, p) for p in batch)
        return written

    def _expire(self, now: float) -> None:
        for src, ro in self._rx.items():
            for batch in ro.expire(now, self.reorder_timeout, self):
                for p in batch:
                    self.accept(src, p)

    def _downlink(self) -> None:
        while not self._stop.is_set():
            try:
                got = self.link.recv(0.2)
            except Exception:  # the link closed
                return
            try:
                if got is not None:
                    self.accept_message(*got)
                self._expire(time.monotonic())
            except OSError as exc:  # the interface went away
                self.stats.drop("tun_error")
                log.debug("node %d: interface write failed: %s", self.node, exc)


def _after(a: int, b: int) -> bool:
    """Whether sequence number ``a`` comes after ``b`` (32-bit, wrapping)."""
    return 0 < ((a - b) & 0xFFFFFFFF) < 0x80000000


class _Reorder:
    """One sender's messages put back in its order (see :meth:`IpBridge.accept_message`)."""

    MAX_HELD = 64

    def __init__(self) -> None:
        self.expected: int | None = None
        self.held: dict[int, list[bytes]] = {}
        self.since = 0.0  # when the oldest held message started waiting

    def _release(self) -> list[list[bytes]]:
        out = []
        while self.expected in self.held:
            out.append(self.held.pop(self.expected))
            self.expected = (self.expected + 1) & 0xFFFFFFFF
        return out

    def push(
        self, seq: int, floor: int, packets: list[bytes], now: float, bridge: IpBridge
    ) -> list[list[bytes]]:
        if self.expected is None or (not self.held and _after(floor, self.expected)):
            self.expected = floor  # first message, or the sender gave up on the gap
        if seq != self.expected and not _after(seq, self.expected):
            bridge.stats.late += 1  # a gap already skipped: deliver it anyway
            return [packets]
        if not self.held:
            self.since = now
        self.held[seq] = packets
        if self.expected not in self.held:
            bridge.stats.reordered += 1
        if _after(floor, self.expected):  # the sender no longer has what we wait for
            self.expected = floor
        out = self._release()
        if len(self.held) > self.MAX_HELD:
            out += self._skip()
        if out:
            self.since = now
        return out

    def _skip(self) -> list[list[bytes]]:
        self.expected = min(self.held, key=lambda q: (q - self.expected) & 0xFFFFFFFF)
        return self._release()

    def expire(self, now: float, timeout: float, bridge: IpBridge) -> list[list[bytes]]:
        if not self.held or now - self.since < timeout:
            return []
        bridge.stats.gaps_skipped += 1
        out = self._skip()
        self.since = now
        return out


BATCH_VERSION = 2
_HEAD = struct.Struct("!BII")
_LEN = struct.Struct("!H")


def pack_batch(packets: list[bytes], seq: int = 0, floor: int = 0) -> bytes:
    """A tunnel message: ``u8 version 2, u32 seq, u32 floor`` (the sender's message number
    to this peer, and its oldest message still in flight), then each packet as ``u16
    length`` + bytes."""
    head = _HEAD.pack(BATCH_VERSION, seq & 0xFFFFFFFF, floor & 0xFFFFFFFF)
    return head + b"".join(_LEN.pack(len(p)) + p for p in packets)


def unpack_batch(message: bytes) -> tuple[int, int, list[bytes]] | None:
    """(seq, floor, packets) of a tunnel message (None: not a well-formed one)."""
    if len(message) <= _HEAD.size or message[0] != BATCH_VERSION:
        return None
    _v, seq, floor = _HEAD.unpack_from(message)
    out, pos = [], _HEAD.size
    while pos < len(message):
        if pos + 2 > len(message):
            return None
        (n,) = _LEN.unpack_from(message, pos)
        pos += 2
        if n == 0 or pos + n > len(message):
            return None
        out.append(bytes(message[pos : pos + n]))
        pos += n
    return seq, floor, out


# -- the tunnel's link ----------------------------------------------------------------------------


def _arq_link(link: Link) -> Any:
    """The ArqLink under ``link`` (GNU Radio back-ends keep it in their link_arq block)."""
    inner = getattr(getattr(link, "arq", None), "link", None)
    return inner if inner is not None else link


def refuse_broadcast(link: Link) -> Callable[[], int]:
    """Drop link-level broadcast DATA frames before ``link``'s ARQ sees them (they carry no
    link tag); the MAC's control frames pass. Returns a counter of the frames dropped."""
    arq = _arq_link(link)
    feed = arq.feed
    dropped = [0]

    def guarded(raw: bytes, snr_db: float | None = None) -> None:
        if len(raw) >= FRAME_HEADER_SIZE:
            _magic, _ver, ftype, _src, dst, msg_id = FRAME_HEADER.unpack_from(raw)[:6]
            if dst == BROADCAST and ftype == 0 and msg_id != RESERVED_MSG_ID:
                dropped[0] += 1
                return
        feed(raw, snr_db)

    arq.feed = guarded
    return lambda: dropped[0]


def open_tunnel_link(
    kind: str,
    node: int,
    keys: Mapping[int, bytes],
    arq: Mapping[str, Any] | None = None,
    **opts: Any,
) -> Link:
    """The link of a tunnel node: ``open_link(kind, node, ...)`` with :data:`TUNNEL_ARQ` (over
    the kind's defaults, under ``arq``), every peer's key in ``keys`` set, broadcast refused.

    ``keys``: peer -> shared key (the server holds one per robot, a robot the server's). A
    tunnel without keys is refused: it would accept packets from anyone on the channel.
    """
    if not keys:
        raise ValueError("a tunnel needs link keys (peer -> key): without them anyone injects")
    link = open_link(kind, node, arq={**TUNNEL_ARQ, **dict(arq or {})}, **opts)
    try:
        secure_tunnel_link(link, keys)
    except BaseException:
        link.close()
        raise
    return link


def secure_tunnel_link(link: Link, keys: Mapping[int, bytes]) -> Link:
    """Set every peer's key on an open ``link`` and refuse broadcast DATA on it (the link must
    have been opened with ``require_auth``: :data:`TUNNEL_ARQ`)."""
    if not keys:
        raise ValueError("a tunnel needs link keys (peer -> key): without them anyone injects")
    for peer, key in keys.items():
        link.set_peer_key(int(peer), bytes(key))
    link.broadcast_refused = refuse_broadcast(link)  # type: ignore[attr-defined]
    return link
