"""The medium's physics without sockets: ``MediumModel.step({node: tx block}) -> {node: rx}``.

Every node's transmitted block adds into what every other node's receiver hears::

    rx_j[n] = sum_{i != j} g_ij * cfo_ij(n) * (h_ij(n) (*) x_i(n - d_ij(n))) + w_j[n]

per directed link i -> j: amplitude ``g_ij`` from the link's mean SNR (given, or from a distance
and a log-distance path loss), carrier offset ``cfo`` (cycles/sample), timing offset ``delay``
(samples, fractional allowed) and sample-rate offset ``sro_ppm`` (windowed-sinc interpolation),
multipath with Rayleigh or Rician fading (sum-of-sinusoids taps with a power delay profile,
seeded) and, per receiver, unit-power complex white noise ``w_j``. Transmitters are normalised
to unit mean burst power, so a link's ``snr_db`` is the SNR of that link alone. Overlapping
bursts overlap in samples and collide; whether a strong burst is captured over a weak one is
up to the receiver. ``half_duplex`` blanks a node's receiver while its own transmitter is on.
Deterministic: the same node set, transmitted blocks and seed give bit-identical output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from scaleflu.link.fading import FadingTrace

from .config import MediumConfig, _check_node

_INTERP_HALF = 8  # windowed-sinc interpolator: 16 taps


_MAX_DRIFT = 512  # samples of accumulated sample-rate drift before a slip (only while active)


class _Link:
    """State of one directed link: resampling drift, fading taps (``FadingTrace``), gain."""

    def __init__(self, cfg: MediumConfig, tx: int, rx: int) -> None:
        ch = cfg.channel(tx, rx)
        ch.validate()
        self.ch = ch
        self.tx, self.rx = tx, rx
        self.snr_db = cfg.snr_db(ch)
        self.amp = 0.0 if not ch.in_range else 10 ** (self.snr_db / 20.0)
        self.fade = FadingTrace(
            cfg.seed, tx, rx, ch.fading, ch.k_factor_db, ch.doppler_hz, ch.pdp, cfg.samp_rate
        )
        self.tap_amp = self.fade.tap_amp
        self.n_taps = self.fade.n_taps
        self.eps = ch.sro_ppm * 1e-6
        self.anchor = 0  # absolute sample where the current drift started (reset when idle)
        self.fractional = ch.delay != int(ch.delay) or self.eps != 0.0
        self.history = self.n_taps - 1 + int(math.ceil(ch.delay)) + _INTERP_HALF + _MAX_DRIFT + 2

    def taps_at(self, n: float) -> np.ndarray:
        """Complex tap gains at absolute sample ``n`` (unit mean power in total)."""
        return self.fade.taps_at(n)


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
        self.collisions: list[tuple[float, list[int], int]] = []  # (virtual s, nodes, samples)
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
        collided = int(np.count_nonzero(count >= 2))
        self.collision_samples += collided
        if collided and len(self.collisions) < 64:  # when and who, for the stats
            who = [n for n in self.nodes if on[n].any()]
            self.collisions.append((self.t / self.cfg.samp_rate, who, collided))
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
            "collisions": [list(c) for c in self.collisions],
            "first_active": self.first_active,
            "last_active": self.last_active,
        }
