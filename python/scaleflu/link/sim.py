"""Channel impairment model and a deterministic virtual-time network of ArqEndpoints.

The virtual-time network runs ARQ endpoints as a discrete-event simulation (no threads, no
sleeping): tests and link-time models (bytes and seconds a transfer costs over a lossy link) use
it. ``MemoryChannel`` in ``scaleflu.link.api`` applies the same ChannelModel in real time.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .arq import ArqConfig, ArqEndpoint

logger = logging.getLogger(__name__)


@dataclass
class ChannelModel:
    """Frame impairments of a simulated channel; all probabilities are per frame except ber."""

    loss: float = 0.0  # probability a frame is lost
    ber: float = 0.0  # probability each bit is flipped
    duplicate: float = 0.0  # probability a frame arrives twice
    reorder: float = 0.0  # probability a frame is held back by reorder_delay
    reorder_delay: float = 0.005
    delay: float = 0.001  # propagation delay in seconds
    jitter: float = 0.0  # uniform extra delay 0..jitter (order-preserving, like a real link)
    rate_bytes_per_s: float | None = None  # serialisation rate of the medium; None = infinite

    def __post_init__(self) -> None:
        for name in ("loss", "ber", "duplicate", "reorder"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability, got {value}")
        if self.delay < 0 or self.jitter < 0 or self.reorder_delay < 0:
            raise ValueError("delays must be >= 0")

    def impair(self, raw: bytes, rng: random.Random) -> list[tuple[float, bytes, bool]]:
        """Return the (delay, bytes, held back) copies of one frame that reach the receiver."""
        copies = 2 if rng.random() < self.duplicate else 1
        out = []
        for _ in range(copies):
            if rng.random() < self.loss:
                continue
            data = self._flip(raw, rng) if self.ber > 0 else raw
            d = self.delay + (rng.random() * self.jitter if self.jitter else 0.0)
            held = bool(self.reorder) and rng.random() < self.reorder
            if held:
                d += self.reorder_delay
            out.append((d, data, held))
        return out

    def _flip(self, raw: bytes, rng: random.Random) -> bytes:
        nbits = 8 * len(raw)
        # number of flips ~ Binomial(nbits, ber), drawn by geometric gaps between flipped bits
        buf = None
        pos = -1
        while True:
            u = rng.random()
            gap = 1 if self.ber >= 1.0 else int(_log1m(u) / _log1m(self.ber)) + 1
            pos += gap
            if pos >= nbits:
                break
            if buf is None:
                buf = bytearray(raw)
            buf[pos >> 3] ^= 0x80 >> (pos & 7)
        return raw if buf is None else bytes(buf)


def _log1m(x: float) -> float:
    """log(1 - x), -inf-safe."""
    return math.log1p(-x) if x < 1.0 else -1e300


class SimNetwork:
    """ArqEndpoints on a shared simulated medium, driven in virtual time (deterministic)."""

    def __init__(self, channel: ChannelModel | None = None, seed: int = 0) -> None:
        self.channel = channel or ChannelModel()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.endpoints: dict[int, ArqEndpoint] = {}
        self.inbox: dict[int, list[tuple[int, bytes]]] = {}
        self.frames_sent = 0
        self.bytes_sent = 0
        self._events: list[tuple[float, int, int, bytes]] = []
        self._n = 0
        self._busy_until = 0.0
        self._last_arrival: dict[tuple[int, int], float] = {}
        self._stalled_until: dict[int, float] = {}  # node -> end of its application's stall

    def clock(self) -> float:
        """Virtual time in seconds."""
        return self.now

    def add_endpoint(
        self,
        node_id: int,
        config: ArqConfig | None = None,
        on_message: Callable[[int, bytes], None] | None = None,
        busy_after_message: float = 0.0,
        **overrides: Any,
    ) -> ArqEndpoint:
        """Create an endpoint attached to the medium; delivered messages go to ``inbox[node]``.

        ``busy_after_message``: the node's application holds its CPU this long after each
        delivered message (a server checking an upload): frames reaching the node meanwhile wait
        in order and its timers wait, so its ACKs leave late, after frames they do not show.
        """
        if busy_after_message < 0:
            raise ValueError(f"busy_after_message must be >= 0, got {busy_after_message}")
        self.inbox[node_id] = []
        if on_message is None:

            def on_message(src: int, payload: bytes, _n: int = node_id) -> None:
                self.inbox[_n].append((src, payload))

        if busy_after_message > 0:
            handler = on_message

            def on_message(src: int, payload: bytes, _n: int = node_id) -> None:
                handler(src, payload)
                self._stalled_until[_n] = self.now + busy_after_message

        ep = ArqEndpoint(
            node_id,
            lambda raw, _n=node_id: self._transmit(_n, raw),
            clock=self.clock,
            config=config,
            on_message=on_message,
            msg_id_start=self.rng.getrandbits(32),
            **overrides,
        )
        self.endpoints[node_id] = ep
        return ep

    def _transmit(self, src: int, raw: bytes) -> None:
        self.frames_sent += 1
        self.bytes_sent += len(raw)
        start = self.now
        rate = self.channel.rate_bytes_per_s
        if rate:
            start = max(start, self._busy_until)
            self._busy_until = start + len(raw) / rate
            start = self._busy_until
        for node in self.endpoints:
            if node == src:
                continue
            for delay, data, held in self.channel.impair(raw, self.rng):
                t = start + delay
                if not held:  # jitter never reorders; only the reorder impairment does
                    t = max(t, self._last_arrival.get((src, node), 0.0))
                    self._last_arrival[(src, node)] = t
                self._n += 1
                heapq.heappush(self._events, (t, self._n, node, data))

    def step(self) -> bool:
        """Advance to the next event or timer and process it; False when nothing is left."""
        t_event = self._events[0][0] if self._events else None
        deadlines = [d for d in (self._deadline(n) for n in self.endpoints) if d is not None]
        t_timer = min(deadlines) if deadlines else None
        candidates = [t for t in (t_event, t_timer) if t is not None]
        if not candidates:
            return False
        self.now = max(self.now, min(candidates))
        while self._events and self._events[0][0] <= self.now:
            _, n, node, data = heapq.heappop(self._events)
            until = self._stalled_until.get(node, 0.0)
            if until > self.now:  # the node is busy: the frame waits (order kept by n)
                heapq.heappush(self._events, (until, n, node, data))
                continue
            self.endpoints[node].on_frame(data)
        for node, ep in list(self.endpoints.items()):
            d = self._deadline(node)
            if d is not None and d <= self.now:
                ep.poll()
        return True

    def _deadline(self, node: int) -> float | None:
        """When the node's timers next need it (not before its application's stall ends)."""
        d = self.endpoints[node].next_deadline()
        if d is None:
            return None
        return max(d, self._stalled_until.get(node, 0.0))

    def run_until(self, done: Callable[[], bool], max_time: float = 3600.0) -> bool:
        """Step until ``done()`` or virtual ``max_time``; True if done."""
        while not done():
            if self.now > max_time or not self.step():
                return done()
        return True
