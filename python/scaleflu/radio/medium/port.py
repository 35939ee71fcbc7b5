"""The GNU Radio end of a node on the shared medium: its transmitter's bursts in, what it hears out.

``MediumPort`` is the medium end of one node's flowgraph: ``tx_sink`` (complex in) keeps the
transmitter's whole bursts, ``rx_source`` (complex out) plays what the broker says the node's
receiver hears, and a thread runs the lockstep with the broker
(:class:`~scaleflu.radio.medium.broker.MediumClient`). A node's frames enter the medium as whole
bursts (never split by idle zeros) at the first block after its modulator finished them.
``medium_node`` is the same as a GRC hier block; ``frame_burst`` and ``unit_amplitude`` give the
samples one frame puts on air (tests and benchmarks that place bursts by hand).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Any

import numpy as np
import pmt
from gnuradio import blocks, gr

from ..phy import PhyConfig, burst_power
from .broker import MediumClient, MediumError
from .config import DEFAULT_MEDIUM_ADDRESS

logger = logging.getLogger(__name__)


class tx_tap(gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Complex in: keeps whole bursts (delimited by ``packet_len`` tags) for the medium."""

    def __init__(self, len_tag_key: str = "packet_len") -> None:
        gr.sync_block.__init__(self, "medium_tx_tap", [np.complex64], None)
        self._key = pmt.intern(len_tag_key)
        self._lock = threading.Lock()
        self._chunks: list[np.ndarray] = []
        self._held = 0  # samples in _chunks
        self._got = 0  # samples received in total
        self._ready_to = 0  # absolute end of the last complete burst
        self._taken = 0  # absolute samples handed to the medium
        self._ends: list[int] = []
        self.bursts = 0
        self.on_progress: Any = None  # called after a burst is complete (wakes the lockstep)

    def work(self, input_items, output_items):  # noqa: D102
        x = input_items[0]
        n = len(x)
        start = self.nitems_read(0)
        for tag in self.get_tags_in_window(0, 0, n, self._key):
            self._ends.append(int(tag.offset) + int(pmt.to_long(tag.value)))
        with self._lock:
            self._chunks.append(x.copy())
            self._held += n
            self._got = start + n
            done = 0
            while self._ends and self._ends[0] <= self._got:
                self._ready_to = self._ends.pop(0)
                self.bursts += 1
                done += 1
        if done and self.on_progress is not None:
            self.on_progress()
        return n

    def take(self, block: int) -> np.ndarray | None:
        """Up to ``block`` samples of complete bursts, zero-padded; None when none."""
        with self._lock:
            avail = self._ready_to - self._taken
            if avail <= 0:
                return None
            k = min(avail, block)
            out = np.zeros(block, np.complex64)
            got = 0
            while got < k:
                c = self._chunks[0]
                m = min(len(c), k - got)
                out[got : got + m] = c[:m]
                got += m
                if m == len(c):
                    self._chunks.pop(0)
                else:
                    self._chunks[0] = c[m:]
            self._held -= k
            self._taken += k
            return out

    def pending_bursts(self) -> int:
        """Bursts whose samples have not all reached the tap yet (tags seen, end not)."""
        with self._lock:
            return len(self._ends)


class rx_feed(gr.sync_block):  # noqa: N801 - GNU Radio block naming
    """Complex out: the blocks the medium gives this node's receiver (bounded queue)."""

    def __init__(self, depth: int = 4) -> None:
        gr.sync_block.__init__(self, "medium_rx_feed", None, [np.complex64])
        self.q: queue.Queue[np.ndarray] = queue.Queue(maxsize=depth)
        self._cur: np.ndarray | None = None
        self._pos = 0
        self.fed = 0
        self.on_start: Any = None  # called when the flowgraph starts (medium_node)
        self.on_stop: Any = None
        self.on_progress: Any = None  # called after samples were handed on (wakes the lockstep)

    def start(self):  # noqa: D102
        if self.on_start is not None:
            self.on_start()
        return True

    def stop(self):  # noqa: D102
        if self.on_stop is not None:
            self.on_stop()
        return True

    def work(self, input_items, output_items):  # noqa: D102
        out = output_items[0]
        done = 0
        while done < len(out):
            if self._cur is None or self._pos >= len(self._cur):
                try:
                    self._cur = self.q.get(timeout=0.05 if done == 0 else 0)
                except queue.Empty:
                    break
                self._pos = 0
            k = min(len(out) - done, len(self._cur) - self._pos)
            out[done : done + k] = self._cur[self._pos : self._pos + k]
            self._pos += k
            done += k
        self.fed += done
        if done and self.on_progress is not None:
            self.on_progress()
        return done


class MediumPort:
    """The medium end of one node's flowgraph: ``tx_sink`` (complex in), ``rx_source`` (out).

    A thread runs the lockstep: each step it takes up to one block of complete bursts from the
    transmitter (zeros when none), exchanges it with the broker and queues the received block
    for the receiver. The queue is bounded, so a slow receiver makes the medium wait.
    ``framer`` (optional, the transmitter's frame_builder) lets a step wait until every frame
    built so far has left the modulator, so a frame's start time does not depend on how fast
    the modulator runs.
    """

    def __init__(
        self,
        node_id: int,
        address: str = DEFAULT_MEDIUM_ADDRESS,
        timeout: float = 120.0,
        frames_built: Any = None,
        rx_depth: int = 4,
        rx_lag: int | None = None,
        pipeline: int = 2,
    ) -> None:
        self.client = MediumClient(node_id, address, timeout)
        self.block = self.client.block
        self.samp_rate = self.client.samp_rate
        self.tx_sink = tx_tap()
        self.rx_source = rx_feed(rx_depth)
        # the lockstep thread sleeps on this until something it waits for moved (a burst
        # built, samples taken in, a frame acted on: poke()), instead of polling every ms
        self._cv = threading.Condition()
        self._pokes = 0
        self.tx_sink.on_progress = self.poke
        self.rx_source.on_progress = self.poke
        # room for whole lockstep blocks: the feed hands each block to the receiver in one
        # work call (GNU Radio's default buffer took several, each waiting for the receiver)
        self.rx_source.set_min_output_buffer(0, 4 * self.block)
        self._frames_built = frames_built
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.steps = 0
        self.tx_samples = 0
        # at most this many blocks handed to the receiver and not yet taken in by the flowgraph
        # before the next step (None: only the queue's depth bounds it). Small values keep a
        # node's decoding latency, in virtual time, a few blocks whatever the CPU load.
        self.rx_lag = rx_lag
        # step requests in flight: 1 is strict lockstep (a node's block of step k is decided
        # after it heard step k - 1); 2 lets the broker compute a step while the nodes take in
        # the one before, at one block (1.6 ms at 8192 / 5 MS/s) more reaction delay
        if not 1 <= pipeline <= 8:
            raise ValueError("pipeline must be within 1..8 steps")
        self.pipeline = pipeline
        self._rx_queued = 0  # samples put in the receiver's queue
        # lockstep waits that ran out (30 s wall) and went on anyway: the transmitter never
        # reported a frame built / the receiver never caught up (each one stalls the medium)
        self.stalls = {"tx": 0, "rx": 0}
        # wall seconds the lockstep thread spent in each part of a step (where it waits):
        # its transmitter building frames, its receiver taking in samples / its ARQ acting on
        # decoded frames, the exchange with the broker (which waits for the slowest node)
        self.wait_s = {"tx": 0.0, "rx": 0.0, "pending": 0.0, "exchange": 0.0, "queue": 0.0}
        # frames the receiver decoded that the node has not acted on yet (SharedMediumLink: the
        # receiver's frame count minus the frames its ARQ/MAC processed): the lockstep waits for
        # them, so a node's answer to a frame (a robot's to its grant) does not depend on how
        # fast its Python threads run
        self.rx_pending: Any = None
        # samples the receiver has processed (its demux has consumed: every frame before them
        # decided), and how far that may trail what was fed (a frame in progress waits for all
        # its samples): bounds the node's decoding delay in virtual time whatever the CPU load
        self.rx_progress: Any = None
        self.rx_slack = 0
        self.frames_posted: Any = None  # frames handed to the transmitter (link_arq frames_out)
        # True while this node's MAC expects traffic (an open grant, frames queued): the broker
        # then does not stride over idle blocks, whatever the receivers' delay in decoding
        self.hold: Any = None
        self.on_step: list[Any] = []  # called after every step (virtual time moved)
        self.on_error: Any = None  # called with the exception when the lockstep stops on one
        self._thread = threading.Thread(
            target=self._run, name=f"medium-node-{node_id}", daemon=True
        )

    def start(self) -> None:
        """Start the lockstep thread (after the flowgraph started; once)."""
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def virtual_time(self) -> float:
        """The medium's virtual time in seconds (steps done x block / samp_rate).

        A clock for timers that must follow the medium rather than the wall (ARQ, MAC):
        it advances only as fast as the slowest node lets the medium run.
        """
        return self.client.step_no * self.block / self.samp_rate

    def poke(self) -> None:
        """Something the lockstep may wait for has moved (thread-safe, cheap)."""
        with self._cv:
            self._pokes += 1
            self._cv.notify()

    def _sleep(self, seen: int) -> int:
        """Wait until poked after ``seen`` pokes (at most 5 ms: a missed poke costs little)."""
        with self._cv:
            if self._pokes == seen:
                self._cv.wait(0.005)
            return self._pokes

    def stop(self) -> None:
        """Ask the lockstep thread to stop (without waiting; close() waits and leaves)."""
        self._stop.set()
        self.client.stopping.set()

    def _flush_wait(self) -> None:
        if self._frames_built is None:
            return
        now = time.monotonic()
        deadline = now + 30.0  # as _rx_wait: slower, not different, under load
        posted_deadline = now + 2.0  # a frame the builder never builds must not stall us long
        seen = self._pokes
        while time.monotonic() < deadline and not self._stop.is_set():
            posted = None if self.frames_posted is None else int(self.frames_posted())
            built = int(self._frames_built())
            if posted is not None and built != posted and time.monotonic() < posted_deadline:
                # frames handed to the builder and not built yet (or a burst being posted now):
                # a train would otherwise go out split by idle blocks, past its grant window
                seen = self._sleep(seen)
                continue
            if self.tx_sink.bursts >= built and not self.tx_sink.pending_bursts():
                return
            seen = self._sleep(seen)
        if not self._stop.is_set():
            self._stalled("tx", f"{self.tx_sink.bursts} bursts out of {built} frames built")

    def _stalled(self, side: str, detail: str) -> None:
        self.stalls[side] += 1
        logger.warning(
            "medium node %d: lockstep waited 30 s for its %s (%s); going on (stall %d)",
            self.client.node_id,
            "transmitter" if side == "tx" else "receiver",
            detail,
            self.stalls[side],
        )

    def _rx_wait(self) -> None:
        if self.rx_lag is None and self.rx_pending is None:
            return
        limit = math.inf if self.rx_lag is None else self.rx_lag * self.block
        pending = self.rx_pending or (lambda: 0)
        # the medium waits for this receiver (a loaded CPU makes it slower, not different), but
        # not for good: a receiver stuck this long lets the lockstep go on (under node_timeout)
        t0 = time.monotonic()
        deadline = t0 + 30.0
        fed_ok = False
        seen = self._pokes
        while not self._stop.is_set():
            if not fed_ok:
                fed_ok = self._rx_queued - self.rx_source.fed <= limit and (
                    self.rx_progress is None
                    or self._rx_queued - self.rx_progress() <= limit + self.rx_slack
                )
                if fed_ok:
                    t1 = time.monotonic()
                    self.wait_s["rx"] += t1 - t0
                    t0 = t1
            if fed_ok and pending() <= 0:
                break
            if time.monotonic() > deadline:
                self._stalled(
                    "rx",
                    f"{self._rx_queued - self.rx_source.fed} samples queued, "
                    f"{pending()} frames decoded and not processed",
                )
                return
            seen = self._sleep(seen)
        self.wait_s["pending" if fed_ok else "rx"] += time.monotonic() - t0

    def _run(self) -> None:
        w = self.wait_s
        in_flight = 0
        try:
            while not self._stop.is_set():
                while in_flight < self.pipeline and not self._stop.is_set():
                    # this node's block of a step is decided before it has heard the step
                    # before it (pipeline - 1 blocks of reaction delay): the broker computes a
                    # step while the nodes' receivers work on the one before
                    t0 = time.monotonic()
                    self._flush_wait()
                    t1 = time.monotonic()
                    self._rx_wait()
                    x = self.tx_sink.take(self.block)
                    if x is not None:
                        self.tx_samples += int(np.count_nonzero(x))
                    hold = bool(self.hold()) if self.hold is not None else False
                    self.client.send_block(x, hold=hold, ahead=self.pipeline > 1)
                    in_flight += 1
                    w["tx"] += t1 - t0
                t2 = time.monotonic()
                y = self.client.recv_block()
                in_flight -= 1
                t3 = time.monotonic()
                w["exchange"] += t3 - t2
                self.steps += 1
                for cb in self.on_step:
                    try:
                        cb()
                    except Exception:  # a listener's bug must not stop the medium's clock
                        logger.exception(
                            "medium node %d: step listener failed", self.client.node_id
                        )
                if y is None:
                    continue
                while not self._stop.is_set():
                    try:
                        self.rx_source.q.put(y, timeout=0.1)
                        self._rx_queued += len(y)
                        break
                    except queue.Full:
                        continue
                w["queue"] += time.monotonic() - t3
        except BaseException as exc:  # noqa: BLE001 - reported through .error and the log
            if not self._stop.is_set():
                self.error = exc
                logger.error("medium node %d stopped: %s", self.client.node_id, exc)
                if self.on_error is not None:
                    self.on_error(exc)

    def close(self) -> None:
        """Stop the lockstep thread and leave the medium."""
        self.stop()
        if self._thread.is_alive():
            self._thread.join(5)
        self.client.close()


def unit_amplitude(phy: Any = None) -> float:
    """The ofdm_link_tx amplitude that gives unit mean burst power (what the medium assumes)."""
    return 1.0 / math.sqrt(burst_power(phy or PhyConfig()))


class medium_node(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """GRC block "Shared Medium Node": TX samples in ("packet_len" tags) -> medium -> RX out.

    ``tx_amplitude`` is the amplitude set on the OFDM Link TX in front (1.0 by default); the
    node scales its input to unit mean burst power, which the medium's SNRs assume. Joins
    the broker at ``broker`` when built (a missing broker fails here: MediumError, or one
    line and exit status 1 with ``exit_on_missing``); the lockstep starts and stops with
    the flowgraph.
    """

    def __init__(
        self,
        node_id: int = 0,
        broker: str = DEFAULT_MEDIUM_ADDRESS,
        timeout: float = 30.0,
        exit_on_missing: bool = False,
        tx_amplitude: float = 1.0,
    ) -> None:
        gr.hier_block2.__init__(
            self,
            "medium_node",
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
        )
        try:
            self.port = MediumPort(node_id, broker, timeout)
        except MediumError as exc:
            if exit_on_missing:
                raise SystemExit(f"MediumError: {exc}") from None
            raise
        self.port.rx_source.on_start = self.port.start
        self.port.rx_source.on_stop = self.port.stop
        if not tx_amplitude > 0:
            raise ValueError("tx_amplitude must be > 0")
        self.scale = blocks.multiply_const_cc(unit_amplitude() / tx_amplitude)
        self.connect(self, self.scale, self.port.tx_sink)
        self.connect(self.port.rx_source, self)


def frame_burst(payload: bytes, src: int, phy: Any = None, dst: int = 0xFFFF) -> np.ndarray:
    """The samples one frame puts on air from ``src`` (unit mean burst power, with padding).

    Runs the node's own transmitter (ofdm_link_tx) once; for tests and benchmarks that place
    bursts by hand with a MediumClient.
    """
    phy = phy or PhyConfig()
    if not 1 <= len(payload) <= phy.mtu - 26:
        raise ValueError(f"payload must be 1..{phy.mtu - 26} bytes")
    tx = phy.tx(src, amplitude=1.0 / math.sqrt(burst_power(phy)), dst=dst)
    tb = gr.top_block()
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    tb.start()
    data = np.frombuffer(payload, np.uint8)
    tx.framer.to_basic_block()._post(
        pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(data), data))
    )
    want = phy.frame_samples(len(payload) + 26)
    deadline = time.monotonic() + 10
    while len(sink.data()) < want and time.monotonic() < deadline:
        time.sleep(0.005)
    tb.stop()
    tb.wait()
    x = np.asarray(sink.data(), dtype=np.complex64)
    if len(x) < want:
        raise RuntimeError("the transmitter did not put out the burst")
    return x
