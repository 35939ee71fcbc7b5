"""The lockstep over ZeroMQ: the broker that owns the medium, and a node's raw client.

One **broker** (ROUTER socket) runs the :class:`~scaleflu.radio.medium.model.MediumModel`. Each
step it waits until every attached node has sent its block of transmitted samples (REQ/REP per
block, as in srsRAN's multi-UE ZeroMQ set-up), computes the step and answers each node with
what its receiver hears, so a slow node makes the whole medium wait and the physics does not
depend on CPU speed. A receiver that has heard no transmitter for ``deaf_blocks`` steps gets no
samples (noise alone decodes to nothing); when nothing has been on air for ``idle_blocks`` steps
the broker paces virtual time at ``idle_speed`` x real time, and while no node has anything to
send and none holds it back (a MAC expecting an answer sets the step's hold flag) a step covers
``idle_stride`` blocks. :class:`MediumClient` is one
node's end of it (tests and benchmarks drive it with hand-made bursts; ``MediumPort`` wraps it
in a flowgraph).
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import zmq

from .config import DEFAULT_MEDIUM_ADDRESS, MAX_NODE_ID, MediumConfig, _check_node
from .model import MediumModel

logger = logging.getLogger(__name__)

MAX_SAMPLE_ABS = 1e4  # transmitters are normalised to unit power; anything far above is hostile


class MediumError(RuntimeError):
    """The broker refused a request or did not answer in time."""


# Messages (multipart): request [kind, header, payload]; kinds:
#   b"J" join:  header = u16 node              -> b"W" welcome: u32 block, f64 samp_rate, u64 step
#   b"S" step:  header = u64 n, u8 flags       -> b"R" rx: u64 step, u8 flags (1 = idle), samples
#               n: the node's request number since it joined (0, 1, 2, ...; a node may have up to
#               MAX_IN_FLIGHT requests waiting: pipelining), each the node's block of the next
#               step; the reply's step is the medium's step after it (a stride covers several
#               blocks). payload = block complex64 samples, or empty = all zeros; request flag
#               1 (hold): the node expects traffic soon (its MAC has a grant open): no stride;
#               flag 2 (ahead): the node sends its next request without waiting for this
#               reply (pipelining): no stride before that next request is in and silent too
#   b"L" leave -> b"B";  b"Q" stats -> b"T" JSON;  any error -> b"E" text
_JOIN = struct.Struct("<H")


_WELCOME = struct.Struct("<IdQ")


_STEP = struct.Struct("<QB")


_FLAG_IDLE = 1


_FLAG_HOLD = 1  # in a step request: do not stride over idle blocks now


_FLAG_AHEAD = 2  # in a step request: the node's next request comes without waiting for this one


MAX_IN_FLIGHT = 8  # step requests of one node waiting for the others at most


class MediumBroker:
    """Owns the medium: collects every node's block, computes the step, answers each node."""

    def __init__(self, config: MediumConfig, context: Any = None) -> None:
        self.cfg = config
        self.model = MediumModel(config)
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # a message part larger than one block of samples is hostile: ZeroMQ drops the peer
        self._sock.setsockopt(zmq.MAXMSGSIZE, 8 * config.block + 1024)
        if config.address.endswith(":0"):
            port = self._sock.bind_to_random_port(config.address.rsplit(":", 1)[0])
            self.address = f"{config.address.rsplit(':', 1)[0]}:{port}"
        else:
            self._sock.bind(config.address)
            self.address = config.address
        self._ident: dict[int, bytes] = {}  # node -> ZeroMQ identity
        self._by_ident: dict[bytes, int] = {}
        # per node its step requests not computed yet, in order: (block, silent, hold, ahead)
        self._queues: dict[int, deque[tuple[np.ndarray, bool, bool, bool]]] = {}
        self._next_req: dict[int, int] = {}  # per node the number its next request must have
        self.holds = 0  # steps in which a node held the stride back
        self._waiting_since: float | None = None
        self._started = not config.nodes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._wall0: float | None = None
        self._idle_t0: tuple[float, int] | None = None
        self.errors = 0
        self.dropped: list[int] = []
        self._last_step_wall: float | None = None
        self.busy_wall_s = 0.0  # wall time of steps in which receivers got samples
        self.busy_samples = 0  # ... and their virtual samples
        self.compute_s = 0.0  # wall seconds computing steps (the model)
        # per node: wall seconds from the broker's answer to the node's next block (the node's
        # own part of a step: its receiver, transmitter and threads), summed over steps
        self.node_cycle_s: dict[int, float] = {}
        self._answered: dict[int, float] = {}
        self.pace_s = 0.0  # ... sleeping to hold an idle medium at idle_speed
        self._zero = np.zeros(config.block, np.complex64)

    def start(self) -> MediumBroker:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve, name="medium-broker", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until close() (blocking)."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                try:
                    parts = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    continue
                except zmq.ZMQError:
                    break
                self._handle(parts)
            self._check_timeouts()
        self._sock.close(0)

    def _reply(self, ident: bytes, *parts: bytes) -> None:
        self._sock.send_multipart([ident, *parts], copy=False)

    def _error(self, ident: bytes, text: str) -> None:
        self.errors += 1
        logger.warning("medium: refused a request: %s", text)
        self._reply(ident, b"E", text.encode()[:200])

    def _handle(self, parts: list[bytes]) -> None:
        if len(parts) < 2:
            return
        ident, kind, rest = parts[0], parts[1], parts[2:]
        if kind == b"J":
            if len(rest) != 1 or len(rest[0]) != _JOIN.size:
                return self._error(ident, "bad join")
            (node,) = _JOIN.unpack(rest[0])
            if node > MAX_NODE_ID:
                return self._error(ident, "bad node id")
            if self.cfg.nodes and node not in self.cfg.nodes:
                return self._error(ident, f"node {node} is not one of {list(self.cfg.nodes)}")
            old = self._ident.get(node)
            if old is not None and old != ident:
                self._by_ident.pop(old, None)  # the node restarted: the new socket replaces it
            self._queues[node] = deque()
            self._next_req[node] = 0
            with self._lock:
                self.model.add(node)
            self._ident[node] = ident
            self._by_ident[ident] = node
            if not self._started and set(self.cfg.nodes) <= set(self._ident):
                self._started = True
            logger.info("medium: node %d joined at step %d", node, self.model.steps)
            return self._reply(
                ident, b"W", _WELCOME.pack(self.cfg.block, self.cfg.samp_rate, self.model.steps)
            )
        node = self._by_ident.get(ident)
        if kind == b"Q":
            return self._reply(ident, b"T", json.dumps(self.stats()).encode())
        if node is None:
            return self._error(ident, "not joined (join first)")
        if kind == b"L":
            self._leave(node)
            return self._reply(ident, b"B")
        if kind != b"S" or len(rest) != 2 or len(rest[0]) != _STEP.size:
            return self._error(ident, "bad request")
        req, flags = _STEP.unpack(rest[0])
        q = self._queues[node]
        if req != self._next_req[node]:
            return self._error(
                ident, f"step request {req} is not the next one, {self._next_req[node]}"
            )
        if len(q) >= MAX_IN_FLIGHT:
            return self._error(ident, f"more than {MAX_IN_FLIGHT} step requests in flight")
        payload = rest[1]
        if len(payload) == 0:
            x = self._zero
        elif len(payload) == 8 * self.cfg.block:
            x = np.frombuffer(payload, np.complex64)
            if not np.isfinite(x).all() or np.abs(x).max() > MAX_SAMPLE_ABS:
                return self._error(ident, "samples must be finite and bounded")
        else:
            return self._error(ident, f"a step carries 0 or {8 * self.cfg.block} bytes")
        t_ans = self._answered.pop(node, None)
        if t_ans is not None:
            self.node_cycle_s[node] = self.node_cycle_s.get(node, 0.0) + time.monotonic() - t_ans
        self._next_req[node] += 1
        q.append((x, len(payload) == 0, bool(flags & _FLAG_HOLD), bool(flags & _FLAG_AHEAD)))
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        while self._maybe_step():
            pass

    def _maybe_step(self) -> bool:
        """Compute the next step if every node's block for it is in; True when one was."""
        if not self._started or not self.model.nodes:
            return False
        if any(not self._queues.get(n) for n in self.model.nodes):
            return False
        idle_before = self.model.quiet_steps >= self.cfg.idle_blocks
        # a stride only while every block of every node, those still waiting included, is
        # silent and none holds it back; a node that decided its next block before hearing
        # this step (ahead) must have sent it: its next burst is never pushed behind a stride
        # that its MAC's clock did not see coming (the grant window it computed would close
        # early)
        queues = [self._queues[n] for n in self.model.nodes]
        all_silent = all(b[1] and not b[2] for q in queues for b in q)
        if idle_before and all_silent and self.cfg.idle_stride > 1 and self.model.can_skip():
            if any(q[0][3] and len(q) < 2 for q in queues):
                return False  # wait for those nodes' next requests before striding
        heads = {n: self._queues[n].popleft() for n in self.model.nodes}
        pending = {n: h[0] for n, h in heads.items()}
        deaf_n = self.cfg.deaf_blocks
        deaf_before = {n: self.model.deaf_steps.get(n, 0) >= deaf_n for n in pending}
        hold = any(h[2] for h in heads.values())
        self.holds += hold and idle_before
        tc = time.monotonic()
        with self._lock:
            if idle_before and all_silent and self.cfg.idle_stride > 1 and self.model.can_skip():
                self.model.skip(self.cfg.idle_stride)  # nobody sends: jump, nobody hears
                out = dict.fromkeys(pending, None)
            else:
                out = self.model.step(pending)
        self.compute_s += time.monotonic() - tc
        self._waiting_since = (
            None if all(not self._queues[n] for n in self.model.nodes) else time.monotonic()
        )
        idle = idle_before and self.model.quiet_steps >= self.cfg.idle_blocks
        now = time.monotonic()
        if self._last_step_wall is not None and not idle:
            self.busy_wall_s += now - self._last_step_wall
            self.busy_samples += self.cfg.block
        self._last_step_wall = now
        if idle:
            self._pace()
        else:
            self._idle_t0 = None
        for node, y in out.items():
            # a receiver that has heard no one for idle_blocks steps gets nothing (saves its CPU)
            deaf = deaf_before[node] and self.model.deaf_steps.get(node, 0) >= deaf_n
            quiet = idle or deaf or y is None
            header = _STEP.pack(self.model.steps, _FLAG_IDLE if quiet else 0)
            self._reply(self._ident[node], b"R", header, b"" if quiet else y.tobytes())
            self._answered[node] = time.monotonic()
        return True

    def _pace(self) -> None:
        """While idle, keep virtual time at most ``idle_speed`` x wall time (saves CPU)."""
        if self.cfg.idle_speed <= 0:
            return
        now = time.monotonic()
        if self._idle_t0 is None:
            self._idle_t0 = (now, self.model.t)
            return
        t0, s0 = self._idle_t0
        ahead = (self.model.t - s0) / self.cfg.samp_rate / self.cfg.idle_speed - (now - t0)
        if ahead > 0:
            time.sleep(min(ahead, 0.1))
            self.pace_s += min(ahead, 0.1)

    def _leave(self, node: int) -> None:
        ident = self._ident.pop(node, None)
        if ident is not None:
            self._by_ident.pop(ident, None)
        self._queues.pop(node, None)
        self._next_req.pop(node, None)
        with self._lock:
            self.model.remove(node)
        logger.info("medium: node %d left at step %d", node, self.model.steps)
        while self._maybe_step():
            pass

    def _check_timeouts(self) -> None:
        if self._waiting_since is None:
            return
        if time.monotonic() - self._waiting_since < self.cfg.node_timeout:
            return
        late = [n for n in self.model.nodes if not self._queues.get(n)]
        for n in late:
            logger.warning(
                "medium: node %d sent no block for %.0f s: dropped", n, self.cfg.node_timeout
            )
            self.dropped.append(n)
            self._leave(n)
        self._waiting_since = None

    def stats(self) -> dict[str, Any]:
        """Model counters plus broker errors and dropped nodes (JSON-ready)."""
        with self._lock:
            s = self.model.stats()
        s["errors"] = self.errors
        s["dropped"] = list(self.dropped)
        # speed of the lockstep while receivers get samples (virtual s per wall s)
        s["busy_samples"] = self.busy_samples
        s["busy_wall_s"] = self.busy_wall_s
        s["compute_s"] = self.compute_s
        s["holds"] = self.holds
        s["node_cycle_s"] = {str(n): v for n, v in self.node_cycle_s.items()}
        s["pace_s"] = self.pace_s
        return s

    def close(self) -> None:
        """Stop serving."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> MediumBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


JOIN_NOTICE_S = 5.0  # a node waiting for its broker says so this often


def broker_hint(address: str) -> str:
    """How to start the broker a node waits for (the words of its waiting and error lines)."""
    return (
        f"start it with `python -m scaleflu.cli.medium --address {address}` (or run the whole "
        "local testbed, which starts its own: `scaleflu testbed`)"
    )


class MediumClient:
    """One node's lockstep connection to the broker (raw samples; MediumPort wraps it)."""

    def __init__(self, node_id: int, address: str = DEFAULT_MEDIUM_ADDRESS, timeout: float = 120.0):
        self.node_id = _check_node(node_id)
        self.address = address
        self.timeout = timeout
        self.stopping = threading.Event()  # set by MediumPort to end a pending wait
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        try:  # a broker started after the node is joined as soon as it answers
            kind, parts = self._call(b"J", _JOIN.pack(self.node_id), waiting=True)
        except BaseException:
            self._sock.close(0)
            raise
        if kind != b"W":
            self._sock.close(0)
            raise MediumError(f"join refused: {parts}")
        self.block, self.samp_rate, self.step_no = _WELCOME.unpack(parts[0])
        self.idle = False
        self.sent = 0  # step requests sent (their numbers: 0, 1, 2, ...)

    def _call(self, kind: bytes, *parts: bytes, waiting: bool = False) -> tuple[bytes, list[bytes]]:
        """Send one request and wait for its reply (``waiting``: say every JOIN_NOTICE_S
        seconds, at INFO, what the node waits for and how to start it)."""
        self._sock.send_multipart([kind, *parts], copy=False)
        return self._reply(waiting)

    def _reply(self, waiting: bool = False) -> tuple[bytes, list[bytes]]:
        """The reply to the oldest request in flight (``waiting``: as :meth:`_call`)."""
        start = time.monotonic()
        end, said = start + self.timeout, start
        while not self._sock.poll(200):  # short slices: stop() ends a wait within 0.2 s
            if self.stopping.is_set():
                raise MediumError("stopped")
            now = time.monotonic()
            if now > end:
                hint = f"; {broker_hint(self.address)}" if waiting else ""
                raise MediumError(
                    f"no answer from the medium broker at {self.address} in {self.timeout:.0f} s"
                    + hint
                )
            if waiting and now - said >= JOIN_NOTICE_S:
                said = now
                logger.info(
                    "medium node %d: waiting for the medium broker at %s (%.0f s of %.0f s); %s",
                    self.node_id,
                    self.address,
                    now - start,
                    self.timeout,
                    broker_hint(self.address),
                )
        reply = self._sock.recv_multipart()
        if reply[0] == b"E":
            raise MediumError(reply[1].decode(errors="replace") if len(reply) > 1 else "error")
        return reply[0], reply[1:]

    def send_block(self, tx: np.ndarray | None, hold: bool = False, ahead: bool = False) -> None:
        """Send this node's block of the next step not sent yet (None = zeros), without waiting
        for the answer (:meth:`recv_block`): up to ``MAX_IN_FLIGHT`` may be in flight.
        ``hold``: this node expects traffic soon: the broker does not stride then. ``ahead``:
        the node will send its next block before it has this one's answer (pipelining)."""
        payload = b"" if tx is None else np.ascontiguousarray(tx, np.complex64).tobytes()
        flags = (_FLAG_HOLD if hold else 0) | (_FLAG_AHEAD if ahead else 0)
        self._sock.send_multipart([b"S", _STEP.pack(self.sent, flags), payload], copy=False)
        self.sent += 1

    def recv_block(self) -> np.ndarray | None:
        """The received block of the oldest step in flight, or None while idle."""
        kind, parts = self._reply()
        if kind != b"R" or len(parts) != 2:
            raise MediumError("bad reply from the medium broker")
        self.step_no, flags = _STEP.unpack(parts[0])
        self.idle = bool(flags & _FLAG_IDLE)
        if self.idle:
            return None
        return np.frombuffer(parts[1], np.complex64)

    def exchange(self, tx: np.ndarray | None, hold: bool = False) -> np.ndarray | None:
        """Send this step's block (None = zeros); the received block, or None while idle.
        ``hold``: this node expects traffic soon: the broker does not stride now."""
        self.send_block(tx, hold)
        try:
            return self.recv_block()
        except MediumError as exc:
            if exc.args and "answer" not in str(exc):  # refused: the number was not used
                self.sent -= 1
            raise

    def stats(self) -> dict[str, Any]:
        """The broker's counters."""
        _, parts = self._call(b"Q")
        return json.loads(parts[0])

    def close(self) -> None:
        """Leave the medium."""
        try:
            self._sock.send_multipart([b"L"])
            self._sock.poll(1000)
        finally:
            self._sock.close(0)


def broker_stats(address: str = DEFAULT_MEDIUM_ADDRESS, timeout: float = 5.0) -> dict[str, Any]:
    """The counters of the broker at ``address`` (no join needed)."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(address)
        s.send_multipart([b"Q"])
        if not s.poll(int(timeout * 1000)):
            raise MediumError(f"no answer from the medium broker at {address}")
        return json.loads(s.recv_multipart()[1])
    finally:
        s.close(0)
