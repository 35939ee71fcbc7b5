"""Frame-level virtual-time simulator of one shared medium, for the MAC and for unscheduled traffic.

No PHY: a frame occupies its frequency for ``MacConfig.airtime(len, mcs)`` seconds (PHY rate
plus a preamble, or the coded PHY's frame at the frame's MCS: ``scaleflu.link.mcs``). Every node
has one transmitter (its frames go on air back to back, in order) and one receiver (half
duplex: it hears nothing while it transmits). A frame reaches a receiver unless

* the link is out of range (``set_link(a, b, loss=1.0)`` or ``out_of_range``),
* another frame on the same frequency overlaps it in time at that receiver and the wanted
  frame is not ``capture_db`` stronger than the sum of the overlapping ones (collision), or
* the link's own loss draw drops it (seeded, per frame): a fixed loss, ``loss_fn``, or with
  ``snr_fn`` (the link's SNR at the frame's time: a fading trace) the measured frame error
  rate of the frame's MCS (or of the stock PHY) at that SNR (``scaleflu.link.mcs``); the
  receiver then gets the SNR it would measure (``on_frame(raw, snr_db=...)``, with
  ``snr_error_db`` of estimation noise), which drives link adaptation.

Link gains come from ``set_link(..., gain_db=...)`` (default 0 dB everywhere, so any overlap is
a collision). FDMA: give nodes separate ``tx_freq``/``rx_freqs``. ``full_duplex_pairs=True`` makes
every (src, dst) pair its own collision-free channel: the ideal per-pair bound.

Nodes are anything with ``on_frame(raw)``, ``poll()`` and ``next_deadline()`` whose clock is
``sim.clock`` (an ArqEndpoint, a MacServer, a MacStation). The simulator counts airtime per
category (downlink / uplink link DATA, control: ACKs, NACKs and MAC frames), collisions and
losses. Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .arq import ArqConfig, ArqEndpoint
from .fragment import fragment
from .frame import BROADCAST, FRAME_MAGIC, FrameType
from .mac import MAC_MAGIC, MAC_MSG_ID, MacConfig, MacServer, MacStation
from .mcs import MCS_TABLE, STOCK, frame_error_rate

_U16 = struct.Struct(">H")


class SimNode(Protocol):
    def on_frame(self, raw: bytes) -> None: ...
    def poll(self) -> None: ...
    def next_deadline(self) -> float | None: ...


@dataclass
class _Tx:
    src: int
    freq: float
    start: float
    end: float
    raw: bytes
    dst: int
    category: str
    collided: bool = False
    mcs: int | None = None


@dataclass
class MediumStats:
    """What happened on the medium."""

    frames: int = 0
    bytes: int = 0
    airtime: dict[str, float] = field(
        default_factory=lambda: {"downlink": 0.0, "uplink": 0.0, "ack": 0.0, "mac": 0.0}
    )
    collided_frames: int = 0  # frames that overlapped another on their frequency
    lost_collision: int = 0  # receptions by the addressee lost to a collision
    lost_link: int = 0  # receptions by the addressee lost to the link's loss draw
    lost_half_duplex: int = 0
    captured: int = 0  # receptions that survived an overlap by the capture margin
    data_repeats: int = 0  # link DATA frames put on air again (same src, msg_id, seq)
    delivered: int = 0
    airtime_by_node: dict[int, float] = field(default_factory=dict)  # seconds each node sent
    frames_by_node: dict[int, int] = field(default_factory=dict)
    bytes_by_mcs: dict[str, int] = field(default_factory=dict)  # frames on air by MCS

    def as_dict(self) -> dict[str, Any]:
        """Counters as a plain dict (airtime in seconds)."""
        d = dict(self.__dict__)
        d["airtime"] = dict(self.airtime)
        d["airtime_by_node"] = dict(self.airtime_by_node)
        d["frames_by_node"] = dict(self.frames_by_node)
        d["bytes_by_mcs"] = dict(self.bytes_by_mcs)
        return d


def classify(raw: bytes, server: int) -> tuple[str, int]:
    """(category, dst): downlink/uplink (link DATA), ack (link ACK/NACK), mac (MAC control)."""
    if len(raw) >= 8:
        magic = _U16.unpack_from(raw)[0]
        src, dst = struct.unpack_from(">HH", raw, 4)
        if magic == FRAME_MAGIC:
            if len(raw) >= 12 and struct.unpack_from(">I", raw, 8)[0] == MAC_MSG_ID:
                return "mac", dst
            if raw[3] == FrameType.DATA:
                return ("downlink" if src == server else "uplink"), dst
            return "ack", dst
        if magic == MAC_MAGIC:
            return "mac", dst
    return "mac", BROADCAST


class MacSim:
    """Discrete-event simulation of nodes on one (or more) frequencies (module docstring)."""

    def __init__(
        self,
        config: MacConfig | None = None,
        server: int = 0,
        capture_db: float = 6.0,
        seed: int = 0,
        full_duplex_pairs: bool = False,
        prop_delay: float = 0.0,
        start_quantum: float = 0.0,
        loss_fn: Callable[[int, int, float, float, int], float] | None = None,
        snr_fn: Callable[[int, int, float], float] | None = None,
        snr_error_db: float = 0.7,
    ) -> None:
        if prop_delay < 0 or start_quantum < 0:
            raise ValueError("prop_delay and start_quantum must be >= 0")
        self.config = config or MacConfig()
        # A sample-level PHY starts a burst at the next lockstep block (start_quantum seconds)
        # and hands a frame to the node some time after its last sample (prop_delay: receiver
        # latency). Both 0: the ideal frame-level medium.
        self.start_quantum = start_quantum
        # loss_fn(src, dst, start, end, nbytes) -> loss probability of that frame on that link
        # (time-varying channels: a fading trace and the PHY's frame error rate per SNR)
        self.loss_fn = loss_fn
        # snr_fn(src, dst, t) -> SNR (dB) of that link at virtual time t: frames are lost by
        # the PHY's frame error rate at their MCS, receivers get the SNR (+ estimation noise)
        self.snr_fn = snr_fn
        self.snr_error_db = snr_error_db
        self.server = server
        self.capture_db = capture_db
        self.full_duplex_pairs = full_duplex_pairs
        self.prop_delay = prop_delay
        self.rng = random.Random(seed)
        self.now = 0.0
        self.stats = MediumStats()
        self.nodes: dict[int, SimNode] = {}
        self.tx_freq: dict[int, float] = {}
        self.rx_freqs: dict[int, set[float]] = {}
        self._gain: dict[tuple[int, int], float] = {}
        self._loss: dict[tuple[int, int], float] = {}
        self._tx_busy: dict[tuple[int, int], float] = {}
        self._active: list[_Tx] = []  # transmissions that may still overlap a later one
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._wake: dict[int, float | None] = {}
        self._timers: list[tuple[float, int, int]] = []
        self._touched: set[int] = set()
        self.on_tx: Callable[[_Tx], None] | None = None
        self.wall_capped = False
        self._seen: set[bytes] = set()
        self._horizon = 2 * self.config.airtime(9000)  # longest overlap worth remembering

    # -- set-up ----------------------------------------------------------------------------
    def clock(self) -> float:
        """Virtual time in seconds (give it to every node as its clock)."""
        return self.now

    def transmitter(self, node_id: int) -> Callable[..., None]:
        """The ``transmit``/``phy_transmit`` callable of a node (``(raw, mcs=None)``)."""
        return lambda raw, mcs=None: self._transmit(node_id, bytes(raw), mcs)

    def add(self, node_id: int, node: SimNode, freq: float = 0.0, rx_freqs=None) -> None:
        """Attach a node transmitting on ``freq`` and listening on ``rx_freqs`` ({freq})."""
        self.nodes[node_id] = node
        self.tx_freq[node_id] = freq
        self.rx_freqs[node_id] = set(rx_freqs) if rx_freqs is not None else {freq}
        self._touched.add(node_id)

    def set_link(
        self, a: int, b: int, gain_db: float | None = None, loss: float | None = None
    ) -> None:
        """Gain (dB) and frame loss probability of the link a -> b and b -> a."""
        for key in ((a, b), (b, a)):
            if gain_db is not None:
                self._gain[key] = gain_db
            if loss is not None:
                if not 0.0 <= loss <= 1.0:
                    raise ValueError("loss must be a probability")
                self._loss[key] = loss

    def out_of_range(self, node: int) -> None:
        """Nothing the node sends is heard, and it hears nothing."""
        for other in list(self.nodes) + [self.server]:
            if other != node:
                self.set_link(node, other, loss=1.0)

    def touch(self, node_id: int) -> None:
        """Tell the simulator a node's timers may have changed (after calling into it)."""
        self._touched.add(node_id)

    # -- running ---------------------------------------------------------------------------
    def _audible(self, src: int, dst: int) -> bool:
        return self._loss.get((src, dst), 0.0) < 1.0

    def _transmit(self, src: int, raw: bytes, mcs: int | None = None) -> None:
        cat, dst = classify(raw, self.server)
        port = (src, dst) if self.full_duplex_pairs else (src, -1)  # one transmitter per node
        start = max(self.now, self._tx_busy.get(port, 0.0))
        if self.start_quantum and start > self._tx_busy.get(port, -1.0):  # not back to back
            q = self.start_quantum
            start = math.ceil(start / q - 1e-9) * q
        end = start + self.config.airtime(len(raw), mcs)
        self._tx_busy[port] = end
        tx = _Tx(src, self.tx_freq.get(src, 0.0), start, end, raw, dst, cat, mcs=mcs)
        name = STOCK if mcs is None else MCS_TABLE[mcs].name
        self.stats.bytes_by_mcs[name] = self.stats.bytes_by_mcs.get(name, 0) + len(raw)
        self.stats.frames += 1
        self.stats.bytes += len(raw)
        if cat in ("downlink", "uplink"):
            key = raw[4:16] if dst != BROADCAST else None
            if key is None:  # broadcast repairs: every copy after the first of (src, msg, seq)
                key = b"B" + raw[4:6] + raw[8:16]
            if key in self._seen:
                self.stats.data_repeats += 1
            else:
                self._seen.add(key)
        self.stats.airtime[cat] += end - start
        self.stats.airtime_by_node[src] = self.stats.airtime_by_node.get(src, 0.0) + end - start
        self.stats.frames_by_node[src] = self.stats.frames_by_node.get(src, 0) + 1
        # collision bookkeeping: anything on the same frequency overlapping in time
        self._active = [t for t in self._active if t.end > self.now - self._horizon]
        if not self.full_duplex_pairs:
            for t in self._active:
                if t.freq == tx.freq and t.src != src and t.start < end and t.end > start:
                    for x in (t, tx):
                        if not x.collided:
                            x.collided = True
                            self.stats.collided_frames += 1
        self._active.append(tx)
        if self.on_tx is not None:
            self.on_tx(tx)
        heapq.heappush(self._events, (end + self.prop_delay, next(self._seq), 0, tx))

    def _deliver(self, tx: _Tx) -> None:
        receivers = (
            [n for n in self.nodes if n != tx.src]
            if tx.dst == BROADCAST
            else ([tx.dst] if tx.dst in self.nodes and tx.dst != tx.src else [])
        )
        overlap = (
            []
            if self.full_duplex_pairs
            else [
                t
                for t in self._active
                if t is not tx and t.freq == tx.freq and t.start < tx.end and t.end > tx.start
            ]
        )
        for r in receivers:
            if tx.freq not in self.rx_freqs[r]:
                continue
            if not self._audible(tx.src, r):
                self.stats.lost_link += 1
                continue
            if overlap:
                if any(t.src == r for t in overlap):
                    self.stats.lost_half_duplex += 1
                    continue
                interf = [t for t in overlap if t.src != tx.src and self._audible(t.src, r)]
                if interf:
                    sig = self._gain.get((tx.src, r), 0.0)
                    pw = sum(10 ** (self._gain.get((t.src, r), 0.0) / 10) for t in interf)
                    if sig - 10 * math.log10(pw) < self.capture_db:
                        self.stats.lost_collision += 1
                        continue
                    self.stats.captured += 1
            p = self._loss.get((tx.src, r), 0.0)
            if self.loss_fn is not None and p < 1.0:
                p = max(p, self.loss_fn(tx.src, r, tx.start, tx.end, len(tx.raw)))
            snr = None
            if self.snr_fn is not None and p < 1.0:
                snr = self.snr_fn(tx.src, r, (tx.start + tx.end) / 2)
                mcs = STOCK if tx.mcs is None else tx.mcs
                p = max(p, frame_error_rate(mcs, snr, len(tx.raw)))
            if p and self.rng.random() < p:
                self.stats.lost_link += 1
                continue
            self.stats.delivered += 1
            if snr is None:
                self.nodes[r].on_frame(tx.raw)
            else:  # what the receiver measures: the frame's SNR, give or take its estimate
                self.nodes[r].on_frame(tx.raw, snr_db=snr + self.rng.gauss(0, self.snr_error_db))
            self._touched.add(r)

    def _refresh_timers(self) -> None:
        for n in self._touched:
            d = self.nodes[n].next_deadline() if n in self.nodes else None
            self._wake[n] = d
            if d is not None:
                heapq.heappush(self._timers, (d, next(self._seq), n))
        self._touched.clear()

    def step(self) -> bool:
        """Process the next event (a frame ending on air, or a node's timer); False if none."""
        self._refresh_timers()
        while self._timers and self._wake.get(self._timers[0][2]) != self._timers[0][0]:
            heapq.heappop(self._timers)  # stale entry
        t_ev = self._events[0][0] if self._events else math.inf
        t_tm = self._timers[0][0] if self._timers else math.inf
        if t_ev == math.inf and t_tm == math.inf:
            return False
        if t_ev <= t_tm:
            self.now = max(self.now, t_ev)
            _, _, kind, item = heapq.heappop(self._events)
            if kind == 1:  # an application event: it may call into any node
                item()
                self._touched.update(self.nodes)
            else:
                self._deliver(item)
        else:
            self.now = max(self.now, t_tm)
            _, _, n = heapq.heappop(self._timers)
            self._wake[n] = None
            self.nodes[n].poll()
            self._touched.add(n)
        return True

    def run_until(
        self, done: Callable[[], bool], max_time: float, max_wall_s: float | None = None
    ) -> bool:
        """Step until ``done()``, virtual ``max_time`` or ``max_wall_s`` CPU seconds."""
        t_end = None if max_wall_s is None else time.process_time() + max_wall_s
        n = 0
        while not done():
            if self.now > max_time or not self.step():
                return done()
            n += 1
            if t_end is not None and n % 1000 == 0 and time.process_time() > t_end:
                self.wall_capped = True
                return done()
        return True

    def call(self, node_id: int, fn: Callable[[], Any]) -> Any:
        """Call into a node from outside (an app action) and refresh its timers."""
        out = fn()
        self._touched.add(node_id)
        return out

    def schedule(self, at: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at virtual time ``at`` (an application event, e.g. training done)."""
        heapq.heappush(self._events, (at, next(self._seq), 1, fn))


MODES = ("scheduled", "unscheduled", "per-pair")


def simulate_round(
    mode: str,
    n_robots: int,
    model_bytes: int,
    update_bytes: int | None = None,
    *,
    train_s: float = 2.0,
    train_jitter_s: float = 0.1,
    deadline_s: float = 120.0,
    out_of_range: tuple[int, ...] = (),
    loss: float = 0.0,
    register: bool = False,
    seed: int = 0,
    mac: MacConfig | None = None,
    arq: ArqConfig | None = None,
    capture_db: float = 6.0,
    max_wall_s: float | None = None,
    rx_latency_s: float = 0.0,
    start_quantum_s: float = 0.0,
    loss_fn: Callable[[int, int, float, float, int], float] | None = None,
    snr_fn: Callable[[int, int, float], float] | None = None,
) -> dict[str, Any]:
    """One FedAvg round in virtual time: model down to ``n_robots`` robots, training, uploads.

    ``mode``: ``scheduled`` (MacServer/MacStation, broadcast downlink), ``unscheduled`` (today:
    every node transmits when its ARQ has a frame; one unicast model per robot) or ``per-pair``
    (ideal: every pair its own collision-free channel; unicast). Robots are nodes 1..N, the
    server is 0. Payloads are seeded random bytes; the result says whether every delivered
    model and update is bit-exact. The round closes when every robot's update is in, or at
    ``deadline_s`` (seconds of virtual time after the model went out). ``rx_latency_s`` and
    ``start_quantum_s`` fit the model to the sample-level medium (MacSim's ``prop_delay`` and
    ``start_quantum``: receiver latency, bursts starting at lockstep block boundaries);
    ``loss_fn`` a time-varying frame loss per link, ``snr_fn`` a time-varying SNR per link
    (frames lost by the PHY's measured error rate at their MCS; MacSim). ``mac.mcs`` turns on
    link adaptation (the scheduled mode; the others send at the PHY's one rate).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if n_robots < 1:
        raise ValueError("need at least one robot")
    mac = mac or MacConfig()
    arq = arq or ArqConfig(window=64, initial_rto=3.0, min_rto=0.6, deadline=deadline_s)
    rng = random.Random(seed)
    robots = list(range(1, n_robots + 1))
    sim = MacSim(
        mac,
        server=0,
        capture_db=capture_db,
        seed=seed,
        full_duplex_pairs=mode == "per-pair",
        prop_delay=rx_latency_s,
        start_quantum=start_quantum_s,
        loss_fn=loss_fn,
        snr_fn=snr_fn,
    )
    model = rng.randbytes(model_bytes)
    updates = {r: rng.randbytes(update_bytes or model_bytes) for r in robots}
    got_model: dict[int, bool] = {}
    got_update: dict[int, bool] = {}
    t_model: dict[int, float] = {}
    t_update: dict[int, float] = {}
    eps: dict[int, ArqEndpoint] = {}
    macs: dict[int, Any] = {}
    t0 = [0.0]

    def server_rx(src: int, payload: bytes) -> None:
        if src in updates and src not in got_update:
            got_update[src] = payload == updates[src]
            t_update[src] = sim.now - t0[0]

    def robot_rx(r: int) -> Callable[[int, bytes], None]:
        def rx(src: int, payload: bytes) -> None:
            if src != 0 or r in got_model:
                return
            got_model[r] = payload == model
            t_model[r] = sim.now - t0[0]
            done_at = sim.now + train_s + rng.random() * train_jitter_s
            left = t0[0] + deadline_s - done_at
            if left > 0:
                sim.schedule(done_at, lambda: eps[r].send(0, updates[r], deadline=left))

        return rx

    def endpoint(node: int, on_message: Callable[[int, bytes], None]) -> ArqEndpoint:
        ep = ArqEndpoint(
            node,
            sim.transmitter(node),
            clock=sim.clock,
            config=arq,
            on_message=on_message,
            msg_id_start=rng.getrandbits(32),
        )
        eps[node] = ep
        return ep

    sep = endpoint(0, server_rx)
    for r in robots:
        endpoint(r, robot_rx(r))
    if mode == "scheduled":
        srv = MacServer(sep, sim.transmitter(0), mac, members=() if register else robots, seed=seed)
        macs[0] = srv
        sim.add(0, srv)
        for r in robots:
            st = MacStation(
                eps[r], sim.transmitter(r), mac, joined=not register, seed=rng.getrandbits(32)
            )
            macs[r] = st
            sim.add(r, st)
    else:
        for node, ep in eps.items():
            sim.add(node, ep)
    for r in out_of_range:
        sim.out_of_range(r)
    for r in robots:
        if loss and r not in out_of_range:
            sim.set_link(0, r, loss=loss)
    out: dict[str, Any] = {"mode": mode, "robots": n_robots, "out_of_range": list(out_of_range)}
    if register:
        in_range = [r for r in robots if r not in out_of_range]
        ok = sim.run_until(lambda: all(macs[r].joined for r in in_range), max_time=600.0)
        out["register"] = {
            "ok": ok,
            "seconds": sim.now,
            "airtime_s": sum(sim.stats.airtime.values()),
            "join_attempts": {r: macs[r].join_attempts for r in in_range},
            "collided_frames": sim.stats.collided_frames,
        }
    if mode == "scheduled" and mac.mcs is not None:
        # link adaptation starts from reports: the robots' idle polls (as after registration)
        # give the server an SNR of every robot's link before the model goes out
        in_range = [r for r in robots if r not in out_of_range]
        sim.run_until(
            lambda: all(macs[0].links.get(r) and macs[0].links[r].down_snr_db for r in in_range),
            max_time=sim.now + 5.0,
        )
        out["warmup_s"] = sim.now
    base = sim.stats.as_dict()
    retx0 = sum(ep.stats.retransmissions for ep in eps.values())
    t0[0] = sim.now
    handle = None
    if mode == "scheduled":
        handle = sim.call(0, lambda: macs[0].broadcast(model, robots, deadline=deadline_s))
    else:
        for r in robots:
            sim.call(0, lambda r=r: sep.send(r, model, deadline=deadline_s))
    everyone = set(robots)
    sim.run_until(
        lambda: set(got_update) >= everyone, max_time=t0[0] + deadline_s, max_wall_s=max_wall_s
    )
    closed_all = set(got_update) >= everyone
    end = sim.now if closed_all else t0[0] + deadline_s
    st = sim.stats.as_dict()
    air = {k: st["airtime"][k] - base["airtime"][k] for k in st["airtime"]}
    own_model = sum(mac.airtime(len(f)) for f in fragment(model, 0, 0, 1, arq.mtu))
    own_updates = sum(
        sum(mac.airtime(len(f)) for f in fragment(updates[r], 0, r, 0, arq.mtu)) for r in got_update
    )
    out.update(
        {
            "closed_s": end - t0[0],
            "all_updates": closed_all,
            "wall_capped": sim.wall_capped,
            "updates_in": sorted(got_update),
            "models_in": sorted(got_model),
            "models_bit_exact": sum(got_model.values()),
            "updates_bit_exact": sum(got_update.values()),
            "airtime_s": air,
            "control_s": air["ack"] + air["mac"],
            "model_own_airtime_s": own_model,
            "updates_own_airtime_s": own_updates,
            "collided_frames": st["collided_frames"] - base["collided_frames"],
            "airtime_by_node_s": {
                n: a - base["airtime_by_node"].get(n, 0.0) for n, a in st["airtime_by_node"].items()
            },
            "frames_by_node": {
                n: k - base["frames_by_node"].get(n, 0) for n, k in st["frames_by_node"].items()
            },
            "lost_collision": st["lost_collision"] - base["lost_collision"],
            "lost_link": st["lost_link"] - base["lost_link"],
            "retransmissions_on_air": st["data_repeats"] - base["data_repeats"],
            "arq_retransmissions": sum(ep.stats.retransmissions for ep in eps.values()) - retx0,
            "model_s": dict(sorted(t_model.items())),
            "update_s": dict(sorted(t_update.items())),
        }
    )
    out["bytes_by_mcs"] = {
        k: v - base["bytes_by_mcs"].get(k, 0) for k, v in st["bytes_by_mcs"].items()
    }
    if mode == "scheduled":
        out["mac"] = macs[0].stats.as_dict()
        out["adaptation"] = macs[0].adaptation()
        out["broadcast"] = {
            "confirmed": sorted(handle.confirmed),
            "passes": handle.passes,
            "frames_sent": handle.frames_sent,
            "count": handle.count,
        }
    return out
