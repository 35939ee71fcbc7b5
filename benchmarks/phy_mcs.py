#!/usr/bin/env python3
"""Coded OFDM PHY benchmark: frame error rate per MCS against SNR, references, goodput.

Run by hand (about 15-25 minutes on 2 cores; ``--quick``: a few minutes)::

    .venv/bin/python benchmarks/phy_mcs.py             # -> benchmarks/results/phy_mcs.{json,md,png}
    .venv/bin/python benchmarks/phy_mcs.py --quick
    .venv/bin/python benchmarks/phy_mcs.py --parts viterbi,loopback

Parts:

* ``viterbi``: decoding speed of the C++ soft-decision Viterbi (K = 7, 64 states) on one core,
  Mbit/s of decoded bits, on 1500 B frames (12 038 trellis steps).
* ``fer``: frame error rate of 1500 B PSDUs against SNR for every MCS, through the real GNU
  Radio receiver (``coded_ofdm_rx``: Schmidl & Cox sync, demux, channel estimation, pilot
  tracking, Viterbi), on AWGN and on the demo's fading channel (the shared medium's
  ``MediumModel`` with ``testbed.medium`` of the default config: Rician K = 6 dB, 2 Hz Doppler,
  one tap; frames far enough apart in virtual time to see independent fades). SNR is per
  sample over the burst, as the link's ``snr_db``. Beside it, the same bit chain with the true
  channel (``genie``: no synchronisation or estimation) and the uncoded paper PHY (stock
  gr-digital ``ofdm_link_tx/rx``, QPSK, 1500 B frames).
* references for the 10 % FER SNR of each MCS: ns-3's NIST OFDM error rate model (Pei and
  Henderson, "Validation of OFDM error rate model in ns-3", 2010; src/wifi/model/
  nist-error-rate-model.cc: hard-decision union bounds) for the same modulation, code rate and
  PSDU bits, and the SNR implied by IEEE 802.11a's receiver minimum sensitivity (802.11a-1999
  17.3.10.1: -82 .. -65 dBm at 10 % PER of 1000 B PSDUs; noise -174 dBm/Hz + 73 dB (20 MHz) +
  10 dB noise figure, so SNR = sensitivity + 91 dB, which includes the standard's 5 dB
  implementation margin).
* ``goodput``: airtime goodput of a LeNet-5 update (its state dict as the link serialises it, fp32
  raw) against SNR 0..30 dB, from the measured FER curves: frames x expected transmissions x
  airtime per frame at 5 MS/s, for the best fixed MCS at each SNR, for uncoded QPSK (the coded
  PHY's "qpsk-uncoded" and the stock PHY), and with link adaptation: each frame at the MCS
  ``McsPolicy`` picks for the frame's own SNR (10 % FER SNR + its 2 dB margin), lost by the
  measured AWGN curve at that SNR; on the fading channel the frame's SNR is the mean SNR plus
  the gain of a Rician K = 6 dB draw (2000 draws, seeded), every transmission its own draw.
* ``loopback``: the same message through the OFDM loopback link (``open_link("ofdm-loopback",
  mcs=...)``: link_arq + coded hier blocks), bit-exact check, airtime from the transmitter's
  sample count: at 6 dB with the default (adaptive) MCS, and at 25 dB with 64qam-3/4 against
  the stock uncoded PHY.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")

import pmt  # noqa: E402
from gnuradio import blocks, gr, pdu  # noqa: E402
from gnuradio import scaleflu as gr_scaleflu  # noqa: E402

from scaleflu.link.mcs import MCS_TABLE, frame_samples  # noqa: E402
from scaleflu.radio.coded_ofdm import coded_ofdm_rx, coded_ofdm_tx  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PSDU = 1500  # bytes per frame, every MCS
SAMP_RATE = 5e6
CHUNK = 1 << 16  # samples per PDU into the receiver
log = logging.getLogger("phy_mcs")

# 802.11a-1999 table 91 (17.3.10.1): minimum sensitivity (dBm) per data rate at 10 % PER.
SENSITIVITY_DBM = {
    "bpsk-1/2": -82,
    "bpsk-3/4": -81,
    "qpsk-1/2": -79,
    "qpsk-3/4": -77,
    "16qam-1/2": -74,
    "16qam-3/4": -70,
    "64qam-2/3": -66,
    "64qam-3/4": -65,
}


# ----------------------------------------------------------------------------- references
def _nist_ber(bpsc: int, snr: float) -> float:
    if bpsc == 1:
        return 0.5 * math.erfc(math.sqrt(snr))
    if bpsc == 2:
        return 0.5 * math.erfc(math.sqrt(snr / 2.0))
    if bpsc == 4:
        return 0.75 * 0.5 * math.erfc(math.sqrt(snr / 10.0))
    return 7.0 / 12.0 * 0.5 * math.erfc(math.sqrt(snr / 42.0))


def _nist_pe(p: float, b: int) -> float:
    d = math.sqrt(4.0 * p * (1.0 - p))
    if b == 1:  # rate 1/2
        c = (36, 211, 1404, 11633, 77433, 502690, 3322763, 21292910, 134365911)
        return 0.5 * sum(ci * d ** (10 + 2 * i) for i, ci in enumerate(c))
    if b == 2:  # rate 2/3
        c = (3, 70, 285, 1276, 6160, 27128, 117019, 498860, 2103891, 8784123)
        return sum(ci * d ** (6 + i) for i, ci in enumerate(c)) / (2.0 * b)
    c = (42, 201, 1492, 10469, 62935, 379644, 2253373, 13073811, 75152755, 428005675)
    return sum(ci * d ** (5 + i) for i, ci in enumerate(c)) / (2.0 * b)  # rate 3/4


def nist_fer(mcs: Any, snr_db: float, psdu_len: int = PSDU) -> float:
    """Frame error rate of ns-3's NistErrorRateModel (same PSDU bits, CRC32 included)."""
    nbits = 8 * (psdu_len + 4)
    p = _nist_ber(mcs.bpsc, 10 ** (snr_db / 10.0))
    if not mcs.coded:
        return 1.0 - (1.0 - p) ** nbits
    b = {(1, 2): 1, (2, 3): 2, (3, 4): 3}[mcs.rate]
    pe = min(_nist_pe(p, b), 1.0)
    return 1.0 - (1.0 - pe) ** nbits


def snr_at(curve: dict[float, float], target: float = 0.1) -> float | None:
    """SNR where a measured FER curve crosses ``target`` (log-FER interpolated)."""
    pts = sorted((float(k), v) for k, v in curve.items())
    for (s0, f0), (s1, f1) in zip(pts, pts[1:], strict=False):
        if f0 >= target > f1:
            l0 = math.log(max(f0, 1e-4))
            l1 = math.log(max(f1, 1e-4))
            lt = math.log(target)
            return s0 + (s1 - s0) * (l0 - lt) / (l0 - l1) if l0 != l1 else s0
    if pts and pts[0][1] < target:
        return None  # already below at the lowest SNR measured
    return None


def bisect_snr(fer, lo: float = -10.0, hi: float = 45.0, target: float = 0.1) -> float:
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if fer(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------------- harness
class _Collector(gr.basic_block):
    """Stores what arrives on its message ports "out" and "report"."""

    def __init__(self) -> None:
        gr.basic_block.__init__(self, "collector", in_sig=None, out_sig=None)
        self.lock = threading.Lock()
        self.out: list[bytes] = []
        self.reports: list[dict] = []
        for port, fn in (("out", self._out), ("report", self._report)):
            self.message_port_register_in(pmt.intern(port))
            self.set_msg_handler(pmt.intern(port), fn)

    def _out(self, msg: Any) -> None:
        with self.lock:
            self.out.append(bytes(pmt.u8vector_elements(pmt.cdr(msg))))

    def _report(self, msg: Any) -> None:
        with self.lock:
            self.reports.append(pmt.to_python(msg))

    def take(self) -> tuple[list[bytes], list[dict]]:
        with self.lock:
            out, rep = self.out, self.reports
            self.out, self.reports = [], []
        return out, rep


class Receiver:
    """One persistent receive flowgraph; ``run(samples)`` returns the PSDUs it delivered."""

    def __init__(self, stock: bool = False, **rx_opts: Any) -> None:
        self.tb = gr.top_block("phy_mcs_rx")
        self.src = pdu.pdu_to_tagged_stream(gr.types.complex_t, "chunk_len")
        self.src.set_min_output_buffer(4 * CHUNK)
        self.col = _Collector()
        if stock:
            from scaleflu.radio.ofdm import ofdm_link_rx

            self.rx = ofdm_link_rx(mtu=PSDU)
            self.tb.connect(self.src, self.rx)
            self.tb.msg_connect(self.rx, "out", self.col, "out")
        else:
            self.rx = coded_ofdm_rx(framing=False, mtu=PSDU, **rx_opts)
            self.tb.connect(self.src, self.rx)
            self.tb.msg_connect(self.rx, "out", self.col, "out")
            self.tb.msg_connect(self.rx, "report", self.col, "report")
        self.tb.start()
        self.fed = 0

    def run(self, x: np.ndarray, settle: float = 0.4, timeout: float = 600.0) -> list[bytes]:
        x = np.concatenate([x, np.zeros(4096, np.complex64)]).astype(np.complex64)
        for i in range(0, len(x), CHUNK):
            c = x[i : i + CHUNK]
            self.src.to_basic_block()._post(
                pmt.intern("pdus"), pmt.cons(pmt.make_dict(), pmt.init_c32vector(len(c), c))
            )
        self.fed += len(x)
        end = time.monotonic() + timeout
        while self.src.nitems_written(0) < self.fed and time.monotonic() < end:
            time.sleep(0.02)
        last, stable = -1, 0.0
        while stable < settle and time.monotonic() < end:  # the receiver's queue drains
            n = len(self.col.out) + len(self.col.reports)
            if n == last:
                stable += 0.05
            else:
                last, stable = n, 0.0
            time.sleep(0.05)
        return self.col.take()[0]

    def close(self) -> None:
        self.tb.stop()
        self.tb.wait()


class Transmitter:
    """One persistent coded transmitter; ``bursts(mcs, psdus)`` -> one array per burst."""

    def __init__(self) -> None:
        self.tb = gr.top_block("phy_mcs_tx")
        self.tx = coded_ofdm_tx(mcs=0, framing=False, mtu=PSDU)
        self.sink = blocks.vector_sink_c()
        self.tb.connect(self.tx, self.sink)
        self.tb.start()

    def bursts(self, mcs: int, psdus: list[bytes]) -> list[np.ndarray]:
        self.sink.reset()
        want = 0
        for p in psdus:
            meta = pmt.dict_add(pmt.make_dict(), pmt.intern("mcs"), pmt.from_long(mcs))
            self.tx.framer.to_basic_block()._post(
                pmt.intern("in"), pmt.cons(meta, pmt.init_u8vector(len(p), list(p)))
            )
            want += frame_samples(mcs, len(p))
        end = time.monotonic() + 120
        while len(self.sink.data()) < want and time.monotonic() < end:
            time.sleep(0.02)
        x = np.asarray(self.sink.data(), np.complex64)
        out, at = [], 0
        for p in psdus:
            n = frame_samples(mcs, len(p))
            out.append(x[at : at + n])
            at += n
        return out

    def close(self) -> None:
        self.tb.stop()
        self.tb.wait()


class StockTransmitter:
    """The paper's PHY (ofdm_link_tx: stock gr-digital OFDM, QPSK) at unit burst power."""

    def __init__(self) -> None:
        from scaleflu.radio.links import PhyConfig, burst_power
        from scaleflu.radio.ofdm import ofdm_link_tx

        self.tb = gr.top_block("phy_mcs_stock_tx")
        self.tx = ofdm_link_tx(mtu=PSDU, amplitude=1.0 / math.sqrt(burst_power(PhyConfig())))
        self.sink = blocks.vector_sink_c()
        self.tb.connect(self.tx, self.sink)
        self.tb.start()

    def bursts(self, payloads: list[bytes]) -> list[np.ndarray]:
        from scaleflu.radio.ofdm import samples_per_frame

        self.sink.reset()
        n = samples_per_frame(PSDU)
        for i, p in enumerate(payloads):
            meta = pmt.dict_add(pmt.make_dict(), pmt.intern("msg_id"), pmt.from_long(i))
            self.tx.framer.to_basic_block()._post(
                pmt.intern("in"), pmt.cons(meta, pmt.init_u8vector(len(p), list(p)))
            )
        end = time.monotonic() + 120
        while len(self.sink.data()) < n * len(payloads) and time.monotonic() < end:
            time.sleep(0.02)
        x = np.asarray(self.sink.data(), np.complex64)
        return [x[i * n : (i + 1) * n] for i in range(len(payloads))]

    def close(self) -> None:
        self.tb.stop()
        self.tb.wait()


def awgn(bursts: list[np.ndarray], snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """The bursts back to back (each with its zero padding) plus white noise at snr_db."""
    x = np.concatenate([np.zeros(2000, np.complex64), *bursts])
    sigma = math.sqrt(10 ** (-snr_db / 10.0) / 2.0)
    noise = rng.standard_normal(2 * len(x)).astype(np.float32).view(np.complex64) * sigma
    return (x + noise).astype(np.complex64)


def fading(bursts: list[np.ndarray], snr_db: float, seed: int) -> np.ndarray:
    """The bursts through the shared medium's channel model (the demo's fading settings).

    Node 1 transmits, node 0 receives; between bursts the medium skips 0.2-0.6 s of virtual
    time (receivers get nothing then), so each burst sees an independent fade.
    """
    from scaleflu.config import load_config
    from scaleflu.radio.medium import LinkChannel, MediumConfig, MediumModel

    med = load_config().testbed.medium
    ch = LinkChannel(
        snr_db=snr_db,
        fading=str(med.fading),
        k_factor_db=float(med.k_factor_db),
        doppler_hz=float(med.doppler_hz),
    )
    cfg = MediumConfig(nodes=(0, 1), seed=seed, default=ch, block=int(med.block))
    model = MediumModel(cfg)
    model.add(0)
    model.add(1)
    b = cfg.block
    zero = np.zeros(b, np.complex64)
    rng = np.random.default_rng(seed)
    out = []
    for x in bursts:
        pad = (-len(x)) % b
        x = np.concatenate([x, np.zeros(pad, np.complex64)])
        for i in range(0, len(x), b):
            out.append(model.step({1: x[i : i + b], 0: zero})[0])
        while not model.can_skip():
            out.append(model.step({1: zero, 0: zero})[0])
        model.skip(int(rng.integers(int(0.2 * SAMP_RATE / b), int(0.6 * SAMP_RATE / b))))
    return np.concatenate(out).astype(np.complex64)


def genie_fer(mcs: Any, snr_db: float, n: int, rng: np.random.Generator) -> float:
    """FER of the same bit chain with the true channel and noise (no sync, no estimation)."""
    nv = 10 ** (-snr_db / 10.0) * 52 / 64  # per-subcarrier noise (unit symbols) at this SNR
    bad = 0
    for _ in range(n):
        p = rng.integers(0, 256, PSDU, dtype=np.uint8).tobytes()
        bits = gr_scaleflu.phy_encode_payload_bits(mcs.index, p)
        x = gr_scaleflu.phy_map_bits(bits, mcs.bpsc)
        w = rng.standard_normal(2 * len(x)).astype(np.float32).view(np.complex64)
        y = (x + math.sqrt(nv / 2) * w).astype(np.complex64)
        h = np.ones(len(x), np.complex64)
        llr = gr_scaleflu.phy_demap_llr(y, h, nv, mcs.bpsc)
        ok, out = gr_scaleflu.phy_decode_payload_bits(mcs.index, llr, PSDU)
        bad += not (ok and out == p)
    return bad / n


# --------------------------------------------------------------------------------- parts
def part_viterbi(reps: int = 5) -> dict[str, Any]:
    n = 8 * (PSDU + 4) + 6
    rng = np.random.default_rng(0)
    llr = rng.standard_normal(2 * n).astype(np.float32)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        bits = gr_scaleflu.phy_viterbi_bench(llr, 200)
        rates.append(bits / (time.perf_counter() - t) / 1e6)
    return {
        "kernel": gr_scaleflu.phy_viterbi_kernel(),
        "trellis_steps": n,
        "mbit_s": sorted(rates),
        "mbit_s_median": float(np.median(rates)),
    }


def _grid(mcs: Any, channel: str, quick: bool) -> list[float]:
    lo = mcs.snr_db - 3.0
    if channel == "awgn":
        hi, step = mcs.snr_db + (3.0 if quick else 4.0), 1.0
    else:
        hi, step = mcs.snr_db + (12.0 if quick else 16.0), 2.0
    return [round(lo + i * step, 1) for i in range(int((hi - lo) / step) + 1)]


def part_fer(
    frames: int, quick: bool, channels_: tuple[str, ...], only: set[str] | None = None
) -> dict[str, Any]:
    tx, rx = Transmitter(), Receiver()
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {ch: {} for ch in channels_}
    try:
        for m in MCS_TABLE:
            if only and m.name not in only:
                continue
            psdus = [rng.integers(0, 256, PSDU, dtype=np.uint8).tobytes() for _ in range(frames)]
            bursts = tx.bursts(m.index, psdus)
            sent = set(psdus)
            for ch in channels_:
                curve = {}
                for snr in _grid(m, ch, quick):
                    t = time.monotonic()
                    if ch == "awgn":
                        x = awgn(bursts, snr, rng)
                    else:
                        x = fading(bursts, snr, seed=int(round((snr + 50) * 10)) + 1000 * m.index)
                    got = rx.run(x)
                    ok = len({g for g in got if g in sent})
                    curve[snr] = 1.0 - ok / frames
                    log.info(
                        "%s %s %5.1f dB: FER %.3f (%d/%d) %.1fs",
                        ch, m.name, snr, curve[snr], frames - ok, frames, time.monotonic() - t,
                    )  # fmt: skip
                    if curve[snr] == 0.0 and ch == "awgn" and snr > m.snr_db:
                        break
                out[ch][m.name] = curve
    finally:
        tx.close()
        rx.close()
    return out


def part_genie(frames: int, quick: bool) -> dict[str, Any]:
    """FER of the bit chain alone (true channel, no sync or estimation) on the AWGN grid."""
    rng = np.random.default_rng(3)
    out = {}
    for m in MCS_TABLE:
        out[m.name] = {snr: genie_fer(m, snr, frames, rng) for snr in _grid(m, "awgn", quick)}
        log.info("genie %s: %s", m.name, out[m.name])
    return out


def part_stock(frames: int, quick: bool, channels_: tuple[str, ...]) -> dict[str, Any]:
    """FER of the paper's PHY (stock gr-digital OFDM, QPSK, uncoded) on the same channels."""
    tx, rx = StockTransmitter(), Receiver(stock=True)
    rng = np.random.default_rng(2)
    out: dict[str, Any] = {}
    try:
        payloads = [
            rng.integers(0, 256, PSDU - 26, dtype=np.uint8).tobytes() for _ in range(frames)
        ]
        bursts = tx.bursts(payloads)
        sent = set(payloads)
        for ch in channels_:
            grid = (
                [14.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0, 22.0]
                if ch == "awgn"
                else [16.0, 18.0, 20.0, 22.0, 24.0, 26.0, 28.0, 30.0]
            )
            curve = {}
            for snr in grid:
                x = awgn(bursts, snr, rng) if ch == "awgn" else fading(bursts, snr, int(snr) + 99)
                got = rx.run(x)
                ok = len({g for g in got if g in sent})
                curve[snr] = 1.0 - ok / frames
                log.info("%s stock-qpsk %5.1f dB: FER %.3f", ch, snr, curve[snr])
            out[ch] = curve
    finally:
        tx.close()
        rx.close()
    return out


def _interp_fer(curve: dict[float, float], snr: float) -> float:
    pts = sorted((float(k), v) for k, v in curve.items())
    if not pts:
        return 1.0
    if snr <= pts[0][0]:
        return pts[0][1] if snr == pts[0][0] else 1.0 if pts[0][1] > 0.5 else pts[0][1]
    if snr >= pts[-1][0]:
        return pts[-1][1]
    for (s0, f0), (s1, f1) in zip(pts, pts[1:], strict=False):
        if s0 <= snr <= s1:
            l0, l1 = math.log(max(f0, 1e-4)), math.log(max(f1, 1e-4))
            f = math.exp(l0 + (l1 - l0) * (snr - s0) / (s1 - s0))
            return 0.0 if f <= 1.0001e-4 else min(f, 1.0)
    return 1.0


def message_bytes() -> bytes:
    """A LeNet-5 update as the link carries it (wire format, fp32 raw)."""
    import torch

    from scaleflu.fl.models import LeNet5
    from scaleflu.link.wire import Message, MessageType, encode_message

    torch.manual_seed(0)
    sd = {k: v.detach().numpy() for k, v in LeNet5().state_dict().items()}
    return encode_message(Message(type=MessageType.UPDATE, tensors=sd))


def _adaptive_kbs(
    awgn: dict[str, Any], snr: float, sizes: list[int], size: int, fading: bool
) -> float:
    """kB/s of ``size`` bytes in frames of ``sizes`` with link adaptation (module docstring):
    the mean airtime of a transmission over its mean success rate, per frame."""
    from scaleflu.link.mcs import McsPolicy, McsPolicyConfig

    margin = McsPolicyConfig().margin_db
    ladder = McsPolicy().ladder
    rng = np.random.default_rng(0)
    if fading:
        k = 10**0.6  # K = 6 dB, the demo's channel
        h = np.sqrt(k / (k + 1)) + np.sqrt(1 / (2 * (k + 1))) * (
            rng.standard_normal(2000) + 1j * rng.standard_normal(2000)
        )
        gains = 10 * np.log10(np.maximum(np.abs(h) ** 2, 1e-12))
    else:
        gains = np.zeros(1)
    total = 0.0
    for nbytes in sizes:
        air = ok = 0.0
        for g in gains:
            s_inst = snr + float(g)
            m = ladder[0]
            for cand in ladder:
                if s_inst >= cand.snr_db + margin:
                    m = cand
            f = _interp_fer(awgn[m.name], s_inst)
            f = 1.0 - (1.0 - f) ** (nbytes / PSDU) if 0 < f < 1 else f
            air += frame_samples(m, nbytes) / SAMP_RATE
            ok += 1.0 - f
        if ok <= 0:
            return 0.0
        total += air / ok
    return size / total / 1e3


def part_goodput(fer: dict[str, Any], stock: dict[str, Any], size: int) -> dict[str, Any]:
    """Airtime goodput (kB/s at 5 MS/s) of one message of ``size`` bytes vs SNR, from FER curves.

    Frames: ceil(size / 1474) link frames of at most 1500 B; each is sent until it arrives
    (1 / (1 - FER) transmissions on average); ACK airtime not counted.
    """
    from scaleflu.radio.ofdm import samples_per_frame

    per = PSDU - 26
    n_full, last = divmod(size, per)
    sizes = [PSDU] * n_full + ([last + 26] if last else [])
    out: dict[str, Any] = {}
    for ch in ("awgn", "fading"):
        if ch not in fer:
            continue
        rows = []
        for snr in range(0, 31):
            best = (0.0, None)
            per_mcs = {}
            for m in MCS_TABLE:
                f = _interp_fer(fer[ch][m.name], snr)
                if f >= 0.999:
                    per_mcs[m.name] = 0.0
                    continue
                air = sum(frame_samples(m, s) for s in sizes) / (1.0 - f) / SAMP_RATE
                per_mcs[m.name] = size / air / 1e3
                if per_mcs[m.name] > best[0]:
                    best = (per_mcs[m.name], m.name)
            sf = _interp_fer(stock.get(ch, {}), snr) if stock.get(ch) else 1.0
            stock_kbs = (
                0.0
                if sf >= 0.999
                else size / (len(sizes) * samples_per_frame(PSDU) / (1.0 - sf) / SAMP_RATE) / 1e3
            )
            adaptive = _adaptive_kbs(fer["awgn"], snr, sizes, size, ch == "fading")
            rows.append(
                {
                    "snr_db": snr,
                    "adaptive_kB_s": round(adaptive, 1),
                    "best_mcs": best[1],
                    "best_kB_s": round(best[0], 1),
                    "qpsk_uncoded_kB_s": round(per_mcs["qpsk-uncoded"], 1),
                    "stock_qpsk_kB_s": round(stock_kbs, 1),
                    "per_mcs_kB_s": {k: round(v, 1) for k, v in per_mcs.items()},
                }
            )
        out[ch] = rows
    return out


def part_loopback() -> dict[str, Any]:
    """Real transfers through open_link("ofdm-loopback") with link_arq (one process each)."""
    import subprocess

    out = {}
    cases = [("6dB-adaptive", 6.0, "adaptive"), ("25dB-64qam-3/4", 25.0, "64qam-3/4"),
             ("25dB-stock", 25.0, "stock"), ("25dB-adaptive", 25.0, "adaptive")]  # fmt: skip
    for name, snr, mcs in cases:
        r = subprocess.run(
            [sys.executable, __file__, "--transfer", f"{snr}:{mcs}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        line = [x for x in r.stdout.splitlines() if x.startswith("{")]
        out[name] = json.loads(line[-1]) if line else {"error": r.stderr[-800:]}
        log.info("loopback %s: %s", name, out[name])
    return out


def transfer(spec: str) -> None:
    """One message through a fresh loopback network (run in its own process)."""
    from scaleflu.linkkinds import close_links, open_link

    snr_s, mcs = spec.split(":", 1)
    snr = float(snr_s)
    msg = message_bytes()
    kw: dict[str, Any] = {"nodes": [0, 1], "snr_db": snr, "network": "bench", "mcs": mcs}
    a = open_link("ofdm-loopback", 0, **kw)
    b = open_link("ofdm-loopback", 1, **kw)
    net = a.network
    t = time.monotonic()
    a.send_async(1, msg, timeout=120)
    got = b.recv(timeout=130)
    wall = time.monotonic() - t
    tx = net.tx[0]
    coded = mcs != "stock"
    samples = tx.framer.nitems_written(0) if coded else tx.gain.nitems_written(0)
    res = {
        "snr_db": snr,
        "mcs": mcs,
        "bytes": len(msg),
        "bit_exact": bool(got is not None and got[1] == msg),
        "wall_s": round(wall, 2),
        "airtime_s": round(samples / SAMP_RATE, 4),
        "goodput_kB_s": round(len(msg) / (samples / SAMP_RATE) / 1e3, 1),
        "frames_per_mcs": tx.frames_per_mcs() if coded else None,
        "receiver": net.counters(),
    }
    close_links()
    print(json.dumps(res))


# ------------------------------------------------------------------------------- output
def write_outputs(res: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "phy_mcs.json").write_text(json.dumps(res, indent=1, default=str))
    lines = ["# Coded OFDM PHY: 10 % FER SNR per MCS (1500 B PSDU; dB per sample)", ""]
    if "fer" in res:
        lines.append(
            "| MCS | AWGN (ours) | genie chain | NIST (ns-3) | ours - NIST | 802.11a sens. "
            "| fading (ours) |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for m in MCS_TABLE:
            s = res["snr10"][m.name]
            f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            d = None if s["awgn"] is None else s["awgn"] - s["nist"]
            lines.append(
                f"| {m.name} | {f(s['awgn'])} | {f(s['genie'])} | {f(s['nist'])} | {f(d)} "
                f"| {f(s['sensitivity'])} | {f(s.get('fading'))} |"
            )
    if "goodput" in res:
        for ch, rows in res["goodput"].items():
            lines += ["", f"## Airtime goodput of a {res['message_bytes']} B LeNet-5 update, {ch}"]
            lines += [
                "",
                "| SNR | adaptive kB/s | best fixed MCS | kB/s | qpsk-uncoded | stock QPSK "
                "| adaptive / qpsk-uncoded | adaptive / stock |",
            ]
            lines.append("|---|---|---|---|---|---|---|---|")
            for r in rows[::2]:
                a = r.get("adaptive_kB_s", 0.0)
                q, st = r["qpsk_uncoded_kB_s"], r["stock_qpsk_kB_s"]
                lines.append(
                    f"| {r['snr_db']} | {a} | {r['best_mcs']} | {r['best_kB_s']} | {q} | {st} "
                    f"| {f'{a / q:.2f}' if q else '-'} | {f'{a / st:.2f}' if st else '-'} |"
                )
    if "viterbi" in res:
        v = res["viterbi"]
        lines += [
            "",
            f"Viterbi ({v['kernel']}): {v['mbit_s_median']:.1f} Mbit/s median on one core",
        ]
    if "loopback" in res:
        lines += ["", "## Loopback transfers (link_arq + coded hier blocks)", ""]
        for k, v in res["loopback"].items():
            keys = ("bit_exact", "airtime_s", "goodput_kB_s", "wall_s", "frames_per_mcs")
            lines.append(f"- {k}: {json.dumps({x: v.get(x) for x in keys})}")
    (RESULTS / "phy_mcs.md").write_text("\n".join(lines) + "\n")
    if "fer" in res:
        plot(res)


def plot(res: dict[str, Any]) -> None:
    from scaleflu.plots import pyplot

    plt = pyplot()
    chans = [c for c in ("awgn", "fading") if c in res["fer"]]
    fig, axes = plt.subplots(1, len(chans) + 1, figsize=(6 * (len(chans) + 1), 4.5))
    colors = plt.cm.viridis(np.linspace(0, 0.95, len(MCS_TABLE)))
    for ax, ch in zip(axes, chans, strict=False):
        for c, m in zip(colors, MCS_TABLE, strict=True):
            curve = sorted((float(k), v) for k, v in res["fer"][ch][m.name].items())
            ax.semilogy(
                [p[0] for p in curve], [max(p[1], 1e-3) for p in curve], "o-", color=c,
                label=m.name, ms=3,
            )  # fmt: skip
            if ch == "awgn":
                xs = np.linspace(curve[0][0], curve[-1][0] + 3, 60)
                ax.semilogy(xs, [max(nist_fer(m, x), 1e-3) for x in xs], ":", color=c, lw=0.8)
        st = res.get("stock", {}).get(ch)
        if st:
            curve = sorted((float(k), v) for k, v in st.items())
            ax.semilogy(
                [p[0] for p in curve], [max(p[1], 1e-3) for p in curve], "k--", label="stock QPSK"
            )
        ax.axhline(0.1, color="grey", lw=0.5)
        ax.set_ylim(8e-4, 1.2)
        ax.set_xlabel("SNR (dB per sample)")
        ax.set_ylabel("frame error rate (1500 B)")
        ax.set_title(f"{ch}: measured (solid), ns-3 NIST (dotted)" if ch == "awgn" else ch)
        ax.grid(True, which="both", lw=0.3)
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    for ch, style in (("awgn", "-"), ("fading", "--")):
        rows = res.get("goodput", {}).get(ch)
        if not rows:
            continue
        s = [r["snr_db"] for r in rows]
        if "adaptive_kB_s" in rows[0]:
            ax.plot(s, [r["adaptive_kB_s"] for r in rows], "g" + style, lw=2,
                    label=f"adaptive MCS ({ch})")  # fmt: skip
        ax.plot(s, [r["qpsk_uncoded_kB_s"] for r in rows], "r" + style, lw=0.8,
                label=f"qpsk-uncoded ({ch})")  # fmt: skip
        ax.plot(s, [r["best_kB_s"] for r in rows], "b" + style, label=f"best MCS ({ch})")
        ax.plot(s, [r["stock_qpsk_kB_s"] for r in rows], "k" + style, label=f"stock QPSK ({ch})")
    ax.set_xlabel("SNR (dB)")
    ax.set_ylabel("airtime goodput (kB/s at 5 MS/s)")
    ax.set_title(f"LeNet-5 update ({res.get('message_bytes', '?')} B)")
    ax.legend(fontsize=7)
    ax.grid(True, lw=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "phy_mcs.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer frames and SNR points")
    ap.add_argument("--frames", type=int, default=None, help="frames per SNR point")
    ap.add_argument(
        "--parts", default="viterbi,fer,genie,stock,goodput,loopback", help="comma-separated parts"
    )
    ap.add_argument("--channels", default="awgn,fading")
    ap.add_argument("--mcs", default=None, help="only these MCS names (comma-separated)")
    ap.add_argument("--transfer", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.transfer:
        transfer(args.transfer)
        return
    parts = set(args.parts.split(","))
    channels_ = tuple(args.channels.split(","))
    frames = args.frames or (40 if args.quick else 100)
    res: dict[str, Any] = {
        "meta": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "load_before": os.getloadavg(),
            "frames_per_point": frames,
            "psdu_bytes": PSDU,
            "argv": sys.argv[1:],
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    }
    old = RESULTS / "phy_mcs.json"
    if old.exists():  # keep the parts not rerun
        prev = json.loads(old.read_text())
        for k in ("fer", "genie", "stock", "goodput", "viterbi", "loopback", "message_bytes"):
            if k in prev and k not in res:
                res[k] = prev[k]
        res.get("fer", {}).pop("genie", None)  # an older layout kept it there
    if "viterbi" in parts:
        res["viterbi"] = part_viterbi()
        log.info("viterbi: %s", res["viterbi"])
    if "fer" in parts:
        only = set(args.mcs.split(",")) if args.mcs else None
        res["fer"] = part_fer(frames, args.quick, channels_, only)
    if "genie" in parts:
        res["genie"] = part_genie(frames, args.quick)
    if "stock" in parts:
        res["stock"] = part_stock(frames, args.quick, channels_)
    if "fer" in res:
        res["snr10"] = {
            m.name: {
                "awgn": snr_at(res["fer"].get("awgn", {}).get(m.name, {})),
                "fading": snr_at(res["fer"].get("fading", {}).get(m.name, {})),
                "genie": snr_at(res.get("genie", {}).get(m.name, {})),
                "nist": round(bisect_snr(lambda s, m=m: nist_fer(m, s)), 2),
                "sensitivity": SENSITIVITY_DBM[m.name] + 91 if m.name in SENSITIVITY_DBM else None,
            }
            for m in MCS_TABLE
        }
    if "goodput" in parts and "fer" in res:
        msg = message_bytes()
        res["message_bytes"] = len(msg)
        res["goodput"] = part_goodput(res["fer"], res.get("stock", {}), len(msg))
    if "loopback" in parts:
        res["loopback"] = part_loopback()
    res["meta"]["load_after"] = os.getloadavg()
    res["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_outputs(res)
    print((RESULTS / "phy_mcs.md").read_text())


if __name__ == "__main__":
    main()
