"""Sample-level shared medium: every transmitter on one frequency adds into one sample stream.

One **broker** owns the medium. Every node is a separate process with one OFDM transmitter and
one receiver (a ``MediumPort`` in its flowgraph). Time is *virtual sample time*: the broker
advances it in lockstep, one block of ``block`` samples per step (REQ/REP per block, as in
srsRAN's multi-UE ZeroMQ set-up, GUIDE §7). In each step every node sends the block of samples
its transmitter put out (zeros when idle) and gets back what its receiver hears::

    rx_j[n] = sum_{i != j} g_ij * cfo_ij(n) * (h_ij(n) (*) x_i(n - d_ij(n))) + w_j[n]

per directed link i -> j: amplitude ``g_ij`` from the link's mean SNR (given, or from a distance
and a log-distance path loss), carrier offset ``cfo`` (cycles/sample), timing offset ``delay``
(samples, fractional allowed) and sample-rate offset ``sro_ppm`` (windowed-sinc interpolation),
multipath with Rayleigh or Rician fading (sum-of-sinusoids taps with a power delay profile,
seeded) and, per receiver, unit-power complex white noise ``w_j``. Transmitters are normalised
to unit mean burst power, so a link's ``snr_db`` is the SNR of that link alone. Overlapping
bursts overlap in samples and collide; whether a strong burst is captured over a weak one is
up to the receiver (the stock Schmidl & Cox detector and equalisers). ``half_duplex`` (default)
blanks a node's receiver while its own transmitter is on, as on a real single-antenna radio.

Virtual time: a step is computed only when every attached node has sent its block, so a slow
node makes the whole medium wait and the physics (which samples overlap, the channel, the noise)
does not depend on CPU speed: the same transmitted streams and seed give bit-identical received
streams. A node's frames enter the medium as whole bursts (never split by idle zeros) at the
first block after its modulator finished them. What still runs on wall-clock time is the ARQ
above (timers) and idle pacing: when nothing has been on air for ``idle_blocks`` steps the
broker stops sending noise to the receivers and paces virtual time at ``idle_speed`` x real
time, and while no node has anything to send a step covers ``idle_stride`` blocks, so an idle
medium costs little CPU (a burst after a silence starts at the next stride boundary). Airtime
is counted in virtual samples.

API (small on purpose)::

    cfg = MediumConfig(nodes=(0, 1, 2), seed=1, default=LinkChannel(snr_db=20, fading="rayleigh"))
    broker = MediumBroker(cfg).start()             # thread; or `python -m scaleflu.radio.medium`
    link = make_link("ofdm-shared", 1, broker=broker.address)   # scaleflu.radio.links
    broker.stats()  # virtual time, airtime and collision samples per node, steps
    broker.close()

``MediumModel`` is the numpy engine (no sockets), ``MediumClient`` the raw lockstep client
(tests and benchmarks drive it with hand-made bursts), ``MediumPort`` the GNU Radio end of a
node (tx samples in, rx samples out), ``SharedMediumLink`` the Link (scaleflu.link.api) on it.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import queue
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MEDIUM_ADDRESS",
    "LinkChannel",
    "MediumBroker",
    "MediumClient",
    "MediumConfig",
    "MediumError",
    "MediumModel",
    "MediumPort",
    "SharedMediumLink",
    "broker_stats",
    "frame_burst",
    "main",
    "medium_node",
    "unit_amplitude",
]

logger = logging.getLogger(__name__)

DEFAULT_MEDIUM_ADDRESS = "tcp://127.0.0.1:53100"
MAX_NODE_ID = 0xFFFE
MAX_SAMPLE_ABS = 1e4  # transmitters are normalised to unit power; anything far above is hostile
_INTERP_HALF = 8  # windowed-sinc interpolator: 16 taps
_MAX_DRIFT = 512  # samples of accumulated sample-rate drift before a slip (only while active)
_N_SINUSOIDS = 16  # sum-of-sinusoids fading: sinusoids per tap


class MediumError(RuntimeError):
    """The broker refused a request or did not answer in time."""


@dataclass(frozen=True)
class LinkChannel:
    """Channel of one directed link (transmitter -> receiver)."""

    snr_db: float | None = 20.0  # mean SNR at the receiver; None: from distance_m or positions
    distance_m: float | None = None  # used when snr_db is None
    cfo: float = 0.0  # carrier offset, cycles per sample (1/64 = one subcarrier at FFT 64)
    delay: float = 0.0  # timing offset in samples (>= 0, fractional allowed)
    sro_ppm: float = 0.0  # sample-rate offset of the transmitter's clock, parts per million
    fading: str = "none"  # "none", "rayleigh" or "rician"
    k_factor_db: float = 6.0  # Rician K (line-of-sight over scattered power)
    doppler_hz: float = 2.0  # maximum Doppler of the fading
    pdp: tuple[float, ...] = (1.0,)  # power delay profile, one tap per sample of delay
    in_range: bool = True  # False: the receiver hears nothing of this transmitter

    def validate(self) -> None:
        """Raise ValueError on a setting the model cannot apply."""
        if self.fading not in ("none", "rayleigh", "rician"):
            raise ValueError(f"fading must be none, rayleigh or rician, got {self.fading!r}")
        if self.distance_m is not None and not self.distance_m > 0:
            raise ValueError("distance_m must be > 0")
        if not 0 <= self.delay <= 4096:
            raise ValueError("delay must be within [0, 4096] samples")
        if abs(self.cfo) >= 0.5:
            raise ValueError("cfo must be within (-0.5, 0.5) cycles per sample")
        if abs(self.sro_ppm) > 1000:
            raise ValueError("sro_ppm must be within +-1000")
        if self.doppler_hz < 0:
            raise ValueError("doppler_hz must be >= 0")
        p = np.asarray(self.pdp, dtype=float)
        if p.ndim != 1 or not 1 <= len(p) <= 64 or np.any(p < 0) or not p.sum() > 0:
            raise ValueError("pdp must be 1..64 non-negative powers, not all zero")
        for v in (self.cfo, self.delay, self.sro_ppm, self.k_factor_db, self.doppler_hz):
            if not math.isfinite(v):
                raise ValueError("link channel parameters must be finite")


@dataclass(frozen=True)
class MediumConfig:
    """The medium: sample clock, lockstep block, channels per link, broker address."""

    nodes: tuple[int, ...] = ()  # nodes the first step waits for (empty: start with the first)
    samp_rate: float = 5e6  # samples per virtual second
    block: int = 8192  # samples per lockstep step
    seed: int = 0
    default: LinkChannel = field(default_factory=LinkChannel)
    links: Mapping[tuple[int, int], LinkChannel] = field(default_factory=dict)  # (tx, rx)
    positions: Mapping[int, tuple[float, float]] = field(default_factory=dict)  # metres
    ref_snr_db: float = 40.0  # path loss: SNR at ref_distance_m
    ref_distance_m: float = 1.0
    path_loss_exp: float = 3.0
    noise: bool = True  # unit-power noise at every receiver
    half_duplex: bool = True  # a receiver hears nothing while its own transmitter is on
    address: str = DEFAULT_MEDIUM_ADDRESS
    node_timeout: float = 60.0  # wall seconds a node may take for one step before it is dropped
    idle_blocks: int = 4  # quiet steps after the last burst before receivers stop getting noise
    idle_speed: float = 1.0  # virtual / wall time while idle (<= 0: as fast as possible)
    idle_stride: int = 16  # blocks per step while idle and nobody has anything to send
    # Star of a hub (the edge server): the other nodes only take frames from the hub, so their
    # receivers get no samples while only non-hub nodes transmit (after idle_blocks steps, as
    # for silence). What they hear of the hub, collisions with anyone included, is unchanged;
    # it saves the robots' receivers from demodulating each other's uploads (they would drop
    # them). None: every receiver hears everything.
    hub: int | None = None

    def __post_init__(self) -> None:
        if not 256 <= self.block <= 1 << 20:
            raise ValueError("block must be within [256, 1048576] samples")
        if not self.samp_rate > 0:
            raise ValueError("samp_rate must be > 0")
        if self.node_timeout <= 0 or self.idle_blocks < 1:
            raise ValueError("node_timeout must be > 0 and idle_blocks >= 1")
        if not 1 <= self.idle_stride <= 1024:
            raise ValueError("idle_stride must be within [1, 1024] blocks")
        for n in self.nodes:
            _check_node(n)
        if self.hub is not None:
            _check_node(self.hub)
        self.default.validate()
        for (a, b), ch in self.links.items():
            _check_node(a)
            _check_node(b)
            ch.validate()

    def channel(self, tx: int, rx: int) -> LinkChannel:
        """The channel of link tx -> rx (positions give the distance where no SNR is set)."""
        ch = self.links.get((tx, rx), self.default)
        if ch.snr_db is None and ch.distance_m is None:
            pa, pb = self.positions.get(tx), self.positions.get(rx)
            if pa is None or pb is None:
                raise ValueError(f"link {tx}->{rx} has no snr_db, distance_m or positions")
            ch = replace(ch, distance_m=max(1e-3, math.dist(pa, pb)))
        return ch

    def snr_db(self, ch: LinkChannel) -> float:
        """Mean SNR of a link: given, or log-distance path loss from ``ref_snr_db``."""
        if ch.snr_db is not None:
            return float(ch.snr_db)
        d = max(float(ch.distance_m or self.ref_distance_m), 1e-3)
        return self.ref_snr_db - 10 * self.path_loss_exp * math.log10(d / self.ref_distance_m)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MediumConfig:
        """From plain data (YAML/JSON): links as {"tx->rx": {...}}, unknown keys rejected.

        Every error is a ValueError with the offending key (the data may come from a file).
        """
        if not isinstance(d, Mapping):
            raise ValueError("medium config must be a mapping")
        d = dict(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown medium keys: {sorted(unknown)}")
        try:
            if "default" in d:
                d["default"] = _link_channel(d["default"])
            if "links" in d:
                links = {}
                for k, v in _mapping(d["links"], "links").items():
                    a, sep, b = str(k).partition("->")
                    if not sep:
                        raise ValueError(f"links: key {k!r} is not 'tx->rx'")
                    links[(_check_node(int(a)), _check_node(int(b)))] = _link_channel(v)
                d["links"] = links
            if "positions" in d:
                pos = {}
                for k, v in _mapping(d["positions"], "positions").items():
                    xy = tuple(float(x) for x in v)
                    if len(xy) != 2 or not all(math.isfinite(x) for x in xy):
                        raise ValueError(f"positions: node {k} needs finite [x, y]")
                    pos[_check_node(int(k))] = xy
                d["positions"] = pos
            if "nodes" in d:
                d["nodes"] = tuple(_check_node(int(n)) for n in d["nodes"])
            if d.get("hub") is not None:
                if isinstance(d["hub"], bool) or not isinstance(d["hub"], int):
                    raise ValueError(f"hub must be a node id, got {d['hub']!r}")
                d["hub"] = _check_node(d["hub"])
            for key, typ in (
                ("samp_rate", float),
                ("block", int),
                ("seed", int),
                ("ref_snr_db", float),
                ("ref_distance_m", float),
                ("path_loss_exp", float),
                ("node_timeout", float),
                ("idle_blocks", int),
                ("idle_speed", float),
                ("idle_stride", int),
            ):
                if key in d:
                    if isinstance(d[key], bool) or not isinstance(d[key], (int, float)):
                        raise ValueError(f"{key} must be a number, got {d[key]!r}")
                    d[key] = typ(d[key])
            for key in ("noise", "half_duplex"):
                if key in d and not isinstance(d[key], bool):
                    raise ValueError(f"{key} must be true or false")
            if "address" in d and not isinstance(d["address"], str):
                raise ValueError("address must be a string like tcp://127.0.0.1:53100")
            return cls(**d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"medium config: {exc}") from None


def _mapping(v: Any, what: str) -> Mapping[Any, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} must be a mapping")
    return v


def _link_channel(d: Any) -> LinkChannel:
    d = _mapping(d, "a link channel")
    known = {f.name for f in fields(LinkChannel)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown link channel keys: {sorted(unknown)}")
    d = dict(d)
    for key in ("snr_db", "distance_m", "cfo", "delay", "sro_ppm", "k_factor_db", "doppler_hz"):
        v = d.get(key)
        if v is None and key in ("snr_db", "distance_m"):
            continue
        if key in d and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{key} must be a number, got {v!r}")
        if key in d:
            d[key] = float(v)
            if not math.isfinite(d[key]):
                raise ValueError(f"{key} must be finite")
    if "in_range" in d and not isinstance(d["in_range"], bool):
        raise ValueError("in_range must be true or false")
    if "pdp" in d:
        d["pdp"] = tuple(float(x) for x in d["pdp"])
    ch = LinkChannel(**d)
    ch.validate()
    return ch


def _check_node(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= MAX_NODE_ID:
        raise ValueError(f"node id must be an integer in [0, {MAX_NODE_ID}], got {n!r}")
    return int(n)


# -- the numpy engine ------------------------------------------------------------------------
class _Link:
    """State of one directed link: resampling drift, fading sinusoids, gain."""

    def __init__(self, cfg: MediumConfig, tx: int, rx: int) -> None:
        ch = cfg.channel(tx, rx)
        ch.validate()
        self.ch = ch
        self.tx, self.rx = tx, rx
        self.snr_db = cfg.snr_db(ch)
        self.amp = 0.0 if not ch.in_range else 10 ** (self.snr_db / 20.0)
        p = np.asarray(ch.pdp, dtype=float)
        self.tap_amp = np.sqrt(p / p.sum())
        self.n_taps = len(p)
        self.eps = ch.sro_ppm * 1e-6
        self.anchor = 0  # absolute sample where the current drift started (reset when idle)
        self.fractional = ch.delay != int(ch.delay) or self.eps != 0.0
        rng = np.random.default_rng([cfg.seed, tx, rx, 0x5EED])
        m = _N_SINUSOIDS
        # Sum of sinusoids (Zheng & Xiao): random arrival angles and phases per tap.
        self.alpha = (2 * np.pi * (np.arange(m) + rng.random((self.n_taps, m))) / m) - np.pi
        self.phi_i = rng.uniform(-np.pi, np.pi, (self.n_taps, m))
        self.phi_q = rng.uniform(-np.pi, np.pi, (self.n_taps, m))
        self.los_theta = rng.uniform(-np.pi, np.pi)
        self.los_phi = rng.uniform(-np.pi, np.pi)
        self.wd = 2 * np.pi * ch.doppler_hz / cfg.samp_rate  # rad per sample
        k = 10 ** (ch.k_factor_db / 10.0) if ch.fading == "rician" else 0.0
        self.k_los = math.sqrt(k / (k + 1))
        self.k_nlos = math.sqrt(1 / (k + 1))
        self.history = self.n_taps - 1 + int(math.ceil(ch.delay)) + _INTERP_HALF + _MAX_DRIFT + 2

    def taps_at(self, n: float) -> np.ndarray:
        """Complex tap gains at absolute sample ``n`` (unit mean power in total)."""
        if self.ch.fading == "none":
            return self.tap_amp.astype(np.complex128)
        wt = self.wd * n
        c = np.cos(self.alpha)
        re, im = np.cos(wt * c + self.phi_i), np.sin(wt * c + self.phi_q)
        h = np.zeros(self.n_taps, np.complex128)
        for m in range(_N_SINUSOIDS):  # fixed summation order (bit-exact across runs)
            h += re[:, m] + 1j * im[:, m]
        h /= math.sqrt(_N_SINUSOIDS)
        h = self.k_nlos * h
        if self.k_los > 0:
            h[0] += self.k_los * np.exp(1j * (wt * math.cos(self.los_theta) + self.los_phi))
        return self.tap_amp * h


def _sinc_gather(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Samples of ``buf`` at fractional positions ``pos`` (16-tap Blackman-windowed sinc)."""
    base = np.floor(pos).astype(np.int64)
    frac = pos - base
    k = np.arange(-_INTERP_HALF + 1, _INTERP_HALF + 1)
    t = frac[:, None] - k[None, :]
    w = np.sinc(t) * (
        0.42 + 0.5 * np.cos(np.pi * t / _INTERP_HALF) + 0.08 * np.cos(2 * np.pi * t / _INTERP_HALF)
    )
    w = w.astype(np.float32)
    out = np.zeros(len(pos), np.complex64)
    for c in range(len(k)):  # element-wise sums: bit-exact whatever the memory alignment
        out += buf[np.clip(base + k[c], 0, len(buf) - 1)] * w[:, c]
    return out


class MediumModel:
    """The medium without sockets: ``step({node: tx block}) -> {node: rx block}``.

    Deterministic: the same node set, transmitted blocks and seed give bit-identical output.
    """

    def __init__(self, config: MediumConfig) -> None:
        self.cfg = config
        self.B = config.block
        self.t = 0  # absolute sample index of the next block
        self.nodes: list[int] = []
        self._hist: dict[int, np.ndarray] = {}
        self._links: dict[tuple[int, int], _Link] = {}
        self._noise: dict[int, np.random.Generator] = {}
        self.airtime = {}  # node -> samples its transmitter was on
        self.collision_samples = 0  # samples where two or more transmitters were on
        self.active_samples = 0  # samples where at least one transmitter was on
        self.steps = 0
        self.quiet_steps = 0  # consecutive steps with no transmitter on
        self.deaf_steps: dict[int, int] = {}  # per receiver: consecutive steps it heard no one
        self.first_active: int | None = None  # absolute sample of the first transmitted sample
        self.last_active: int | None = None  # ... and one past the last

    def add(self, node: int) -> None:
        """Attach a node (from the next step on)."""
        node = _check_node(node)
        if node in self._hist:
            return
        for other in self.nodes:
            self._links[(node, other)] = _Link(self.cfg, node, other)
            self._links[(other, node)] = _Link(self.cfg, other, node)
        self.nodes.append(node)
        self.nodes.sort()
        self._hist[node] = np.zeros(0, np.complex64)
        for n in self.nodes:  # a transmitter keeps the history its longest link needs
            need = max([64] + [lk.history for (a, _), lk in self._links.items() if a == n])
            have = self._hist[n]
            if len(have) < need:
                self._hist[n] = np.concatenate([np.zeros(need - len(have), np.complex64), have])
        self._noise[node] = np.random.default_rng([self.cfg.seed, node, 0x401E])
        self.airtime.setdefault(node, 0)

    def remove(self, node: int) -> None:
        """Detach a node."""
        if node not in self._hist:
            return
        self.nodes.remove(node)
        del self._hist[node]
        del self._noise[node]
        self.deaf_steps.pop(node, None)
        for key in [k for k in self._links if node in k]:
            del self._links[key]

    def link(self, tx: int, rx: int) -> _Link:
        """State of link tx -> rx (its ``snr_db``, ``amp``, ``ch``)."""
        return self._links[(tx, rx)]

    def step(self, tx: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Advance one block: every attached node's transmitted block in, received blocks out."""
        B = self.B
        if set(tx) != set(self.nodes):
            raise ValueError(f"step needs a block from every node {self.nodes}, got {sorted(tx)}")
        blocks: dict[int, np.ndarray] = {}
        on: dict[int, np.ndarray] = {}
        for n in self.nodes:
            x = np.asarray(tx[n])
            if x.shape != (B,):
                raise ValueError(f"node {n}: block of {x.shape} samples, want ({B},)")
            x = x.astype(np.complex64, copy=False)
            blocks[n] = x
            on[n] = x != 0
        count = np.zeros(B, np.int32)
        for n in self.nodes:
            c = int(np.count_nonzero(on[n]))
            self.airtime[n] += c
            if c:
                count += on[n]
        self.collision_samples += int(np.count_nonzero(count >= 2))
        busy = np.flatnonzero(count)
        if len(busy):
            self.active_samples += len(busy)
            if self.first_active is None:
                self.first_active = self.t + int(busy[0])
            self.last_active = self.t + int(busy[-1]) + 1
        bufs = {n: np.concatenate([self._hist[n], blocks[n]]) for n in self.nodes}
        out: dict[int, np.ndarray] = {}
        for j in self.nodes:
            y = np.zeros(B, np.complex64)
            for i in self.nodes:
                if i != j:
                    self._add_link(self._links[(i, j)], bufs[i], y)
            if self.cfg.noise:
                g = self._noise[j]
                w = g.standard_normal(2 * B, dtype=np.float32).view(np.complex64)
                y += w * np.float32(math.sqrt(0.5))
            if self.cfg.half_duplex and j in on and on[j].any():
                y[on[j]] = 0
            out[j] = y
        for j in self.nodes:
            # heard: another in-range transmitter was on while j's own receiver was not blanked
            heard = False
            hub = self.cfg.hub
            for i in self.nodes:
                if i == j or self._links[(i, j)].amp == 0.0 or not on[i].any():
                    continue
                if hub is not None and hub not in (i, j):
                    continue  # a robot listens to the hub only (MediumConfig.hub)
                if self.cfg.half_duplex and on[j].any():
                    heard = heard or bool(np.any(on[i] & ~on[j]))
                else:
                    heard = True
            self.deaf_steps[j] = 0 if heard else self.deaf_steps.get(j, 0) + 1
        for n in self.nodes:
            self._hist[n] = bufs[n][-len(self._hist[n]) :]
        self.t += B
        self.steps += 1
        self.quiet_steps = 0 if int(np.count_nonzero(count)) else self.quiet_steps + 1
        return out

    def can_skip(self) -> bool:
        """Whether the quiet steps cover every link's memory (no burst is still arriving)."""
        return self.quiet_steps * self.B >= max([0] + [lk.history for lk in self._links.values()])

    def skip(self, blocks: int) -> None:
        """Advance ``blocks`` silent blocks at once (every transmitter idle, receivers get
        nothing); only when can_skip()."""
        if not self.can_skip():
            raise RuntimeError("skip() only on a quiet medium")
        self.t += blocks * self.B
        self.steps += blocks
        self.quiet_steps += blocks
        for j in self.nodes:
            self.deaf_steps[j] = self.deaf_steps.get(j, 0) + blocks

    def _add_link(self, lk: _Link, buf: np.ndarray, y: np.ndarray) -> None:
        B = self.B
        if lk.amp == 0.0:
            return
        span = lk.history + B
        if not buf[-span:].any():
            lk.anchor = self.t  # idle link: the drift restarts at zero (no slip within a burst)
            return
        L = lk.n_taps
        h0 = len(buf) - B  # index of this block's first sample in buf
        n = np.arange(-(L - 1), B, dtype=np.float64)  # relative output positions incl. FIR memory
        if lk.fractional:
            # Causal sample-rate offset: a faster transmitter clock (eps > 0) reads ahead, so
            # those links carry a fixed extra lag of _MAX_DRIFT samples that the drift uses up.
            drift = lk.eps * (self.t + n - lk.anchor)
            if abs(drift[-1]) > _MAX_DRIFT:  # only after minutes of continuous activity
                lk.anchor = self.t
                drift = lk.eps * (self.t + n - lk.anchor)
            base = lk.ch.delay + (_MAX_DRIFT if lk.eps > 0 else 0)
            pos = h0 + n - base + drift
            s = _sinc_gather(buf, pos).astype(np.complex64)
        else:
            d = int(lk.ch.delay)
            s = buf[h0 - (L - 1) - d : h0 + B - d]
        if L == 1 and lk.ch.fading == "none":
            z = s * np.complex64(lk.tap_amp[0])
        else:
            h_a = lk.taps_at(self.t)
            h_b = lk.taps_at(self.t + B)
            frac = np.arange(B, dtype=np.float32) / np.float32(B)
            z = np.zeros(B, np.complex64)
            for tap in range(L):  # contiguous 1-D arrays only: bit-exact across runs
                g = np.complex64(h_a[tap]) * (1 - frac) + np.complex64(h_b[tap]) * frac
                z += g * np.ascontiguousarray(s[L - 1 - tap : L - 1 - tap + B])
        if lk.ch.cfo:
            ph = 2 * np.pi * ((lk.ch.cfo * (self.t + np.arange(B, dtype=np.float64))) % 1.0)
            z *= np.exp(1j * ph).astype(np.complex64)
        y += np.complex64(lk.amp) * z

    def stats(self) -> dict[str, Any]:
        """Virtual time and airtime counters (samples and seconds)."""
        sr = self.cfg.samp_rate
        return {
            "steps": self.steps,
            "samples": self.t,
            "virtual_s": self.t / sr,
            "samp_rate": sr,
            "block": self.B,
            "nodes": list(self.nodes),
            "airtime_samples": {str(k): v for k, v in self.airtime.items()},
            "airtime_s": {str(k): v / sr for k, v in self.airtime.items()},
            "active_samples": self.active_samples,
            "collision_samples": self.collision_samples,
            "collision_s": self.collision_samples / sr,
            "first_active": self.first_active,
            "last_active": self.last_active,
        }


# -- broker and client (ZeroMQ ROUTER / DEALER) ----------------------------------------------
# Messages (multipart): request [kind, header, payload]; kinds:
#   b"J" join:  header = u16 node              -> b"W" welcome: u32 block, f64 samp_rate, u64 step
#   b"S" step:  header = u64 step, u8 flags    -> b"R" rx: u64 step, u8 flags (1 = idle), samples
#               payload = block complex64 samples, or empty = all zeros
#   b"L" leave -> b"B";  b"Q" stats -> b"T" JSON;  any error -> b"E" text
_JOIN = struct.Struct("<H")
_WELCOME = struct.Struct("<IdQ")
_STEP = struct.Struct("<QB")
_FLAG_IDLE = 1


class MediumBroker:
    """Owns the medium: collects every node's block, computes the step, answers each node."""

    def __init__(self, config: MediumConfig, context: Any = None) -> None:
        import zmq

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
        self._pending: dict[int, np.ndarray] = {}
        self._silent: set[int] = set()  # nodes whose pending block is all zeros (empty payload)
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
        self._zero = np.zeros(config.block, np.complex64)

    def start(self) -> MediumBroker:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve, name="medium-broker", daemon=True)
        self._thread.start()
        return self

    def serve(self) -> None:
        """Serve until close() (blocking)."""
        import zmq

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
                self._pending.pop(node, None)
                self._silent.discard(node)
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
        step, _flags = _STEP.unpack(rest[0])
        if step != self.model.steps:
            return self._error(ident, f"step {step} is not the current step {self.model.steps}")
        payload = rest[1]
        if len(payload) == 0:
            x = self._zero
        elif len(payload) == 8 * self.cfg.block:
            x = np.frombuffer(payload, np.complex64)
            if not np.isfinite(x).all() or np.abs(x).max() > MAX_SAMPLE_ABS:
                return self._error(ident, "samples must be finite and bounded")
        else:
            return self._error(ident, f"a step carries 0 or {8 * self.cfg.block} bytes")
        if node in self._pending:
            return self._error(ident, "step sent twice")
        self._pending[node] = x
        if len(payload) == 0:
            self._silent.add(node)
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        self._maybe_step()

    def _maybe_step(self) -> None:
        if not self._started or not self._pending:
            return
        if set(self._pending) != set(self.model.nodes):
            return
        idle_before = self.model.quiet_steps >= self.cfg.idle_blocks
        deaf_before = {
            n: self.model.deaf_steps.get(n, 0) >= self.cfg.idle_blocks for n in self._pending
        }
        all_silent = self._silent >= set(self._pending)
        self._silent = set()
        with self._lock:
            if idle_before and all_silent and self.cfg.idle_stride > 1 and self.model.can_skip():
                self.model.skip(self.cfg.idle_stride)  # nobody sends: jump, nobody hears
                out = dict.fromkeys(self._pending, None)
            else:
                out = self.model.step(self._pending)
        self._pending = {}
        self._waiting_since = None
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
            deaf = deaf_before[node] and self.model.deaf_steps.get(node, 0) >= self.cfg.idle_blocks
            quiet = idle or deaf or y is None
            header = _STEP.pack(self.model.steps, _FLAG_IDLE if quiet else 0)
            self._reply(self._ident[node], b"R", header, b"" if quiet else y.tobytes())

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

    def _leave(self, node: int) -> None:
        ident = self._ident.pop(node, None)
        if ident is not None:
            self._by_ident.pop(ident, None)
        self._pending.pop(node, None)
        self._silent.discard(node)
        with self._lock:
            self.model.remove(node)
        logger.info("medium: node %d left at step %d", node, self.model.steps)
        self._maybe_step()

    def _check_timeouts(self) -> None:
        if self._waiting_since is None:
            return
        if time.monotonic() - self._waiting_since < self.cfg.node_timeout:
            return
        late = [n for n in self.model.nodes if n not in self._pending]
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


class MediumClient:
    """One node's lockstep connection to the broker (raw samples; MediumPort wraps it)."""

    def __init__(self, node_id: int, address: str = DEFAULT_MEDIUM_ADDRESS, timeout: float = 120.0):
        import zmq

        self.node_id = _check_node(node_id)
        self.address = address
        self.timeout = timeout
        self.stopping = threading.Event()  # set by MediumPort to end a pending wait
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        kind, parts = self._call(b"J", _JOIN.pack(self.node_id))
        if kind != b"W":
            raise MediumError(f"join refused: {parts}")
        self.block, self.samp_rate, self.step_no = _WELCOME.unpack(parts[0])
        self.idle = False

    def _call(self, kind: bytes, *parts: bytes) -> tuple[bytes, list[bytes]]:
        self._sock.send_multipart([kind, *parts], copy=False)
        end = time.monotonic() + self.timeout
        while not self._sock.poll(200):  # short slices: stop() ends a wait within 0.2 s
            if self.stopping.is_set():
                raise MediumError("stopped")
            if time.monotonic() > end:
                raise MediumError(f"no answer from the medium broker at {self.address}")
        reply = self._sock.recv_multipart()
        if reply[0] == b"E":
            raise MediumError(reply[1].decode(errors="replace") if len(reply) > 1 else "error")
        return reply[0], reply[1:]

    def exchange(self, tx: np.ndarray | None) -> np.ndarray | None:
        """Send this step's block (None = zeros); the received block, or None while idle."""
        payload = b"" if tx is None else np.ascontiguousarray(tx, np.complex64).tobytes()
        kind, parts = self._call(b"S", _STEP.pack(self.step_no, 0), payload)
        if kind != b"R" or len(parts) != 2:
            raise MediumError("bad reply from the medium broker")
        self.step_no, flags = _STEP.unpack(parts[0])
        self.idle = bool(flags & _FLAG_IDLE)
        if self.idle:
            return None
        return np.frombuffer(parts[1], np.complex64)

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
    import zmq

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


# -- the GNU Radio end of a node ---------------------------------------------------------------
@functools.cache
def _gr_blocks() -> tuple[type, type]:
    from gnuradio import gr

    class tx_tap(gr.sync_block):  # noqa: N801 - GNU Radio block naming
        """Complex in: keeps whole bursts (delimited by ``packet_len`` tags) for the medium."""

        def __init__(self, len_tag_key: str = "packet_len") -> None:
            gr.sync_block.__init__(self, "medium_tx_tap", [np.complex64], None)
            import pmt

            self._key = pmt.intern(len_tag_key)
            self._lock = threading.Lock()
            self._chunks: list[np.ndarray] = []
            self._held = 0  # samples in _chunks
            self._got = 0  # samples received in total
            self._ready_to = 0  # absolute end of the last complete burst
            self._taken = 0  # absolute samples handed to the medium
            self._ends: list[int] = []
            self.bursts = 0

        def work(self, input_items, output_items):  # noqa: D102
            import pmt

            x = input_items[0]
            n = len(x)
            start = self.nitems_read(0)
            for tag in self.get_tags_in_window(0, 0, n, self._key):
                self._ends.append(int(tag.offset) + int(pmt.to_long(tag.value)))
            with self._lock:
                self._chunks.append(x.copy())
                self._held += n
                self._got = start + n
                while self._ends and self._ends[0] <= self._got:
                    self._ready_to = self._ends.pop(0)
                    self.bursts += 1
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
            return done

    return tx_tap, rx_feed


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
    ) -> None:
        tx_tap, rx_feed = _gr_blocks()
        self.client = MediumClient(node_id, address, timeout)
        self.block = self.client.block
        self.samp_rate = self.client.samp_rate
        self.tx_sink = tx_tap()
        self.rx_source = rx_feed(rx_depth)
        self._frames_built = frames_built
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.steps = 0
        self.tx_samples = 0
        # at most this many blocks handed to the receiver and not yet taken in by the flowgraph
        # before the next step (None: only the queue's depth bounds it). Small values keep a
        # node's decoding latency, in virtual time, a few blocks whatever the CPU load.
        self.rx_lag = rx_lag
        self._rx_queued = 0  # samples put in the receiver's queue
        # lockstep waits that ran out (30 s wall) and went on anyway: the transmitter never
        # reported a frame built / the receiver never caught up (each one stalls the medium)
        self.stalls = {"tx": 0, "rx": 0}
        # frames the receiver decoded that the node has not acted on yet (SharedMediumLink: the
        # receiver's frame count minus the frames its ARQ/MAC processed): the lockstep waits for
        # them, so a node's answer to a frame (a robot's to its grant) does not depend on how
        # fast its Python threads run
        self.rx_pending: Any = None
        self.frames_posted: Any = None  # frames handed to the transmitter (link_arq frames_out)
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
        while time.monotonic() < deadline and not self._stop.is_set():
            posted = None if self.frames_posted is None else int(self.frames_posted())
            built = int(self._frames_built())
            if posted is not None and built != posted and time.monotonic() < posted_deadline:
                # frames handed to the builder and not built yet (or a burst being posted now):
                # a train would otherwise go out split by idle blocks, past its grant window
                time.sleep(0.001)
                continue
            if self.tx_sink.bursts >= built and not self.tx_sink.pending_bursts():
                return
            time.sleep(0.001)
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
        deadline = time.monotonic() + 30.0
        while (
            self._rx_queued - self.rx_source.fed > limit or pending() > 0
        ) and not self._stop.is_set():
            if time.monotonic() > deadline:
                self._stalled(
                    "rx",
                    f"{self._rx_queued - self.rx_source.fed} samples queued, "
                    f"{pending()} frames decoded and not processed",
                )
                return
            time.sleep(0.001)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._flush_wait()
                self._rx_wait()
                x = self.tx_sink.take(self.block)
                if x is not None:
                    self.tx_samples += int(np.count_nonzero(x))
                y = self.client.exchange(x)
                self.steps += 1
                for cb in self.on_step:
                    cb()
                if y is None:
                    continue
                while not self._stop.is_set():
                    try:
                        self.rx_source.q.put(y, timeout=0.1)
                        self._rx_queued += len(y)
                        break
                    except queue.Full:
                        continue
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
    from .links import PhyConfig, burst_power

    return 1.0 / math.sqrt(burst_power(phy or PhyConfig()))


@functools.cache
def _medium_node_class() -> type:
    from gnuradio import gr

    class medium_node(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
        """GRC block: TX samples in ("packet_len" tags) -> medium -> RX out.

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
            from gnuradio import blocks

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

    return medium_node


def medium_node(node_id: int = 0, broker: str = DEFAULT_MEDIUM_ADDRESS, **kw: Any):
    """GRC block "Shared Medium Node" (see _medium_node_class): TX in, the medium's RX out."""
    return _medium_node_class()(node_id, broker, **kw)


def frame_burst(payload: bytes, src: int, phy: Any = None, dst: int = 0xFFFF) -> np.ndarray:
    """The samples one frame puts on air from ``src`` (unit mean burst power, with padding).

    Runs the node's own transmitter (ofdm_link_tx) once; for tests and benchmarks that place
    bursts by hand with a MediumClient.
    """
    import pmt
    from gnuradio import blocks, gr

    from .links import PhyConfig, burst_power
    from .ofdm import ofdm_link_tx, samples_per_frame

    phy = phy or PhyConfig()
    if not 1 <= len(payload) <= phy.mtu - 26:
        raise ValueError(f"payload must be 1..{phy.mtu - 26} bytes")
    tx = ofdm_link_tx(
        mtu=phy.mtu,
        src=src,
        dst=dst,
        fft_len=phy.fft_len,
        cp_len=phy.cp_len,
        bps_header=phy.bps_header,
        bps_payload=phy.bps_payload,
        scramble_bits=phy.scramble_bits,
        post_padding=phy.post_padding,
        amplitude=1.0 / math.sqrt(burst_power(phy)),
        min_output_buffer=phy.min_output_buffer,
    )
    tb = gr.top_block()
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    tb.start()
    data = np.frombuffer(payload, np.uint8)
    tx.framer.to_basic_block()._post(
        pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(data), data))
    )
    want = samples_per_frame(
        len(payload) + 26, phy.fft_len, phy.cp_len, phy.bps_payload, phy.post_padding
    )
    deadline = time.monotonic() + 10
    while len(sink.data()) < want and time.monotonic() < deadline:
        time.sleep(0.005)
    tb.stop()
    tb.wait()
    x = np.asarray(sink.data(), dtype=np.complex64)
    if len(x) < want:
        raise RuntimeError("the transmitter did not put out the burst")
    return x


@functools.cache
def _make_shared_link_class() -> type:
    from gnuradio import gr

    from .links import GrLink, PhyConfig, _arq_block, burst_power

    class _SharedMediumLink(GrLink):
        """One node on the shared medium: link_arq -> OFDM tx -> medium -> OFDM rx -> link_arq."""

        def __init__(
            self,
            node_id: int,
            broker: str = DEFAULT_MEDIUM_ADDRESS,
            phy: PhyConfig | None = None,
            timeout: float = 120.0,
            virtual_clock: bool = True,
            rx_lag: int | None = 1,
            **arq_opts: Any,
        ) -> None:
            self.phy = phy or PhyConfig()
            self.tb = gr.top_block(f"shared_medium_node_{node_id}")
            arq = _arq_block(node_id, self.phy, arq_opts)
            self.tx = self.phy.tx(node_id, amplitude=1.0 / math.sqrt(burst_power(self.phy)))
            # whole checked frames into link_arq (no per-frame re-encode in Python); the
            # parser counts a frame in frames_ok() exactly when it publishes it, in either
            # mode, so rx_pending below stays exact
            # gr-digital's demux here, not ofdm_burst_demux: the medium's receivers hear noise
            # and others' bursts between their frames, where ours is not validated (docs/link.md
            # 8.3 item 5: a `make demo` with it lost a robot's registration)
            self.rx = self.phy.rx(node_id, raw_frames=True, blocking_demux=False)
            self.port = MediumPort(
                node_id, broker, timeout, frames_built=self.tx.frames_built, rx_lag=rx_lag
            )
            self.tb.msg_connect(arq, "frames_out", self.tx, "in")
            self.tb.connect(self.tx, self.port.tx_sink)
            self.tb.connect(self.port.rx_source, self.rx)
            self.tb.msg_connect(self.rx, "out", arq, "frames_in")
            super().__init__(arq, on_close=self._stop)
            self.virtual_clock = virtual_clock
            if virtual_clock:  # ARQ timers (and a MAC put under the link) on the medium's time
                arq.link.set_clock(self.port.virtual_time)
                self.port.on_step.append(arq.link.clock_advanced)
            self.port.on_error = self._medium_lost
            self.port.rx_pending = lambda: self.rx.frames_ok() - arq.frames_done
            link_lock = arq.link._lock

            def frames_posted() -> int:
                # under the link's lock: the MAC posts a whole downlink burst or grant answer
                # under it, so the port never starts a train the MAC is still posting (a train
                # split by idle blocks ended after the window the grant announced)
                with link_lock:
                    return arq.frames_out_count

            self.port.frames_posted = frames_posted
            self.tb.start()
            self.port.start()

        def _wait_limit(self, timeout: float | None) -> float | None:
            # On the medium's clock the ARQ ends every send at its deadline in virtual time,
            # however slowly the medium runs; a lost medium cancels the sends (_medium_lost).
            if self.virtual_clock:
                return None
            return super()._wait_limit(timeout)

        def _medium_lost(self, exc: BaseException) -> None:
            link = self.arq.link
            with link._wake:
                link.endpoint.cancel_all(f"medium lost: {exc}")
                link._wake.notify_all()

        def virtual_time(self) -> float:
            """The medium's virtual time in seconds (see MediumPort.virtual_time)."""
            return self.port.virtual_time()

        def medium_stats(self) -> dict[str, Any]:
            """The broker's counters: virtual time, airtime per node, collided samples."""
            return broker_stats(self.port.client.address, timeout=2.0)

        def counters(self) -> dict[str, int]:
            """Receiver counters and lockstep steps of this node."""
            return {
                "frames_ok": self.rx.frames_ok(),
                "crc_errors": self.rx.crc_errors(),
                "malformed": self.rx.malformed(),
                "headers_rejected": self.rx.headers_rejected(),
                "steps": self.port.steps,
                "tx_samples": self.port.tx_samples,
                "stalls_tx": self.port.stalls["tx"],
                "stalls_rx": self.port.stalls["rx"],
            }

        def _stop(self) -> None:
            self.port.close()
            self.tb.stop()
            self.tb.wait()

    return _SharedMediumLink


def SharedMediumLink(node_id: int, broker: str = DEFAULT_MEDIUM_ADDRESS, **opts: Any):  # noqa: N802
    """A Link (scaleflu.link.api) of ``node_id`` on the medium of the broker at ``broker``.

    Options: ``phy`` (PhyConfig), ``timeout`` (wall seconds to wait for the broker),
    ``virtual_clock`` (True: the ARQ's timers, send deadlines and a MAC put under the link run
    on the medium's virtual time, so a slow machine runs slower, not differently), ARQ options
    (window, initial_rto, deadline, ...). Also ``make_link("ofdm-shared", ...)``.
    """
    return _make_shared_link_class()(node_id, broker, **opts)


# -- command line: run a broker ----------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scaleflu.radio.medium --nodes 0,1,2 [--config medium.json]``: serve a medium."""
    ap = argparse.ArgumentParser(prog="python -m scaleflu.radio.medium", description=main.__doc__)
    ap.add_argument("--nodes", default="", help="comma-separated node ids the first step waits for")
    ap.add_argument("--address", default=DEFAULT_MEDIUM_ADDRESS)
    ap.add_argument("--config", help="JSON or YAML file with MediumConfig keys")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--stats-every", type=float, default=0.0, help="log counters every N s")
    args = ap.parse_args(argv)
    d: dict[str, Any] = {}
    if args.config:
        import yaml

        try:
            with open(args.config, encoding="utf-8") as f:
                d = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise SystemExit(f"medium config: {exc}") from None
        if not isinstance(d, Mapping):
            raise SystemExit(f"{args.config}: a mapping of MediumConfig keys expected")
    d["address"] = args.address
    if args.nodes:
        d["nodes"] = [int(x) for x in args.nodes.split(",") if x.strip()]
    if args.seed is not None:
        d["seed"] = args.seed
    try:
        cfg = MediumConfig.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"medium config: {exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        broker = MediumBroker(cfg).start()
    except Exception as exc:  # noqa: BLE001 - e.g. address in use: one line, not a traceback
        raise SystemExit(f"medium broker: {exc}") from None
    try:
        while True:
            time.sleep(args.stats_every or 3600)
            if args.stats_every:
                logger.info("medium: %s", json.dumps(broker.stats()))
    except KeyboardInterrupt:
        pass
    finally:
        broker.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
