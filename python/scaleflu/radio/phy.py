"""The PHY of the GNU Radio links: its parameters, the simulated channel of a pair, its measures.

``PhyConfig`` holds what transmitter and receiver must agree on and builds both (the stock
gr-digital ``ofdm_link_tx``/``ofdm_link_rx`` of :mod:`scaleflu.radio.ofdm`, the paper's uncoded
PHY, or with ``mcs`` the coded PHY of :mod:`scaleflu.radio.coded_ofdm`); ``ChannelConfig``
is the simulated channel of one directed pair of the per-pair links (AWGN, carrier offset,
multipath, frame loss). ``burst_power`` and ``phy_rate_bytes_per_s`` measure the PHY;
``split_phy_options`` sorts a flat option dict (as the link factory gets it) into the two.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pmt
from gnuradio import blocks, channels, gr

from scaleflu.link.frame import BROADCAST
from scaleflu.link.mcs import ADAPTIVE, MCS, STOCK, McsPolicy, frame_samples, parse_phy_mcs

from .coded_ofdm import coded_ofdm_rx, coded_ofdm_tx
from .ofdm import (
    DEFAULT_POST_PADDING,
    burst_demux_available,
    ofdm_link_rx,
    ofdm_link_tx,
    samples_per_frame,
)


@dataclass(frozen=True)
class PhyConfig:
    """OFDM parameters shared by transmitter and receiver (both ends must agree)."""

    fft_len: int = 64
    cp_len: int = 16
    bps_header: int = 1  # BPSK header
    bps_payload: int = 2  # QPSK payload
    scramble_bits: bool = True
    mtu: int = 1500
    post_padding: int = DEFAULT_POST_PADDING
    min_output_buffer: int | None = None
    # None (also "stock", "none"): the stock gr-digital chain above (uncoded, the paper's PHY);
    # an MCS name, index or "adaptive": the coded PHY (scaleflu.radio.coded_ofdm; fft_len and
    # bps_* do not apply). The link kinds with a PHY default to "adaptive" (scaleflu.linkkinds)
    mcs: int | str | None = None

    def __post_init__(self) -> None:
        m = parse_phy_mcs(self.mcs)  # a bad name fails here, with the known ones
        object.__setattr__(self, "mcs", None if m == STOCK else m.name if isinstance(m, MCS) else m)

    @property
    def coded(self) -> bool:
        """Whether this is the coded PHY (an MCS per frame)."""
        return self.mcs is not None

    @property
    def adaptive(self) -> bool:
        """Whether the coded PHY chooses its MCS per peer (link adaptation)."""
        return self.mcs == ADAPTIVE

    def frame_samples(self, frame_bytes: int, mcs: int | str | None = None) -> int:
        """Samples on air of one link frame (the stock PHY's, or at ``mcs`` / this MCS;
        adaptive without ``mcs``: the most robust MCS)."""
        if not self.coded:
            return samples_per_frame(
                frame_bytes, self.fft_len, self.cp_len, self.bps_payload, self.post_padding
            )
        m = mcs if mcs is not None else self.mcs
        if m == ADAPTIVE:
            m = McsPolicy().robust
        return frame_samples(m, frame_bytes, self.cp_len, self.post_padding)

    def tx(
        self,
        node_id: int,
        amplitude: float = 1.0,
        dst: int = BROADCAST,
        mac_chooses: bool = False,
    ) -> ofdm_link_tx:
        """A transmitter for ``node_id`` (``dst``: the address of frames given without one).
        ``mac_chooses``: a MAC stamps every frame's MCS (``link_arq``'s "mcs" metadata), so an
        adaptive coded transmitter needs no policy of its own: frames without one go at the
        most robust MCS."""
        if self.mcs is not None:
            mcs = self.mcs
            if mac_chooses and mcs == ADAPTIVE:
                mcs = McsPolicy().robust
            return coded_ofdm_tx(
                mtu=self.mtu,
                src=node_id,
                dst=dst,
                mcs=mcs,
                cp_len=self.cp_len,
                post_padding=self.post_padding,
                amplitude=amplitude,
            )
        return ofdm_link_tx(
            mtu=self.mtu,
            src=node_id,
            dst=dst,
            fft_len=self.fft_len,
            cp_len=self.cp_len,
            bps_header=self.bps_header,
            bps_payload=self.bps_payload,
            scramble_bits=self.scramble_bits,
            post_padding=self.post_padding,
            amplitude=amplitude,
            min_output_buffer=self.min_output_buffer,
        )

    def rx(
        self, node_id: int, raw_frames: bool = False, blocking_demux: bool | None = None
    ) -> ofdm_link_rx:
        """A receiver that passes frames addressed to ``node_id`` (or broadcast); with
        ``raw_frames`` whole frames (for link_arq, which then re-encodes nothing in Python);
        ``blocking_demux`` as in :class:`ofdm_link_rx` (None: ours when compiled, for the
        simulated per-pair links whose receivers get bursts only; radios and the shared
        medium pass False)."""
        if blocking_demux is None:
            blocking_demux = burst_demux_available()
        if self.mcs is not None:
            return coded_ofdm_rx(
                node_id=node_id,
                mtu=self.mtu,
                cp_len=self.cp_len,
                raw_frames=raw_frames,
                blocking_demux=blocking_demux,
                min_output_buffer=self.min_output_buffer,
            )
        return ofdm_link_rx(
            node_id=node_id,
            fft_len=self.fft_len,
            cp_len=self.cp_len,
            bps_header=self.bps_header,
            bps_payload=self.bps_payload,
            scramble_bits=self.scramble_bits,
            mtu=self.mtu,
            min_output_buffer=self.min_output_buffer,
            raw_frames=raw_frames,
            blocking_demux=blocking_demux,
        )


@dataclass(frozen=True)
class ChannelConfig:
    """Simulated channel of one directed pair: AWGN, carrier offset, multipath, frame loss."""

    snr_db: float | None = 20.0  # per-sample SNR over the burst power; None = no noise
    cfo: float = 0.0  # normalised frequency offset (cycles per sample; 1/64 = one subcarrier)
    taps: tuple[complex, ...] = (1.0,)  # multipath FIR, normalised to unit energy
    epsilon: float = 1.0  # sample-clock ratio (1.0 = none)
    drop_rate: float = 0.0  # fraction of received frames dropped by frame_drop (seeded)
    seed: int = 0

    def normalised_taps(self) -> list[complex]:
        """Taps scaled to unit energy so the channel keeps the signal power."""
        t = np.asarray(self.taps, dtype=np.complex128)
        e = float(np.sum(np.abs(t) ** 2))
        if e <= 0:
            raise ValueError("channel taps must not all be zero")
        return [complex(x) for x in t / math.sqrt(e)]


@functools.lru_cache(maxsize=16)
def burst_power(phy: PhyConfig = PhyConfig()) -> float:  # noqa: B008 - frozen dataclass
    """Mean power of the transmitter's samples over a full-size burst at amplitude 1 (measured)."""
    tb = gr.top_block()
    tx = phy.tx(0)
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    payload = np.random.default_rng(0).integers(0, 256, phy.mtu - 26, dtype=np.uint8)
    tb.start()
    tx.framer.to_basic_block()._post(
        pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(payload), payload))
    )
    want = phy.frame_samples(phy.mtu)
    for _ in range(2000):
        if len(sink.data()) >= want:
            break
        threading.Event().wait(0.005)
    tb.stop()
    tb.wait()
    x = np.asarray(sink.data(), dtype=np.complex64)
    x = x[: max(1, len(x) - phy.post_padding)]
    if not len(x):
        raise RuntimeError("could not measure the transmitter's burst power")
    return float(np.mean(np.abs(x) ** 2))


def phy_rate_bytes_per_s(phy: PhyConfig, samp_rate: float) -> float:
    """Frame bytes per second the PHY carries back to back at ``samp_rate`` (with padding);
    adaptive: at the fastest MCS the adaptation may choose."""
    if phy.adaptive:
        top = McsPolicy().ladder[-1]
        return phy.mtu * samp_rate / phy.frame_samples(phy.mtu, top.index)
    return phy.mtu * samp_rate / phy.frame_samples(phy.mtu)


def _channel_block(ch: ChannelConfig, power: float, seed: int) -> channels.channel_model:
    nv = 0.0 if ch.snr_db is None else math.sqrt(power / 10 ** (ch.snr_db / 10.0))
    return channels.channel_model(
        noise_voltage=nv,
        frequency_offset=ch.cfo,
        epsilon=ch.epsilon,
        taps=ch.normalised_taps(),
        noise_seed=seed,
        block_tags=False,
    )


_PHY_KEYS = {f.name for f in fields(PhyConfig)}


_CHANNEL_KEYS = {f.name for f in fields(ChannelConfig)}


def split_phy_options(
    opts: dict[str, Any],
) -> tuple[PhyConfig, ChannelConfig | None, dict[str, Any]]:
    """(PhyConfig, ChannelConfig or None, the rest) of a flat option dict (``phy``/``channel``
    objects or their fields; the fields are taken out of ``opts``)."""
    phy = opts.pop("phy", None) or PhyConfig(
        **{k: opts.pop(k) for k in list(opts) if k in _PHY_KEYS}
    )
    ch_kw = {k: opts.pop(k) for k in list(opts) if k in _CHANNEL_KEYS}
    if "taps" in ch_kw:
        ch_kw["taps"] = tuple(complex(t) for t in ch_kw["taps"])
    channel = opts.pop("channel", None) or (ChannelConfig(**ch_kw) if ch_kw else None)
    return phy, channel, opts
