"""Selective-repeat ARQ over link frames, transport-agnostic and free of threads.

Modules:
  endpoint  ArqEndpoint: fragmentation, pacing, retransmission, reassembly, ACKs, timers
  frames    the ARQ's frames: ACK and NACK payloads, link tags of keyed peers (wire format)
  handle    SendStatus and SendHandle: the outcome of one send
  config    ArqConfig, the endpoint's tuning, and the robot's reassembly bounds

The names below are the package's face: import them from ``scaleflu.link.arq``.
"""

from .config import ROBOT_REASSEMBLY_BYTES, TAIL_FRAGMENTS, UNTRUSTED_REASSEMBLY_BYTES, ArqConfig
from .endpoint import LOSS_GAIN, RATE_WINDOW_S, ArqEndpoint, ArqStats
from .frames import (
    ACK_COMPLETE,
    ACK_HEADER,
    ACK_HEADER_SIZE,
    ACK_SNR,
    ACK_VERSION,
    MIN_KEY_SIZE,
    NACK_PAYLOAD,
    NACK_REFUSED,
    NACK_RESET,
    NACK_TOO_LARGE,
    TAG_SIZE,
    AckInfo,
    ack_from_bitmap,
    decode_ack,
    encode_ack,
    encode_tagged_frame,
    frame_tag,
)
from .handle import SendHandle, SendStatus

__all__ = [
    "ACK_COMPLETE",
    "ACK_HEADER",
    "ACK_HEADER_SIZE",
    "ACK_SNR",
    "ACK_VERSION",
    "LOSS_GAIN",
    "MIN_KEY_SIZE",
    "NACK_PAYLOAD",
    "NACK_REFUSED",
    "NACK_RESET",
    "NACK_TOO_LARGE",
    "RATE_WINDOW_S",
    "ROBOT_REASSEMBLY_BYTES",
    "TAG_SIZE",
    "TAIL_FRAGMENTS",
    "UNTRUSTED_REASSEMBLY_BYTES",
    "AckInfo",
    "ArqConfig",
    "ArqEndpoint",
    "ArqStats",
    "SendHandle",
    "SendStatus",
    "ack_from_bitmap",
    "decode_ack",
    "encode_ack",
    "encode_tagged_frame",
    "frame_tag",
]
