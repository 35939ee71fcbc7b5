"""MemoryChannel: several MemoryLink endpoints in one process through a seeded ChannelModel.

The in-process medium of the ``memory`` link kind and of the tests: every frame a link transmits
reaches every other attached link through the model's impairments (loss, bit flips,
duplication, reordering, delay, an optional serialisation rate), delivered by one thread.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from typing import Any

from .api import ArqLink
from .arq import ArqConfig
from .sim import ChannelModel


class MemoryChannel:
    """Simulated shared medium between MemoryLinks in one process (seeded impairments)."""

    def __init__(self, model: ChannelModel | None = None, seed: int = 0, **model_kw: Any) -> None:
        if model is not None and model_kw:
            raise ValueError("give a ChannelModel or its fields, not both")
        self.model = model or ChannelModel(**model_kw)
        self.rng = random.Random(seed)
        self.frames_in = 0
        self.frames_out = 0
        self._links: dict[int, MemoryLink] = {}
        self._events: list[tuple[float, int, int, bytes]] = []
        self._n = 0
        self._busy_until = 0.0
        self._last_arrival: dict[tuple[int, int], float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="memory-channel", daemon=True)
        self._thread.start()

    def attach(self, node_id: int, config: ArqConfig | None = None, **overrides: Any) -> MemoryLink:
        """Create a MemoryLink for ``node_id`` on this channel."""
        with self._cond:
            if node_id in self._links:
                raise ValueError(f"node {node_id} already attached")
        link = MemoryLink(self, node_id, config=config, **overrides)
        with self._cond:
            self._links[node_id] = link
        return link

    def detach(self, node_id: int) -> None:
        """Remove a node from the medium (frames to it are dropped)."""
        with self._cond:
            self._links.pop(node_id, None)

    def transmit(self, src: int, raw: bytes) -> None:
        """Put one frame on the medium: every other attached node may receive a copy."""
        with self._cond:
            if self._closed:
                return
            self.frames_in += 1
            now = time.monotonic()
            start = now
            rate = self.model.rate_bytes_per_s
            if rate:
                start = max(now, self._busy_until) + len(raw) / rate
                self._busy_until = start
            for node in self._links:
                if node == src:
                    continue
                for delay, data, held in self.model.impair(raw, self.rng):
                    t = start + delay
                    if not held:
                        t = max(t, self._last_arrival.get((src, node), 0.0))
                        self._last_arrival[(src, node)] = t
                    self._n += 1
                    heapq.heappush(self._events, (t, self._n, node, data))
            self._cond.notify()

    def close(self) -> None:
        """Close every attached link and stop the channel thread."""
        for link in list(self._links.values()):
            link.close()
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5.0)

    def __enter__(self) -> MemoryChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    if self._events and self._events[0][0] <= now:
                        break
                    wait = self._events[0][0] - now if self._events else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, node, data = heapq.heappop(self._events)
                link = self._links.get(node)
                self.frames_out += 1
            if link is not None:
                link.feed(data)


class MemoryLink(ArqLink):
    """An ArqLink attached to a MemoryChannel."""

    def __init__(
        self, channel: MemoryChannel, node_id: int, config: ArqConfig | None = None, **kw: Any
    ) -> None:
        self.channel = channel
        super().__init__(node_id, lambda raw: channel.transmit(node_id, raw), config=config, **kw)

    def close(self) -> None:
        """Close the link and detach it from the channel."""
        super().close()
        self.channel.detach(self.node_id)
