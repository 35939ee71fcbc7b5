"""GNU Radio message blocks of the scaleflu link: ARQ endpoint and a seeded frame dropper.

Per-message (and per-frame) work happens here in Python; per-byte work (framing, CRC) stays in
the C++ blocks frame_builder and frame_parser. GRC and users reach the blocks through
``gnuradio.scaleflu`` (:mod:`scaleflu.radio.blocks` is that module's export face) as
``scaleflu.link_arq`` and ``scaleflu.frame_drop``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from dataclasses import replace
from typing import Any

import pmt
from gnuradio import gr

from scaleflu.link.api import ArqLink
from scaleflu.link.arq import ArqConfig, SendHandle
from scaleflu.link.frame import (
    BROADCAST,
    FRAME_HEADER,
    FRAME_HEADER_SIZE,
    encode_frame,
)

__all__ = [
    "frame_drop",
    "frame_to_pdu",
    "frame_to_raw_pdu",
    "link_arq",
    "pdu_to_frame",
]

logger = logging.getLogger(__name__)

_HEADER_KEYS = ("type", "src", "dst", "msg_id", "seq", "count")
_KEYS = {
    k: pmt.intern(k)
    for k in (*_HEADER_KEYS, "size", "status", "reason", "elapsed", "snr_db", "mcs", "peer")
}
_KEYS.update({k: pmt.intern(k) for k in ("sent", "lost")})
_PORT_NAMES = (
    "send", "frames_in", "frames_out", "delivered", "status", "in", "out", "mcs_feedback"
)  # fmt: skip
_PORTS = {k: pmt.intern(k) for k in _PORT_NAMES}
_RAW = pmt.intern("raw")


def _raw_meta(ftype: int) -> pmt.pmt_t:
    meta = pmt.dict_add(pmt.make_dict(), _RAW, pmt.PMT_T)
    return pmt.dict_add(meta, _KEYS["type"], pmt.from_long(ftype))


# Metadata of a raw frame PDU per frame type (PMT dicts are immutable: shared safely). "type"
# rides along so that frame_drop(only_data=True) still tells DATA from ACK/NACK.
_RAW_META = {t: _raw_meta(t) for t in range(3)}


def raw_frames_supported() -> bool:
    """True when the compiled frame_builder/frame_parser take and give whole frames ("raw")."""
    try:
        from gnuradio import scaleflu as _gr_scaleflu
    except ImportError:  # pragma: no cover - the C++ module is part of the install
        return False
    return hasattr(_gr_scaleflu.frame_parser, "set_raw_output")


# Bytes <-> pmt u8vector through PMT's own serialisation (a C++ memcpy), not a Python list of
# ints through init_u8vector / u8vector_elements, which would be the largest per-frame cost of
# the link (docs/link.md section 9.4.1). Layout of a serialised u8vector: 0x0a (uniform vector),
# 0x00 (u8), u32 length (big-endian), u8 npad, npad zero bytes, data.
_U8_TAG = b"\x0a\x00"
_U8_PAD = b"\x01\x00"


def _u8(data: bytes | bytearray | memoryview) -> pmt.pmt_t:
    """A pmt u8vector holding ``data``."""
    n = len(data)
    return pmt.deserialize_str(b"".join((_U8_TAG, n.to_bytes(4, "big"), _U8_PAD, data)))


def _u8_bytes(vec: pmt.pmt_t) -> bytes:
    """Bytes of a pmt u8vector (checked by the caller)."""
    ser = pmt.serialize_str(vec)
    n = int.from_bytes(ser[2:6], "big")
    start = 7 + ser[6]
    if ser[:2] != _U8_TAG or len(ser) != start + n:  # not the layout we know: the slow way
        return bytes(pmt.u8vector_elements(vec))
    return ser[start:]


def _pdu_bytes(msg: pmt.pmt_t) -> bytes | None:
    """Bytes of a u8 PDU, or None when ``msg`` is not one."""
    if not pmt.is_pair(msg) or not pmt.is_u8vector(pmt.cdr(msg)):
        return None
    return _u8_bytes(pmt.cdr(msg))


def _meta_int(meta: pmt.pmt_t, key: str) -> int | None:
    """Integer metadata field, or None when absent or not an integer."""
    if not pmt.is_dict(meta):
        return None
    v = pmt.dict_ref(meta, _KEYS.get(key) or pmt.intern(key), pmt.PMT_NIL)
    if pmt.is_integer(v):
        return int(pmt.to_long(v))
    if pmt.is_uint64(v):
        return int(pmt.to_uint64(v))
    return None


def _meta_float(meta: pmt.pmt_t, key: str) -> float | None:
    """Real-number metadata field, or None when absent, not a number or not finite."""
    if not pmt.is_dict(meta):
        return None
    v = pmt.dict_ref(meta, _KEYS.get(key) or pmt.intern(key), pmt.PMT_NIL)
    if not pmt.is_number(v) or pmt.is_complex(v):
        return None
    x = float(pmt.to_double(v))
    return x if math.isfinite(x) else None


def frame_to_pdu(raw: bytes) -> pmt.pmt_t:
    """Split an encoded link frame into a PDU for frame_builder: header fields in metadata."""
    _, _, ftype, src, dst, msg_id, seq, count, length = FRAME_HEADER.unpack_from(raw)
    meta = pmt.make_dict()
    for key, value in zip(_HEADER_KEYS, (ftype, src, dst, msg_id, seq, count), strict=True):
        meta = pmt.dict_add(meta, _KEYS[key], pmt.from_long(value))
    return pmt.cons(meta, _u8(raw[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + length]))


def frame_to_raw_pdu(raw: bytes) -> pmt.pmt_t:
    """A PDU holding the whole encoded frame, metadata "raw" = #t (and "type"), for the C++
    frame_builder, which checks the frame and writes it unchanged: no header fields to build in
    Python (frame_to_pdu's six dict entries cost more than the frame itself)."""
    meta = _RAW_META.get(raw[3]) if len(raw) > 3 else None
    return pmt.cons(meta if meta is not None else _RAW_META[0], _u8(raw))


def pdu_to_frame(msg: pmt.pmt_t, mtu: int) -> bytes | None:
    """Re-encode a frame_parser PDU (header in metadata) as frame bytes; raw frames pass as-is.

    A PDU whose metadata has "raw" = #t (frame_parser with raw output) or no "type" key (for
    example straight from Tagged Stream to PDU) is taken to be a whole frame; the ARQ checks it.
    Returns None when the PDU is not usable.
    """
    data = _pdu_bytes(msg)
    if data is None:
        return None
    meta = pmt.car(msg)
    if pmt.is_dict(meta) and pmt.eq(pmt.dict_ref(meta, _RAW, pmt.PMT_F), pmt.PMT_T):
        return data
    if _meta_int(meta, "type") is None:
        return data
    fields = [_meta_int(meta, k) for k in _HEADER_KEYS]
    if any(f is None for f in fields):
        return None
    try:
        return encode_frame(*fields, data, mtu=mtu)  # type: ignore[arg-type]
    except ValueError:
        return None


class _BlockLink(ArqLink):
    """ArqLink whose deliveries go to a callback (the block's "delivered" port) and the inbox."""

    def __init__(self, owner: link_arq, node_id: int, config: ArqConfig, queue: bool) -> None:
        super().__init__(node_id, owner._transmit, config=config, name=f"link_arq-{node_id}")
        self._owner = owner
        self._queue = queue
        self.endpoint.on_message = self._on_message

    def _on_message(self, src: int, payload: bytes) -> None:
        if self._queue:
            self._inbox.put((src, payload))
        self._owner._publish_delivered(src, payload)


class link_arq(gr.basic_block):  # noqa: N801 - GNU Radio block naming
    """Reliable message transport over the frame ports of an OFDM/ZMQ/UHD chain.

    Message ports:
      * in  "send": PDU whose bytes are one whole message; metadata "dst" (required) and
        optional "deadline" (s). A "tag" entry or anything else in the metadata is echoed on
        "status".
      * out "frames_out": one PDU per frame to transmit, for frame_builder (or ofdm_link_tx):
        the whole encoded frame with metadata "raw" = #t and "type" (``raw_frames``, the
        default when the compiled frame_builder takes them), else the payload with the header
        fields in metadata.
      * in  "frames_in": frames received, from frame_parser (header in metadata, or whole
        frames with "raw" = #t) or raw frames.
      * out "delivered": each reassembled message once, metadata "src", "dst", "size".
      * out "status": one PDU per send when it finishes: metadata "msg_id", "dst", "size",
        "status" ("delivered"/"failed"/"unconfirmed"), "reason", "elapsed" plus the echoed
        send metadata.
      * out "mcs_feedback": for every ACK of one of our sends, a dict {"peer", "snr_db" (the
        SNR the peer measured on our frames, when its ACK reports one), "sent", "lost"}
        (fragments the ACK settled, and those it proved lost): connect it to a coded
        transmitter's "feedback" port and the link adapts its MCS per peer from its ACKs.

    Frames on "frames_in" whose metadata has "snr_db" (the coded OFDM receiver's) hand that SNR
    to the ARQ, whose ACKs report it back (ACK version 2); a MAC put under the link uses it too.
    Frames the link puts out with an MCS (a MAC's choice) carry it as metadata "mcs".

    A timer thread (scaleflu.link.ArqLink) drives retransmissions, delayed ACKs and pacing; at
    most ``window`` DATA frames are in flight and, with ``rate_bytes_per_s`` > 0, a token bucket
    holds the frame rate to what the PHY carries, so the transmitter's queue never floods.
    """

    def __init__(
        self,
        node_id: int = 1,
        mtu: int = 1500,
        window: int = 32,
        rate_bytes_per_s: float = 0.0,
        initial_rto: float = 0.5,
        deadline: float = 60.0,
        max_message_size: int = 256 * 1024 * 1024 + 64,
        queue_delivered: bool = False,
        raw_frames: bool | None = None,
        **arq_overrides: Any,
    ) -> None:
        gr.basic_block.__init__(self, name="link_arq", in_sig=None, out_sig=None)
        if not 0 <= node_id < BROADCAST:
            raise ValueError(f"node_id must be in 0..{BROADCAST - 1}, got {node_id}")
        self.node_id = node_id
        self.mtu = mtu
        # raw_frames: "frames_out" PDUs hold whole frames (metadata "raw" = #t) that the C++
        # frame_builder checks and writes unchanged; None = when the compiled module can
        self.raw_frames = raw_frames_supported() if raw_frames is None else bool(raw_frames)
        self._to_pdu = frame_to_raw_pdu if self.raw_frames else frame_to_pdu
        self.config = ArqConfig(
            mtu=mtu,
            window=window,
            rate_bytes_per_s=rate_bytes_per_s or None,
            burst_bytes=max(4 * mtu, int(mtu)),
            initial_rto=initial_rto,
            deadline=deadline,
            max_message_size=max_message_size,
        )
        if arq_overrides:
            self.config = replace(self.config, **arq_overrides)
        self.bad_pdus = 0  # PDUs on "send"/"frames_in" that were not usable
        self.frames_in_count = 0  # PDUs handled on "frames_in"
        self.frames_done = 0  # ... and handed to the link (processed: feed() returned)
        self.frames_out_count = 0  # frames published on "frames_out"
        self.on_progress: Any = None  # called after a frame was handled or put out
        self._pub_lock = threading.Lock()
        for p in ("send", "frames_in"):
            self.message_port_register_in(_PORTS[p])
        for p in ("frames_out", "delivered", "status"):
            self.message_port_register_out(_PORTS[p])
        self.set_msg_handler(_PORTS["send"], self._handle_send)
        self.set_msg_handler(_PORTS["frames_in"], self._handle_frame)
        self.link = _BlockLink(self, node_id, self.config, queue_delivered)
        self.message_port_register_out(_PORTS["mcs_feedback"])
        self.link.endpoint.on_peer_report = self._publish_feedback

    # -- Python API (used by the Link back-ends in scaleflu.radio.links) ----------------------
    def send(self, dst: int, payload: bytes, deadline: float | None = None) -> SendHandle:
        """Start sending ``payload`` to ``dst``; the handle reports DELIVERED/FAILED/UNCONFIRMED."""
        return self.link.send_async(dst, bytes(payload), deadline)

    def feed(self, raw: bytes, snr_db: float | None = None) -> None:
        """Hand one received raw frame to the endpoint (thread-safe)."""
        self.link.feed(raw, snr_db)

    def stats(self) -> dict[str, Any]:
        """ARQ and reassembly counters, plus PDUs this block refused."""
        s = self.link.stats()
        s["bad_pdus"] = self.bad_pdus
        return s

    # -- GNU Radio hooks -------------------------------------------------------------------
    def stop(self) -> bool:
        self.link.close()
        return True

    def _handle_send(self, msg: pmt.pmt_t) -> None:
        data = _pdu_bytes(msg)
        meta = pmt.car(msg) if pmt.is_pair(msg) else pmt.PMT_NIL
        dst = _meta_int(meta, "dst")
        if data is None or dst is None:
            self.bad_pdus += 1
            logger.warning("link_arq: 'send' needs a u8 PDU with metadata 'dst'; dropped")
            return
        deadline = None
        if pmt.is_dict(meta):
            d = pmt.dict_ref(meta, pmt.intern("deadline"), pmt.PMT_NIL)
            if pmt.is_number(d) and not pmt.is_complex(d):
                deadline = float(pmt.to_double(d))
        try:
            handle = self.link.send_async(dst, data, deadline)
        except (ValueError, RuntimeError) as exc:
            self.bad_pdus += 1
            self._publish_status(meta, dst, len(data), None, "failed", str(exc), None)
            return
        handle.add_done_callback(
            lambda h: self._publish_status(
                meta, h.dst, h.size, h.msg_id, h.status.value, h.reason, h.elapsed
            )
        )

    def _handle_frame(self, msg: pmt.pmt_t) -> None:
        self.frames_in_count += 1
        try:
            raw = pdu_to_frame(msg, self.mtu)
            if raw is None:
                self.bad_pdus += 1
                return
            snr = _meta_float(pmt.car(msg), "snr_db")
            self.link.feed(raw, snr if snr is not None and -50.0 <= snr <= 100.0 else None)
        finally:
            self.frames_done += 1
            if self.on_progress is not None:
                self.on_progress()

    # -- publishing ------------------------------------------------------------------------
    def _transmit(self, raw: bytes, mcs: int | None = None) -> None:
        # Called by the endpoint with the link lock held: publish and return, never block.
        pdu = self._to_pdu(raw)
        if mcs is not None:  # a MAC's choice for this frame: the coded modulator takes it
            pdu = pmt.cons(
                pmt.dict_add(pmt.car(pdu), _KEYS["mcs"], pmt.from_long(mcs)), pmt.cdr(pdu)
            )
        self.message_port_pub(_PORTS["frames_out"], pdu)
        self.frames_out_count += 1
        if self.on_progress is not None:
            self.on_progress()

    def _publish_feedback(self, peer: int, snr_db: float | None, acked: int, lost: int) -> None:
        # the endpoint's ACK hook (link lock held): one dict for the transmitter's adaptation
        d = pmt.make_dict()
        d = pmt.dict_add(d, _KEYS["peer"], pmt.from_long(peer))
        if snr_db is not None:
            d = pmt.dict_add(d, _KEYS["snr_db"], pmt.from_double(snr_db))
        d = pmt.dict_add(d, _KEYS["sent"], pmt.from_long(acked + lost))
        d = pmt.dict_add(d, _KEYS["lost"], pmt.from_long(lost))
        self.message_port_pub(_PORTS["mcs_feedback"], d)

    def _publish_delivered(self, src: int, payload: bytes) -> None:
        meta = pmt.make_dict()
        meta = pmt.dict_add(meta, _KEYS["src"], pmt.from_long(src))
        meta = pmt.dict_add(meta, _KEYS["dst"], pmt.from_long(self.node_id))
        meta = pmt.dict_add(meta, _KEYS["size"], pmt.from_long(len(payload)))
        self.message_port_pub(_PORTS["delivered"], pmt.cons(meta, _u8(payload)))

    def _publish_status(
        self,
        meta: pmt.pmt_t,
        dst: int,
        size: int,
        msg_id: int | None,
        status: str,
        reason: str,
        elapsed: float | None,
    ) -> None:
        out = meta if pmt.is_dict(meta) else pmt.make_dict()
        out = pmt.dict_add(out, _KEYS["dst"], pmt.from_long(dst))
        out = pmt.dict_add(out, _KEYS["size"], pmt.from_long(size))
        if msg_id is not None:
            out = pmt.dict_add(out, _KEYS["msg_id"], pmt.from_long(msg_id))
        out = pmt.dict_add(out, _KEYS["status"], pmt.intern(status))
        out = pmt.dict_add(out, _KEYS["reason"], pmt.intern(reason))
        if elapsed is not None:
            out = pmt.dict_add(out, _KEYS["elapsed"], pmt.from_double(elapsed))
        self.message_port_pub(_PORTS["status"], pmt.cons(out, pmt.init_u8vector(0, [])))


class frame_drop(gr.basic_block):  # noqa: N801 - GNU Radio block naming
    """Drops a seeded random fraction of the PDUs passing from "in" to "out" (test channel).

    Place it between the receive chain and the ARQ (frame_parser "out" -> frame_drop ->
    link_arq "frames_in") or before frame_builder to emulate frames lost on the air.
    ``only_data`` limits the drops to DATA frames (metadata type 0), so ACKs always pass.
    """

    def __init__(self, drop_rate: float = 0.1, seed: int = 0, only_data: bool = False) -> None:
        gr.basic_block.__init__(self, name="frame_drop", in_sig=None, out_sig=None)
        self.set_drop_rate(drop_rate)
        self.only_data = bool(only_data)
        self._rng = random.Random(seed)
        self.passed = 0
        self.dropped = 0
        self.message_port_register_in(_PORTS["in"])
        self.message_port_register_out(_PORTS["out"])
        self.set_msg_handler(_PORTS["in"], self._handle)

    def set_drop_rate(self, drop_rate: float) -> None:
        """Fraction of PDUs to drop, 0..1."""
        if not 0.0 <= float(drop_rate) <= 1.0:
            raise ValueError(f"drop_rate must be in [0, 1], got {drop_rate}")
        self.drop_rate = float(drop_rate)

    def _handle(self, msg: pmt.pmt_t) -> None:
        eligible = True
        if self.only_data and pmt.is_pair(msg):
            eligible = _meta_int(pmt.car(msg), "type") in (None, 0)
        if eligible and self._rng.random() < self.drop_rate:
            self.dropped += 1
            return
        self.passed += 1
        self.message_port_pub(_PORTS["out"], msg)
