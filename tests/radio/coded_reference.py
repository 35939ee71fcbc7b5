"""A plain numpy reference of the coded OFDM PHY (IEEE 802.11-2020 clause 17 chain), written
from the standard's text independently of the C++ code, for the tests to compare against:
scrambler, K = 7 (133, 171) encoder, puncturing, interleaver, Gray mapping, a textbook Viterbi,
and a burst modulator that can also put arbitrary (hostile) SIGNAL bytes on air."""

from __future__ import annotations

import zlib

import numpy as np

G0, G1 = 0o133, 0o171
N_DATA = 48
PILOT_SC = (-21, -7, 7, 21)
DATA_SC = tuple(k for k in range(-26, 27) if k != 0 and k not in PILOT_SC)
PUNCTURE = {(1, 2): [1, 1], (2, 3): [1, 1, 1, 0], (3, 4): [1, 1, 1, 0, 0, 1]}
RATES = {
    "bpsk-1/2": (1, (1, 2)),
    "bpsk-3/4": (1, (3, 4)),
    "qpsk-1/2": (2, (1, 2)),
    "qpsk-3/4": (2, (3, 4)),
    "16qam-1/2": (4, (1, 2)),
    "16qam-3/4": (4, (3, 4)),
    "64qam-2/3": (6, (2, 3)),
    "64qam-3/4": (6, (3, 4)),
    "qpsk-uncoded": (2, (1, 1)),
}
NAMES = list(RATES)


def scrambler_sequence(n: int, seed: int) -> np.ndarray:
    """x^7 + x^4 + 1 (17.3.5.4): a 7-bit register, x7 in bit 6; the output x7 xor x4 is
    shifted in at bit 0."""
    state = seed & 0x7F
    out = np.zeros(n, np.uint8)
    for i in range(n):
        fb = ((state >> 6) ^ (state >> 3)) & 1
        out[i] = fb
        state = ((state << 1) & 0x7E) | fb
    return out


def conv_encode(bits: np.ndarray) -> np.ndarray:
    """Rate 1/2, generators 133 and 171 octal, MSB = current input (17.3.5.5)."""
    reg = 0
    out = np.zeros(2 * len(bits), np.uint8)
    for i, b in enumerate(bits):
        reg = ((reg >> 1) | (int(b) << 6)) & 0x7F
        out[2 * i] = bin(reg & G0).count("1") & 1
        out[2 * i + 1] = bin(reg & G1).count("1") & 1
    return out


def puncture(coded: np.ndarray, rate: tuple[int, int]) -> np.ndarray:
    keep = np.array(PUNCTURE[rate], bool)
    return coded[np.resize(keep, len(coded))]


def interleave_index(cbps: int, bpsc: int) -> np.ndarray:
    """j for each k (17.3.5.7, equations 17-18 and 17-19)."""
    s = max(bpsc // 2, 1)
    k = np.arange(cbps)
    i = (cbps // 16) * (k % 16) + k // 16
    return s * (i // s) + (i + cbps - (16 * i) // cbps) % s


def gray_levels(bits_per_axis: int) -> dict[tuple[int, ...], int]:
    """802.11a tables 17-7 .. 17-10, one axis."""
    if bits_per_axis == 1:
        return {(0,): -1, (1,): 1}
    if bits_per_axis == 2:
        return {(0, 0): -3, (0, 1): -1, (1, 1): 1, (1, 0): 3}
    return {
        (0, 0, 0): -7,
        (0, 0, 1): -5,
        (0, 1, 1): -3,
        (0, 1, 0): -1,
        (1, 1, 0): 1,
        (1, 1, 1): 3,
        (1, 0, 1): 5,
        (1, 0, 0): 7,
    }


def map_bits(bits: np.ndarray, bpsc: int) -> np.ndarray:
    kmod = {1: 1.0, 2: 1 / np.sqrt(2), 4: 1 / np.sqrt(10), 6: 1 / np.sqrt(42)}[bpsc]
    b = bits.reshape(-1, bpsc)
    if bpsc == 1:
        return (2.0 * b[:, 0] - 1.0).astype(np.complex64)
    half = bpsc // 2
    lv = gray_levels(half)
    i = np.array([lv[tuple(r[:half])] for r in b], float)
    q = np.array([lv[tuple(r[half:])] for r in b], float)
    return ((i + 1j * q) * kmod).astype(np.complex64)


def viterbi(llr: np.ndarray) -> np.ndarray:
    """Textbook soft Viterbi (max of sum of c * L), trellis from and to state 0."""
    n = len(llr) // 2
    metric = np.full(64, -np.inf)
    metric[0] = 0.0
    prev = np.zeros((n, 64), np.int64)
    bit = np.zeros((n, 64), np.uint8)
    # transitions: state = last 6 inputs, newest in bit 5
    for t in range(n):
        new = np.full(64, -np.inf)
        for s in range(64):
            if metric[s] == -np.inf:
                continue
            for u in (0, 1):
                reg = (u << 6) | s
                a = bin(reg & G0).count("1") & 1
                b = bin(reg & G1).count("1") & 1
                ns = reg >> 1
                m = metric[s] + a * llr[2 * t] + b * llr[2 * t + 1]
                if m > new[ns]:
                    new[ns], prev[t, ns], bit[t, ns] = m, s, u
        metric = new
    out = np.zeros(n, np.uint8)
    s = 0
    for t in range(n - 1, -1, -1):
        out[t] = bit[t, s]
        s = prev[t, s]
    return out


def bytes_to_bits(data: bytes) -> np.ndarray:
    return np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")


def crc16(data: bytes) -> int:
    crc = 0xFFFF
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def signal_bytes(mcs: int, length: int, version: int = 1) -> bytes:
    head = bytes([((version & 7) << 5) | (mcs & 0x1F), (length >> 8) & 0xFF, length & 0xFF])
    return head + crc16(head).to_bytes(2, "big")


def signal_coded(sig: bytes) -> np.ndarray:
    bits = np.concatenate([bytes_to_bits(sig), np.zeros(8, np.uint8)])
    coded = conv_encode(bits)
    idx = interleave_index(48, 1)
    out = np.zeros(96, np.uint8)
    for s in range(2):
        out[s * 48 + idx] = coded[s * 48 : (s + 1) * 48]
    return out


def payload_symbols(name: str, psdu_len: int) -> int:
    bpsc, rate = RATES[name]
    dbps = 48 * bpsc * rate[0] // rate[1]
    bits = 8 * (psdu_len + 4) + (6 if rate[0] != rate[1] else 0)
    return -(-bits // dbps)


def payload_coded(name: str, psdu: bytes, seed: int = 0x5D) -> np.ndarray:
    bpsc, rate = RATES[name]
    cbps = 48 * bpsc
    dbps = cbps * rate[0] // rate[1]
    n_sym = payload_symbols(name, len(psdu))
    data = psdu + zlib.crc32(psdu).to_bytes(4, "big")
    bits = np.zeros(n_sym * dbps, np.uint8)
    db = bytes_to_bits(data)
    bits[: len(db)] = db ^ scrambler_sequence(len(db), seed)
    if rate == (1, 1):
        return bits
    coded = puncture(conv_encode(bits), rate)
    idx = interleave_index(cbps, bpsc)
    out = np.zeros_like(coded)
    for s in range(n_sym):
        out[s * cbps + idx] = coded[s * cbps : (s + 1) * cbps]
    return out


def pilot_polarity() -> np.ndarray:
    return 1 - 2 * scrambler_sequence(127, 0x7F).astype(float)


def burst(
    name: str,
    psdu: bytes,
    sync_words: tuple[list[complex], list[complex]],
    cp_len: int = 16,
    post_padding: int = 160,
    signal: bytes | None = None,
    n_sym: int | None = None,
) -> np.ndarray:
    """The time-domain burst at unit power; ``signal``/``n_sym`` override the SIGNAL bytes and
    the number of payload symbols sent (hostile frames)."""
    bpsc, _ = RATES[name]
    pol = pilot_polarity()
    sig = signal if signal is not None else signal_bytes(NAMES.index(name), len(psdu))
    sig_bits = signal_coded(sig)
    pay_bits = payload_coded(name, psdu)
    n = payload_symbols(name, len(psdu)) if n_sym is None else n_sym
    pay_bits = np.resize(pay_bits, n * 48 * bpsc)
    scale = 1 / np.sqrt(52)

    def ofdm(shifted: np.ndarray) -> np.ndarray:
        t = np.fft.ifft(np.fft.ifftshift(shifted)) * 64 * scale
        return np.concatenate([t[-cp_len:], t])

    def symbol(i: int, pts: np.ndarray) -> np.ndarray:
        f = np.zeros(64, complex)
        f[np.array(DATA_SC) + 32] = pts
        f[np.array(PILOT_SC) + 32] = pol[i % 127] * np.array([1, 1, 1, -1])
        return ofdm(f)

    parts = [ofdm(np.asarray(sync_words[0])), ofdm(np.asarray(sync_words[1]))]
    for s in range(2):
        parts.append(symbol(s, map_bits(sig_bits[s * 48 : (s + 1) * 48], 1)))
    cb = 48 * bpsc
    for s in range(n):
        parts.append(symbol(2 + s, map_bits(pay_bits[s * cb : (s + 1) * cb], bpsc)))
    parts.append(np.zeros(post_padding))
    return np.concatenate(parts).astype(np.complex64)
