"""Modulation and coding schemes of the coded OFDM PHY, their airtime, and link adaptation.

Pure Python (no GNU Radio): the MAC, the frame-level simulations and the link-time model use
the same table as the C++ PHY (``include/gnuradio/scaleflu/coded_phy.h``; tests check that
the two agree entry by entry and that ``MCS_TABLE_VERSION`` matches
``gnuradio.scaleflu.PHY_MCS_TABLE_VERSION``). The payload chain is IEEE 802.11a's (IEEE Std
802.11-2020 clause 17): K = 7 convolutional code (133, 171 octal), punctured to 2/3 and 3/4,
per-symbol interleaver, Gray-mapped BPSK / QPSK / 16-QAM / 64-QAM on 48 data subcarriers of a
64-point FFT; "qpsk-uncoded" is the paper's modulation without a code.

A frame on air: 2 sync symbols, 2 SIGNAL symbols (BPSK rate 1/2: MCS, length, CRC-16), the
payload symbols (PSDU + CRC32 + 6 tail bits, padded to whole symbols), ``post_padding`` zero
samples. ``McsPolicy`` picks an MCS per peer from reported SNRs with hysteresis and falls back
to the most robust MCS after losses; ``coded_ofdm_tx(mcs="adaptive")`` and a MAC use it alike.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ADAPTIVE",
    "FER_AWGN_1500",
    "MCS",
    "MCS_TABLE",
    "MCS_TABLE_VERSION",
    "STOCK",
    "McsPolicy",
    "McsPolicyConfig",
    "airtime_s",
    "expected_frame_airtime_s",
    "frame_airtime_s",
    "frame_error_rate",
    "frame_samples",
    "mcs_by_name",
    "mcs_name",
    "parse_mcs",
    "parse_phy_mcs",
    "payload_symbols",
    "stock_frame_samples",
]

MCS_TABLE_VERSION = 1
FFT_LEN = 64
N_DATA = 48  # data subcarriers per OFDM symbol
PREAMBLE_SYMBOLS = 4  # 2 sync + 2 SIGNAL
TAIL_BITS = 6
PHY_CRC_LEN = 4
ADAPTIVE = "adaptive"
# The paper's PHY: gr-digital's OFDM chain, uncoded QPSK, one rate (no MCS in its header)
STOCK = "stock"


@dataclass(frozen=True)
class MCS:
    """One modulation and coding scheme.

    ``snr_db``: SNR (per sample over the burst, as the channel's ``snr_db``) at which this PHY
    loses 10 % of 1500 B frames on AWGN, measured with ``benchmarks/phy_mcs.py``
    (docs/link.md, "Coded OFDM PHY"); the adaptation policy adds its margin to it.
    """

    index: int
    name: str
    bpsc: int  # coded bits per subcarrier
    rate: tuple[int, int]  # code rate; (1, 1): no code
    snr_db: float

    @property
    def coded(self) -> bool:
        """Whether a convolutional code protects the payload."""
        return self.rate[0] != self.rate[1]

    @property
    def cbps(self) -> int:
        """Coded bits per OFDM symbol."""
        return N_DATA * self.bpsc

    @property
    def dbps(self) -> int:
        """Data bits per OFDM symbol."""
        return self.cbps * self.rate[0] // self.rate[1]


# 10 % FER SNRs: measured on AWGN, 1500 B PSDUs, 100 frames per point (benchmarks/phy_mcs.py;
# docs/link.md section 12). On the demo's Rician fading they are 3.6-5.6 dB higher (per frame
# the SNR a receiver reports already includes the fade, so the policy uses these).
MCS_TABLE: tuple[MCS, ...] = (
    MCS(0, "bpsk-1/2", 1, (1, 2), 0.6),
    MCS(1, "bpsk-3/4", 1, (3, 4), 2.6),
    MCS(2, "qpsk-1/2", 2, (1, 2), 3.4),
    MCS(3, "qpsk-3/4", 2, (3, 4), 5.8),
    MCS(4, "16qam-1/2", 4, (1, 2), 8.9),
    MCS(5, "16qam-3/4", 4, (3, 4), 11.9),
    MCS(6, "64qam-2/3", 6, (2, 3), 16.3),
    MCS(7, "64qam-3/4", 6, (3, 4), 17.6),
    MCS(8, "qpsk-uncoded", 2, (1, 1), 12.0),
)
_BY_NAME = {m.name: m for m in MCS_TABLE}


def mcs_by_name(name: str) -> MCS:
    """The MCS called ``name`` (case-insensitive); ValueError naming the known ones."""
    m = _BY_NAME.get(str(name).strip().lower())
    if m is None:
        raise ValueError(f"unknown MCS {name!r}; known: {', '.join(_BY_NAME)}")
    return m


def parse_mcs(value: int | str | MCS) -> MCS | str:
    """An MCS from its index, name or itself, or ``"adaptive"`` (also spelt ``"auto"``)."""
    if isinstance(value, MCS):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not an MCS: {value!r}")
    if isinstance(value, int):
        if not 0 <= value < len(MCS_TABLE):
            raise ValueError(f"MCS index must be in [0, {len(MCS_TABLE) - 1}], got {value}")
        return MCS_TABLE[value]
    text = str(value).strip().lower()
    if text in ("adaptive", "auto"):
        return ADAPTIVE
    if text.isdigit():
        return parse_mcs(int(text))
    return mcs_by_name(text)


def payload_symbols(mcs: MCS | int | str, psdu_len: int) -> int:
    """OFDM payload symbols of a PSDU of ``psdu_len`` bytes (CRC32, tail and pad added)."""
    m = mcs if isinstance(mcs, MCS) else parse_mcs(mcs)
    if not isinstance(m, MCS):
        raise ValueError("payload_symbols needs a fixed MCS, not 'adaptive'")
    if psdu_len < 1:
        raise ValueError("a PSDU has at least 1 byte")
    bits = 8 * (psdu_len + PHY_CRC_LEN) + (TAIL_BITS if m.coded else 0)
    return -(-bits // m.dbps)


def frame_samples(
    mcs: MCS | int | str, psdu_len: int, cp_len: int = 16, post_padding: int = 160
) -> int:
    """Samples on air for one frame: preamble, SIGNAL, payload symbols and the zero padding."""
    return (PREAMBLE_SYMBOLS + payload_symbols(mcs, psdu_len)) * (FFT_LEN + cp_len) + post_padding


def airtime_s(
    mcs: MCS | int | str,
    psdu_len: int,
    samp_rate: float = 5e6,
    cp_len: int = 16,
    post_padding: int = 160,
) -> float:
    """Seconds on air for one frame at ``samp_rate``."""
    return frame_samples(mcs, psdu_len, cp_len, post_padding) / samp_rate


def parse_phy_mcs(value: int | str | MCS | None) -> MCS | str:
    """The PHY a config or command line names: ``"stock"`` (also ``None``, ``"none"``: the
    paper's uncoded stock PHY), ``"adaptive"`` (``"auto"``) or one MCS (name or index)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in (STOCK, "none")):
        return STOCK
    try:
        return parse_mcs(value)
    except ValueError as exc:  # the PHY's own names too, not only the table's
        raise ValueError(f"PHY {value!r}: not auto (adaptive), stock or an MCS: {exc}") from None


def mcs_name(value: int | str | MCS | None) -> str:
    """The name of what :func:`parse_phy_mcs` gives (``"stock"``, ``"adaptive"``, an MCS)."""
    m = parse_phy_mcs(value)
    return m.name if isinstance(m, MCS) else m


def stock_frame_samples(frame_bytes: int, cp_len: int = 16, post_padding: int = 160) -> int:
    """Samples on air for one frame of the stock PHY (``scaleflu.radio.ofdm.samples_per_frame``
    at FFT 64, QPSK: 2 sync + 1 header symbol, the payload with its CRC32 on 48 carriers)."""
    n_sym = -(-8 * (frame_bytes + 4) // (N_DATA * 2))
    return (3 + n_sym) * (FFT_LEN + cp_len) + post_padding


def frame_airtime_s(mcs: int | str | MCS | None, frame_bytes: int, samp_rate: float = 5e6) -> float:
    """Seconds on air of one link frame of ``frame_bytes`` at ``mcs`` (an MCS, or ``"stock"``
    / None for the stock PHY), padding included, at ``samp_rate``."""
    m = parse_phy_mcs(mcs)
    if m == STOCK:
        return stock_frame_samples(frame_bytes) / samp_rate
    if not isinstance(m, MCS):
        raise ValueError("frame_airtime_s needs a fixed MCS or 'stock', not 'adaptive'")
    return frame_samples(m, frame_bytes) / samp_rate


# Frame error rate of 1500 B frames against the SNR per sample (dB), AWGN, through the real GNU
# Radio receivers, 100 frames per point: `.venv/bin/python benchmarks/phy_mcs.py --frames 100`
# (2026-11-26, benchmarks/results/phy_mcs.json: "fer" -> "awgn" per MCS, "stock" -> "awgn";
# docs/link.md 12.2). Between points the FER is interpolated in log scale; below the first
# point it is 1, above the last the last value.
FER_AWGN_1500: dict[str, tuple[tuple[float, float], ...]] = {
    "bpsk-1/2": ((-1.5, 1.0), (-0.5, 0.64), (0.5, 0.12), (1.5, 0.01), (2.5, 0.0)),
    "bpsk-3/4": ((1.0, 1.0), (2.0, 0.51), (3.0, 0.04), (4.0, 0.0)),
    "qpsk-1/2": ((1.5, 1.0), (2.5, 0.61), (3.5, 0.09), (4.5, 0.0)),
    "qpsk-3/4": ((4.0, 1.0), (5.0, 0.61), (6.0, 0.06), (7.0, 0.01), (8.0, 0.0)),
    "16qam-1/2": ((6.0, 1.0), (7.0, 0.98), (8.0, 0.56), (9.0, 0.08), (10.0, 0.0)),
    "16qam-3/4": ((9.5, 1.0), (10.5, 0.99), (11.5, 0.35), (12.5, 0.02), (13.5, 0.01), (14.5, 0.0)),
    "64qam-2/3": ((13.5, 1.0), (14.5, 0.96), (15.5, 0.39), (16.5, 0.07), (17.5, 0.07), (18.5, 0.0)),
    "64qam-3/4": ((15.5, 1.0), (16.5, 0.65), (17.5, 0.12), (18.5, 0.01), (19.5, 0.0)),
    "qpsk-uncoded": ((10.0, 1.0), (11.0, 0.56), (12.0, 0.12), (13.0, 0.0)),
    STOCK: ((14.0, 1.0), (16.0, 0.97), (17.0, 0.84), (18.0, 0.42), (19.0, 0.01), (20.0, 0.0)),
}
_FER_FLOOR = 1e-4  # log interpolation towards a point of FER 0 stops here


def _fer_1500(name: str, snr_db: float) -> float:
    pts = FER_AWGN_1500[name]
    if snr_db <= pts[0][0]:
        return pts[0][1]
    if snr_db >= pts[-1][0]:
        return pts[-1][1]
    for (s0, f0), (s1, f1) in zip(pts, pts[1:], strict=False):
        if s0 <= snr_db <= s1:
            l0, l1 = math.log(max(f0, _FER_FLOOR)), math.log(max(f1, _FER_FLOOR))
            f = math.exp(l0 + (l1 - l0) * (snr_db - s0) / (s1 - s0))
            return 0.0 if f <= _FER_FLOOR * 1.0001 else min(f, 1.0)
    return 1.0  # pragma: no cover - the points are sorted


def frame_error_rate(mcs: int | str | MCS | None, snr_db: float, frame_bytes: int = 1500) -> float:
    """Probability that a frame of ``frame_bytes`` at ``mcs`` (or ``"stock"``) is lost at
    ``snr_db`` (per sample, AWGN; a fading channel: the frame's own SNR) (``FER_AWGN_1500``).

    A shorter frame loses fewer bits: 1 - (1 - FER_1500)^(bytes / 1500); but a coded frame is
    lost at least as often as its preamble and BPSK-1/2 SIGNAL field are missed, which is taken
    to be the FER of a 1500 B bpsk-1/2 frame at that SNR (the receiver's detection, not the
    payload's length, decides for GRANTs, REPORTs and ACKs in a deep fade).
    """
    m = parse_phy_mcs(mcs)
    if not isinstance(m, MCS) and m != STOCK:
        raise ValueError("frame_error_rate needs a fixed MCS or 'stock', not 'adaptive'")
    if not math.isfinite(snr_db):
        return 1.0
    name = m.name if isinstance(m, MCS) else STOCK
    f = _fer_1500(name, snr_db)
    if f > 0.0 and frame_bytes != 1500:
        f = 1.0 - (1.0 - f) ** (max(1, frame_bytes) / 1500.0)
    if isinstance(m, MCS):
        f = max(f, _fer_1500("bpsk-1/2", snr_db))
    return f


_FADE_DRAWS = 2000  # gains averaged over for a fading link's expectation (seeded, fixed)


def _fade_gains_db(fading: str, k_factor_db: float) -> tuple[float, ...]:
    """Power gains (dB) of a fading link, drawn once (seed 0): Rician K, Rayleigh, or none."""
    if fading == "none":
        return (0.0,)
    if fading not in ("rician", "rayleigh"):
        raise ValueError(f"fading must be none, rayleigh or rician, got {fading!r}")
    rng = random.Random(0)
    k = 10 ** (k_factor_db / 10.0) if fading == "rician" else 0.0
    los, nlos = math.sqrt(k / (k + 1)), math.sqrt(1 / (2 * (k + 1)))
    out = []
    for _ in range(_FADE_DRAWS):
        re, im = los + nlos * rng.gauss(0, 1), nlos * rng.gauss(0, 1)
        out.append(10 * math.log10(max(re * re + im * im, 1e-12)))
    return tuple(out)


def expected_frame_airtime_s(
    mcs: int | str | MCS | None,
    frame_bytes: int,
    snr_db: float,
    fading: str = "none",
    k_factor_db: float = 6.0,
    samp_rate: float = 5e6,
    margin_db: float = 2.0,
) -> float:
    """Expected airtime to deliver one frame of ``frame_bytes``: the mean airtime of a
    transmission over the mean success rate (1 - FER) of one, at mean SNR ``snr_db`` over the
    link's fading (each transmission sees the gain of one draw). ``mcs``: one MCS or
    ``"stock"`` (the same MCS whatever the fade), or ``"adaptive"``: each frame at the MCS
    ``McsPolicy`` picks for the frame's own SNR
    (``margin_db`` over the 10 % FER SNR, the most robust below; the adaptation knows the
    channel: a bound on what the MAC achieves). ``math.inf`` when no frame gets through."""
    m = parse_phy_mcs(mcs)
    gains = _fade_gains_db(fading, k_factor_db)
    ladder = McsPolicy(McsPolicyConfig(margin_db=margin_db)).ladder if m == ADAPTIVE else None
    air, ok = 0.0, 0.0
    for g in gains:  # every transmission, a retransmission too, meets a draw of its own
        snr = snr_db + g
        this = m
        if ladder is not None:
            this = ladder[0]
            for cand in ladder:
                if snr >= cand.snr_db + margin_db:
                    this = cand
        air += frame_airtime_s(this, frame_bytes, samp_rate)
        ok += 1.0 - frame_error_rate(this, snr, frame_bytes)
    return math.inf if ok <= 0.0 else air / ok


@dataclass(frozen=True)
class McsPolicyConfig:
    """Link adaptation settings (dB are per-sample SNRs, as the receiver reports them).

    ``margin_db`` is added to each MCS's 10 % FER SNR (fading and estimation error);
    an MCS above the current one is taken only after ``up_after`` consecutive reports at
    least ``up_hysteresis_db`` above its threshold, a lower one at once; ``fallback_after``
    consecutive losses drop to the most robust MCS for ``hold`` reports; a peer not heard from
    for ``stale_s`` seconds gets the most robust MCS. ``candidates`` are the MCS names the
    policy may choose (default: every MCS not dominated by one that is at least as fast at a
    lower SNR, which leaves out "qpsk-uncoded"). A burst whose fate is known as a whole
    (:meth:`McsPolicy.outcome`: a MAC's granted burst, the frames an ACK covers) that lost at
    least ``down_loss`` of its frames steps one MCS down, at least ``fallback_loss`` falls back
    to the most robust MCS; either holds for ``hold`` reports.
    """

    margin_db: float = 2.0
    up_hysteresis_db: float = 1.0
    up_after: int = 2
    fallback_after: int = 3
    hold: int = 4
    stale_s: float = 10.0
    candidates: tuple[str, ...] | None = None
    down_loss: float = 0.2
    fallback_loss: float = 0.5

    def __post_init__(self) -> None:
        if self.up_after < 1 or self.fallback_after < 1 or self.hold < 0:
            raise ValueError("up_after and fallback_after must be >= 1, hold >= 0")
        if not 0.0 < self.down_loss <= self.fallback_loss <= 1.0:
            raise ValueError("need 0 < down_loss <= fallback_loss <= 1")
        if not self.stale_s > 0:
            raise ValueError("stale_s must be > 0")
        for v in (self.margin_db, self.up_hysteresis_db):
            if not math.isfinite(v):
                raise ValueError("margins must be finite")
        if self.candidates is not None:
            if not self.candidates:
                raise ValueError("candidates must name at least one MCS")
            for name in self.candidates:
                mcs_by_name(name)


def _undominated(table: Iterable[MCS]) -> list[MCS]:
    ms = sorted(table, key=lambda m: (m.dbps, -m.snr_db))
    out: list[MCS] = []
    for m in ms:
        if any(o.dbps >= m.dbps and o.snr_db < m.snr_db for o in ms if o is not m):
            continue
        out.append(m)
    return sorted(out, key=lambda m: m.snr_db)


@dataclass
class _PeerState:
    current: int = 0  # position in the policy's ladder
    up_streak: int = 0
    losses: int = 0
    hold: int = 0
    last_snr_db: float | None = None
    last_report: float | None = None
    reports: int = 0
    fallbacks: int = 0
    history: list[tuple[float, int]] = field(default_factory=list)


class McsPolicy:
    """Chooses each peer's MCS from the SNRs it reports; thread-safe enough for one writer.

    ``report(peer, snr_db)`` after each SNR report about the link to ``peer`` (what ``peer``
    measured on our frames, or what we measured on its frames on a reciprocal channel);
    ``lost(peer)`` / ``delivered(peer)`` after a frame's fate is known; ``choose(peer)`` gives
    the MCS index for the next frame to ``peer``. ``peer=None`` is a link without addresses.
    """

    def __init__(
        self,
        config: McsPolicyConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or McsPolicyConfig()
        if self.config.candidates is None:
            ladder = _undominated(MCS_TABLE)
        else:
            ladder = sorted(
                (mcs_by_name(n) for n in self.config.candidates), key=lambda m: m.snr_db
            )
        self.ladder: tuple[MCS, ...] = tuple(ladder)
        self._clock = clock
        self._peers: dict[Any, _PeerState] = {}

    def _state(self, peer: Any) -> _PeerState:
        st = self._peers.get(peer)
        if st is None:
            st = self._peers[peer] = _PeerState()
        return st

    def _target(self, snr_db: float, extra_db: float = 0.0) -> int:
        best = 0
        for i, m in enumerate(self.ladder):
            if snr_db >= m.snr_db + self.config.margin_db + extra_db:
                best = i
        return best

    def report(self, peer: Any, snr_db: float, ok: bool | None = None) -> None:
        """An SNR report for the link to ``peer``; ``ok`` False counts as a loss too."""
        if not math.isfinite(snr_db):
            return
        st = self._state(peer)
        now = self._clock()
        fresh = st.last_report is None or now - st.last_report > self.config.stale_s
        st.last_snr_db, st.last_report, st.reports = float(snr_db), now, st.reports + 1
        if ok is False:
            self.lost(peer)
        elif ok is True:
            st.losses = 0
        down = self._target(snr_db)
        if fresh and st.hold == 0:
            # the first report (or the first after a silence): nothing to flap from, so the
            # MCS that fits it at once (the margin, not the hysteresis)
            st.current, st.up_streak = down, 0
        elif down < st.current:
            st.current, st.up_streak = down, 0
        elif st.hold > 0:
            st.hold -= 1
            st.up_streak = 0
        else:
            up = self._target(snr_db, self.config.up_hysteresis_db)
            if up > st.current:
                st.up_streak += 1
                if st.up_streak >= self.config.up_after:
                    st.current, st.up_streak = up, 0
            else:
                st.up_streak = 0
        st.history.append((now, self.ladder[st.current].index))
        del st.history[:-64]

    def lost(self, peer: Any) -> None:
        """A frame to ``peer`` was lost; after ``fallback_after`` in a row: most robust MCS."""
        st = self._state(peer)
        st.losses += 1
        if st.losses >= self.config.fallback_after and st.current > 0:
            st.current, st.up_streak, st.losses = 0, 0, 0
            st.hold = self.config.hold
            st.fallbacks += 1

    def delivered(self, peer: Any) -> None:
        """A frame to ``peer`` arrived."""
        self._state(peer).losses = 0

    def outcome(self, peer: Any, sent: int, lost: int) -> None:
        """``lost`` of ``sent`` frames to ``peer`` were lost (a burst whose fate is known as a
        whole): one MCS down from ``down_loss``, the most robust from ``fallback_loss``."""
        if sent <= 0:
            return
        lost = min(max(0, int(lost)), int(sent))
        st = self._state(peer)
        frac = lost / sent
        if lost == 0:
            st.losses = 0
            return
        if frac >= self.config.fallback_loss:
            if st.current > 0:
                st.fallbacks += 1
            st.current, st.up_streak, st.losses = 0, 0, 0
            st.hold = self.config.hold
        elif frac >= self.config.down_loss and st.current > 0:
            st.current, st.up_streak = st.current - 1, 0
            st.hold = self.config.hold

    def position(self, peer: Any = None) -> int:
        """Rung of ``peer``'s MCS on the ladder (0: the most robust)."""
        idx = self.choose(peer)
        for i, m in enumerate(self.ladder):
            if m.index == idx:
                return i
        return 0

    @property
    def robust(self) -> int:
        """Index of the most robust MCS the policy chooses."""
        return self.ladder[0].index

    def choose(self, peer: Any = None) -> int:
        """MCS index for the next frame to ``peer`` (the most robust one without fresh reports)."""
        st = self._peers.get(peer)
        if st is None and peer is not None:
            st = self._peers.get(None)  # a link-wide report covers every peer
        if st is None or st.last_report is None:
            return self.ladder[0].index
        if self._clock() - st.last_report > self.config.stale_s:
            return self.ladder[0].index
        return self.ladder[st.current].index

    def snapshot(self, peer: Any = None) -> dict[str, Any]:
        """What the policy holds about ``peer`` (for logs and reports)."""
        st = self._peers.get(peer)
        if st is None:
            return {"mcs": self.choose(peer), "snr_db": None, "reports": 0, "fallbacks": 0}
        return {
            "mcs": self.choose(peer),
            "snr_db": st.last_snr_db,
            "reports": st.reports,
            "fallbacks": st.fallbacks,
            "losses": st.losses,
        }
