"""Seeded time-varying fading of one directed link: the shared medium's own trace, without it.

``FadingTrace`` is the sum-of-sinusoids generator (Zheng and Xiao) of the sample-level medium
(:mod:`scaleflu.radio.medium.model` draws every link's taps from it), kept here in pure Python
and numpy so that the frame-level models (``scaleflu.link.macsim``, the ``frames-shared`` hub,
``scaleflu.radio.medium.framelevel``) put the same fades on the same links at the same virtual
time. Taps are complex gains with unit mean power in total; ``gain_db`` is the power of their
sum (the SNR change of a frame on that link).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

N_SINUSOIDS = 16  # sum-of-sinusoids fading: sinusoids per tap
FADINGS = ("none", "rayleigh", "rician")


class FadingTrace:
    """Complex tap gains of the link ``tx -> rx`` over time (seeded; see the module docstring).

    ``fading``: "none", "rayleigh" or "rician" (``k_factor_db``); ``doppler_hz``: maximum
    Doppler; ``pdp``: power delay profile, one tap per sample; ``samp_rate``: samples per
    second of the time axis of :meth:`taps_at`.
    """

    def __init__(
        self,
        seed: int,
        tx: int,
        rx: int,
        fading: str = "none",
        k_factor_db: float = 6.0,
        doppler_hz: float = 2.0,
        pdp: Sequence[float] = (1.0,),
        samp_rate: float = 5e6,
    ) -> None:
        if fading not in FADINGS:
            raise ValueError(f"fading must be one of {FADINGS}, got {fading!r}")
        p = np.asarray(pdp, dtype=float)
        if p.ndim != 1 or not len(p) or (p < 0).any() or p.sum() <= 0:
            raise ValueError("pdp must be non-negative powers, not all zero")
        self.fading = fading
        self.tap_amp = np.sqrt(p / p.sum())
        self.n_taps = len(p)
        rng = np.random.default_rng([seed, tx, rx, 0x5EED])
        m = N_SINUSOIDS
        self.alpha = (2 * np.pi * (np.arange(m) + rng.random((self.n_taps, m))) / m) - np.pi
        self.phi_i = rng.uniform(-np.pi, np.pi, (self.n_taps, m))
        self.phi_q = rng.uniform(-np.pi, np.pi, (self.n_taps, m))
        self.los_theta = rng.uniform(-np.pi, np.pi)
        self.los_phi = rng.uniform(-np.pi, np.pi)
        self.samp_rate = float(samp_rate)
        self.wd = 2 * np.pi * doppler_hz / samp_rate  # rad per sample
        k = 10 ** (k_factor_db / 10.0) if fading == "rician" else 0.0
        self.k_los = math.sqrt(k / (k + 1))
        self.k_nlos = math.sqrt(1 / (k + 1))

    def taps_at(self, n: float) -> np.ndarray:
        """Complex tap gains at absolute sample ``n`` (unit mean power in total)."""
        if self.fading == "none":
            return self.tap_amp.astype(np.complex128)
        wt = self.wd * n
        c = np.cos(self.alpha)
        re, im = np.cos(wt * c + self.phi_i), np.sin(wt * c + self.phi_q)
        h = np.zeros(self.n_taps, np.complex128)
        for m in range(N_SINUSOIDS):  # fixed summation order (bit-exact across runs)
            h += re[:, m] + 1j * im[:, m]
        h /= math.sqrt(N_SINUSOIDS)
        h = self.k_nlos * h
        if self.k_los > 0:
            h[0] += self.k_los * np.exp(1j * (wt * math.cos(self.los_theta) + self.los_phi))
        return self.tap_amp * h

    def gain_db(self, t_s: float) -> float:
        """Power gain of the link at time ``t_s`` seconds (dB; 0 on average)."""
        g = float(np.sum(np.abs(self.taps_at(t_s * self.samp_rate)) ** 2))
        return 10 * math.log10(max(g, 1e-12))


def link_snr(
    seed: int,
    snr_db: float,
    fading: str = "rician",
    k_factor_db: float = 6.0,
    doppler_hz: float = 2.0,
    t_offset: float = 0.0,
) -> Callable[[int, int, float], float]:
    """``snr_fn(src, dst, t)`` for the frame-level simulator (``scaleflu.link.macsim``): every
    directed link's SNR at time ``t`` (+ ``t_offset``), mean ``snr_db`` through its own seeded
    trace, the same trace the sample-level medium draws for that link with that seed."""
    traces: dict[tuple[int, int], FadingTrace] = {}

    def snr(src: int, dst: int, t: float) -> float:
        tr = traces.get((src, dst))
        if tr is None:
            tr = traces[(src, dst)] = FadingTrace(seed, src, dst, fading, k_factor_db, doppler_hz)
        return snr_db + tr.gain_db(t + t_offset)

    return snr
