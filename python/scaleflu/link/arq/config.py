"""Tuning of an ArqEndpoint (:class:`ArqConfig`) and the robot's reassembly bounds."""

from __future__ import annotations

from dataclasses import dataclass

from ..frame import DEFAULT_MTU

TAIL_FRAGMENTS = 16  # default ArqConfig.tail_fragments
# partial messages of unauthenticated senders (no link key; broadcasts) hold at most this in all
UNTRUSTED_REASSEMBLY_BYTES = 16 * 1024 * 1024


@dataclass
class ArqConfig:
    """Tuning of an ArqEndpoint; times in seconds of the endpoint's clock."""

    mtu: int = DEFAULT_MTU
    window: int = 32  # DATA frames in flight (sent, not acknowledged, not deemed lost)
    rate_bytes_per_s: float | None = None  # token-bucket pacing of DATA frames; None = unpaced
    burst_bytes: int = 4 * DEFAULT_MTU  # token bucket depth
    initial_rto: float = 0.5  # retransmission timeout before any RTT sample
    min_rto: float = 0.05
    max_rto: float = 5.0
    backoff: float = 2.0  # RTO multiplier per round of timeouts (reset by a fresh ACK)
    max_backoff: int = 2  # at most this many backoff steps (x4) until a fresh ACK
    rto_copies: int = 2  # copies of a lone fragment retransmitted after a timeout (tail losses)
    # Tail copies: a fragment retransmitted at the very end of a message (every fragment sent
    # once, at most tail_fragments unacknowledged) goes out in k copies, k the smallest with
    # loss^k <= tail_loss_target at the peer's measured (ACK-proven) loss rate, at most
    # max_tail_copies: each round of repairs at the end costs a round trip or a timeout, and at
    # high loss a lone copy needs several (docs/link.md section 9.4). 1 = off.
    tail_loss_target: float = 0.05
    max_tail_copies: int = 4
    # the end of a message: every fragment sent once and at most this many unacknowledged (also
    # the most fragments timing out together that get rto_copies copies)
    tail_fragments: int = TAIL_FRAGMENTS
    # an ACK showing a fragment missing whose latest copy left more than one round trip ago
    # (SRTT + 4 RTTVAR + ack_delay: no min_rto floor, no backoff) marks it lost where the
    # order-based rule cannot see: at the tail (every fragment sent once) and after a timeout
    # retransmission (Karn). A suspicion, not proof: the ACK may be late (a busy receiver)
    rack_rtt: bool = True
    # RFC 6298 (5.3), while a message still has fragments never sent: an ACK that acknowledges
    # new data restarts the timers of its fragments in flight (none expires sooner than one
    # RTO after the latest progress); later frames follow and the ACK bitmaps expose losses.
    # Once every fragment went out, each times out one RTO after it was sent (tail losses
    # have nothing behind them). Without it, under a CPU stall (the queue drains slowly,
    # ACKs keep coming) fragments in flight time out without being lost.
    rto_restart: bool = True
    rate_floor: bool = False  # RTO >= 1.5 x bytes in flight / measured delivery rate
    rto_probe: int = 8  # at most this many fragments of a message retransmitted per timeout
    rto_granularity: float = 0.001  # lower bound of the 4·RTTVAR term (RFC 6298's G)
    deadline: float = 60.0  # default time a send may take before it ends
    max_retransmissions: int | None = None  # per fragment; None = until the deadline
    reorder_tolerance: int = 3  # frames sent after a missing one before it counts as lost
    ack_every: int = 8  # ACK after this many new fragments
    ack_delay: float = 0.02  # or this long after the first unacknowledged one
    complete_ack_repeats: int = 3  # unsolicited repeats of a COMPLETE ACK
    complete_ack_interval: float = 0.05  # first repeat after this long, then doubling
    # unprompted repeats of the last ACK of a partial message when no new fragment arrived
    # since (after complete_ack_interval, then doubling): a lost ACK at the end of a burst
    # otherwise leaves the sender waiting for its timeout
    ack_repeats: int = 1
    # COMPLETE ACKs answering retransmissions of a completed message: at most this many per
    # ack_delay (the sender's copies of a tail retransmission arrive back to back)
    reack_burst: int = 4
    max_message_size: int = 256 * 1024 * 1024 + 64
    reassembly_max_messages: int = 32
    reassembly_max_bytes: int = 300 * 1024 * 1024
    reassembly_max_messages_per_sender: int | None = 8  # None = reassembly_max_messages
    reassembly_max_bytes_per_sender: int | None = None  # None = reassembly_max_bytes
    # partial messages of senders without a link key (and broadcasts) hold at most this in all,
    # however many such senders there are (docs/link.md 4.2)
    reassembly_max_bytes_untrusted: int = UNTRUSTED_REASSEMBLY_BYTES
    reassembly_timeout: float = 120.0
    completed_memory: int = 1024
    completed_ttl: float = 300.0
    # drop every frame from a peer without a link key (broadcasts too): no ACK, no NACK, no
    # reassembly; the testbed turns it on (testbed.arq.require_auth), bare links leave it off
    require_auth: bool = False

    @classmethod
    def robot(cls, **overrides: object) -> ArqConfig:
        """Defaults for a robot (4 GB board): 40 MiB of partial messages in all, 8 per sender."""
        base = {
            "reassembly_max_messages": 8,
            "reassembly_max_bytes": ROBOT_REASSEMBLY_BYTES,
            "reassembly_max_messages_per_sender": 4,
            "max_message_size": ROBOT_REASSEMBLY_BYTES,
        }
        return cls(**{**base, **overrides})


# A robot holds at most this many bytes of partial messages: a LeNet/ResNet-18 state dict
# (45 MB fp32 is the largest model in the paper's tables) needs less; see docs/link.md §6.
ROBOT_REASSEMBLY_BYTES = 64 * 1024 * 1024
