"""The MAC's timing and sizes (:class:`MacConfig`) and its counters (:class:`MacStats`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..mcs import ADAPTIVE, MCS, frame_airtime_s, parse_mcs


@dataclass
class MacConfig:
    """Timing of the MAC; times in seconds of the owner's clock, sizes in bytes."""

    # The OFDM PHY at 5 MS/s (FFT 64, CP 16, BPSK header, QPSK payload, 160 zeros of padding):
    # scaleflu.radio.ofdm.samples_per_frame(n) = 452 + 6.685 n samples, i.e. 90 us + n / 748 kB/s
    # (720 samples for a 40-byte ACK, 10 480 for a 1500-byte frame).
    rate_bytes_per_s: float = 748000.0  # PHY bytes per second on air
    preamble_s: float = 90e-6  # per frame on air beyond its bytes (preamble, header symbols)
    turnaround_s: float = 1e-3  # a robot's RX -> TX time after it decodes its grant
    guard_s: float = 2e-3  # margin added to every grant window and contention slot
    grant_bytes: int = 96 * 1024  # uplink budget of one grant (link frames)
    downlink_bytes: int = 96 * 1024  # server burst between two grants
    idle_poll_s: float = 0.5  # poll a robot with nothing to say this often
    max_poll_interval_s: float = 8.0  # backoff cap for robots that do not answer
    # A missed grant is retried after miss_retry_s (about one fade) this many times before the
    # exponential backoff starts: on a fading channel a robot in a fade misses a grant or two
    # (a 2 Hz Rician fade lasts about 0.1-0.3 s), and backing off at once stretches a round
    # many times over (docs/link.md section 11).
    quick_retries: int = 3
    miss_retry_s: float = 0.15
    beacon_interval_s: float = 1.0  # BEACON (registration) period
    contention_slots: int = 8  # JOIN slots after each BEACON (0: registration closed)
    join_backoff_exp: int = 6  # robots skip up to 2**min(attempts, this) - 1 beacons
    max_members: int = 1024
    report_bitmap_bytes: int = 1400  # a REPORT's bitmap of one broadcast at most
    # Link adaptation (a PHY with several MCS, scaleflu.link.mcs; docs/link.md section 11.4).
    # None: the PHY has one rate (the stock PHY, a frame hub without a PHY model): GRANTs name
    # no MCS and airtime follows rate_bytes_per_s. "adaptive": the server chooses each robot's
    # uplink MCS (sent in its GRANT), the downlink MCS per robot and the broadcast's (the
    # weakest open target's) from the SNRs and losses both ends measure (until the first SNR
    # comes in, as over a frame hub without a PHY model, frames go without one: the PHY's one
    # rate); an MCS name: that MCS for every DATA frame. MAC control frames, ACKs and NACKs go
    # at control_mcs.
    mcs: str | None = None
    control_mcs: str = "bpsk-1/2"
    samp_rate: float = 5e6  # samples per second of the PHY (airtime per MCS)
    burst_s: float = 0.1  # airtime of one grant's DATA / one downlink burst at most (with an MCS)
    mcs_margin_db: float = 2.0  # McsPolicyConfig.margin_db of the server's policies
    mcs_up_after: int = 2  # reports above the next MCS's threshold before it is taken
    mcs_hold: int = 2  # reports held at a lower MCS after a loss-driven step down
    # missed grants in a row before the most robust MCS: 2, as a robot that trains beside its
    # radio may answer one grant late (a lost burst falls back at once: McsPolicy.outcome)
    mcs_fallback_after: int = 2
    mcs_stale_s: float = 10.0  # no report for this long: the most robust MCS

    def airtime(self, nbytes: int, mcs: int | None = None) -> float:
        """Seconds one frame of ``nbytes`` occupies the medium (at ``mcs`` when given)."""
        if mcs is not None:
            return frame_airtime_s(mcs, nbytes, self.samp_rate)
        return self.preamble_s + nbytes / self.rate_bytes_per_s

    @property
    def control_index(self) -> int | None:
        """MCS index of control frames, None without link adaptation."""
        if self.mcs is None:
            return None
        return parse_mcs(self.control_mcs).index  # type: ignore[union-attr]

    def __post_init__(self) -> None:
        if self.mcs is not None:
            m = parse_mcs(self.mcs)
            self.mcs = m.name if isinstance(m, MCS) else ADAPTIVE
            c = parse_mcs(self.control_mcs)
            if not isinstance(c, MCS):
                raise ValueError("control_mcs must name one MCS")
            self.control_mcs = c.name
        if not self.burst_s > 0 or not self.samp_rate > 0:
            raise ValueError("burst_s and samp_rate must be > 0")
        if self.mcs_up_after < 1 or self.mcs_hold < 0 or self.mcs_fallback_after < 1:
            raise ValueError("mcs_up_after, mcs_fallback_after >= 1, mcs_hold >= 0")
        if self.rate_bytes_per_s <= 0 or self.grant_bytes < 64 or self.downlink_bytes < 64:
            raise ValueError("MAC rate and budgets must be positive (budgets >= 64 bytes)")
        if min(self.preamble_s, self.turnaround_s, self.guard_s) < 0:
            raise ValueError("MAC times must be >= 0")
        if self.quick_retries < 0 or self.miss_retry_s < 0:
            raise ValueError("quick_retries and miss_retry_s must be >= 0")
        if self.contention_slots < 0 or self.contention_slots > 0xFFFF:
            raise ValueError("contention_slots must be in 0..65535")


@dataclass
class MacStats:
    """Counters of a MAC endpoint (bytes are frame bytes handed to the PHY)."""

    beacons_tx: int = 0
    grants_tx: int = 0
    grant_timeouts: int = 0
    reports_tx: int = 0
    reports_rx: int = 0
    joins_tx: int = 0
    joins_rx: int = 0
    admitted: int = 0
    link_frames_tx: int = 0
    link_bytes_tx: int = 0
    control_bytes_tx: int = 0
    control_bytes_rx: int = 0  # MAC frames received (server: REPORTs and JOINs)
    queued_duplicates: int = 0  # ARQ retransmissions replacing a copy still in the MAC queue
    bcast_passes: int = 0
    bcast_frames_tx: int = 0
    bcast_bytes_tx: int = 0
    bcast_repair_frames: int = 0
    bcast_abandoned: int = 0  # broadcast targets the owner handed over to a unicast
    bad_frames: int = 0
    not_for_us: int = 0
    mcs_fallbacks: int = 0  # link adaptation: falls back to the most robust MCS (server)

    def as_dict(self) -> dict[str, int]:
        """Counters as a plain dict."""
        return asdict(self)
