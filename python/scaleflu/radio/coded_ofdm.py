"""Coded OFDM hier blocks: per-frame MCS (BPSK .. 64-QAM, K = 7 code at 1/2, 2/3, 3/4).

``coded_ofdm_tx``: PDU in (message port "in"; metadata "mcs" per PDU, else the block's MCS,
or the link adaptation policy's choice with ``mcs="adaptive"``) -> C++ ``coded_ofdm_mod``
(link frame, SIGNAL field, 802.11a coding chain, one burst + ``post_padding`` zeros per PDU)
-> complex samples out. Message port "feedback" takes SNR reports for the adaptive mode.

``coded_ofdm_rx``: complex samples in -> ``ofdm_preamble_sync`` (Schmidl & Cox detection, timing
from the cross-correlation with the second sync symbol) -> header/payload demux (gr-digital's or
``ofdm_burst_demux``) -> FFT -> channel estimate -> ``coded_signal_decoder`` (MCS and length of
each frame from its SIGNAL field, so frames of any MCS follow each other without
reconfiguration) -> FFT -> ``coded_ofdm_demod`` (pilot phase tracking, LLRs, Viterbi, CRC32) ->
``frame_parser`` -> frames out on "out", with "mcs" and "snr_db" in their metadata. Message port
"report": one dict per frame ({"header_ok", "crc_ok", "mcs", "snr_db", ...}).

The padding and buffer choices of ``scaleflu.radio.ofdm`` apply (docs/link.md 8.3): zeros after
every burst (the last frame is flushed), a verdict for every detected frame (an impossible
SIGNAL is #f, never a stall), buffers sized for the longest frame of the lowest MCS. The
detector differs from gr-digital's ``ofdm_sync_sc_cfb``: its metric threshold is 0.2, not 0.9
(the normalised metric of a frame at SNR s is about (s / (1 + s))^2, 0.64 at 6 dB, so 0.9 misses
every frame below about 12 dB, where the low-rate codes work), noise crossing it is rejected by
the cross-correlation, and the timing comes from that correlation peak instead of the middle of
the metric's plateau (which wanders by several samples at low SNR: docs/link.md, "Coded OFDM PHY").
"""

from __future__ import annotations

import logging
from typing import Any

import pmt
from gnuradio import analog, blocks, fft, gr
from gnuradio import digital as _digital
from gnuradio.digital import ofdm_txrx as _ofdm_txrx

from scaleflu.link.mcs import (
    ADAPTIVE,
    MCS,
    MCS_TABLE,
    McsPolicy,
    McsPolicyConfig,
    frame_samples,
    parse_mcs,
    payload_symbols,
)

from .ofdm import DEFAULT_POST_PADDING, LEN_TAG_KEY, _cpp, _set_min_buffer, ofdm_carriers

__all__ = [
    "DEFAULT_SYNC_THRESHOLD",
    "coded_available",
    "coded_ofdm_rx",
    "coded_ofdm_tx",
    "mcs_adapter",
    "sync_words",
]

logger = logging.getLogger(__name__)

FFT_LEN = 64  # the coded PHY uses 802.11a's subcarrier layout
DEFAULT_SYNC_THRESHOLD = 0.2
DEFAULT_MIN_XCORR = 0.3
HEADER_SYMBOLS = 4  # 2 sync + 2 SIGNAL


def coded_available() -> bool:
    """Whether this build has the coded PHY's C++ blocks."""
    return all(
        hasattr(_cpp(), n) for n in ("coded_ofdm_mod", "coded_signal_decoder", "coded_ofdm_demod")
    )


def sync_words() -> tuple[list[complex], list[complex]]:
    """gr-digital's two Schmidl & Cox sync symbols for the 64-point layout (shifted order)."""
    occ, pil, _ = ofdm_carriers(FFT_LEN)
    sw1 = [complex(x) for x in _ofdm_txrx._make_sync_word1(FFT_LEN, occ, pil)]
    sw2 = [complex(x) for x in _ofdm_txrx._make_sync_word2(FFT_LEN, occ, pil)]
    return sw1, sw2


def _mcs_index(value: int | str | MCS) -> int:
    m = parse_mcs(value)
    if not isinstance(m, MCS):
        raise ValueError("a fixed MCS is needed here, not 'adaptive'")
    return m.index


def _frame_dst(meta: Any, data: Any) -> int | None:
    """Destination of a PDU for the adaptation: metadata "dst", or a raw frame's dst field."""
    if not pmt.is_dict(meta):
        return None
    dst = pmt.dict_ref(meta, pmt.intern("dst"), pmt.PMT_NIL)
    if pmt.is_integer(dst):
        return int(pmt.to_long(dst))
    raw = pmt.dict_ref(meta, pmt.intern("raw"), pmt.PMT_F)
    if pmt.eq(raw, pmt.PMT_T) and pmt.is_u8vector(data) and pmt.length(data) >= 8:
        b = pmt.u8vector_elements(data)
        return (b[6] << 8) | b[7]
    return None


class mcs_adapter(gr.basic_block):  # noqa: N801 - GNU Radio block naming
    """Applies an ``McsPolicy`` to the PDUs on their way to a ``coded_ofdm_mod``.

    Message ports: "in" PDUs -> "out" PDUs; "feedback" dicts with "snr_db" (a number) and
    optionally "peer" (or "node": the node whose reception it describes; absent: the whole
    link) and "crc_ok" (False: that frame was lost), and/or "sent" and "lost" (frames whose
    fate an ACK settled, and those it proved lost: ``McsPolicy.outcome``). ``coded_ofdm_rx``'s
    "report" dicts and ``link_arq``'s "mcs_feedback" dicts (from the peer's ACKs) are such
    feedback. Malformed feedback is ignored and counted.

    With ``target`` (the modulator) the choice is made late: the policy's MCS for each
    destination is written into the modulator's table (``set_dst_mcs``) after every report and
    every PDU, and the PDU passes unchanged, so frames queued in the modulator when a report
    arrives go out at the new MCS. Without it each PDU's metadata gets "mcs".
    """

    def __init__(self, policy: McsPolicy | None = None, target: Any = None) -> None:
        gr.basic_block.__init__(self, "mcs_adapter", in_sig=None, out_sig=None)
        self.policy = policy or McsPolicy()
        self.target = target
        self.stamped = 0
        self.feedback = 0
        self.bad_feedback = 0
        self.message_port_register_in(pmt.intern("in"))
        self.message_port_register_in(pmt.intern("feedback"))
        self.message_port_register_out(pmt.intern("out"))
        self.set_msg_handler(pmt.intern("in"), self._on_pdu)
        self.set_msg_handler(pmt.intern("feedback"), self._on_feedback)
        if target is not None:
            target.set_mcs(self.policy.choose(None))

    def _apply(self, peer: int | None) -> int:
        mcs = self.policy.choose(peer)
        if self.target is not None:
            if peer is None:
                self.target.set_mcs(mcs)
            elif 0 <= peer <= 0xFFFF:
                self.target.set_dst_mcs(peer, mcs)
        return mcs

    def _on_pdu(self, msg: Any) -> None:
        if not pmt.is_pair(msg):
            return
        meta, data = pmt.car(msg), pmt.cdr(msg)
        if not pmt.is_dict(meta):
            meta = pmt.make_dict()
        if pmt.is_null(pmt.dict_ref(meta, pmt.intern("mcs"), pmt.PMT_NIL)):
            mcs = self._apply(_frame_dst(meta, data))
            if self.target is None:
                meta = pmt.dict_add(meta, pmt.intern("mcs"), pmt.from_long(mcs))
                self.stamped += 1
        self.message_port_pub(pmt.intern("out"), pmt.cons(meta, data))

    def _on_feedback(self, msg: Any) -> None:
        try:
            d = pmt.to_python(msg)
            if not isinstance(d, dict) or ("snr_db" not in d and "sent" not in d):
                raise ValueError("neither snr_db nor sent")
            snr = None if d.get("snr_db") is None else float(d["snr_db"])
            peer = d.get("peer", d.get("node"))
            peer = None if peer is None else int(peer)
            ok = d.get("crc_ok")
            ok = None if ok is None else bool(ok)
            sent = lost = 0
            if "sent" in d:
                sent, lost = int(d["sent"]), int(d.get("lost", 0))
                if not 0 <= lost <= sent <= 1 << 32:
                    raise ValueError(f"sent {sent} / lost {lost}")
        except (TypeError, ValueError, OverflowError) as exc:
            self.bad_feedback += 1
            logger.debug("ignoring MCS feedback %r: %s", msg, exc)
            return
        self.feedback += 1
        if snr is not None:
            self.policy.report(peer, snr, ok)
        if sent:
            self.policy.outcome(peer, sent, lost)
        self._apply(peer)


class coded_ofdm_tx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """PDU in (port "in"; header fields, optional "mcs" in metadata) -> coded OFDM bursts out.

    ``mcs``: an MCS name ("bpsk-1/2" .. "64qam-3/4", "qpsk-uncoded"), its index, or
    ``"adaptive"`` (default): the MCS of each PDU comes from ``policy`` (an ``McsPolicy``),
    fed by SNR reports on message port "feedback"; without reports it sends at the most
    robust MCS. ``framing``: PDUs become scaleflu link frames (as ``ofdm_link_tx``); False: the
    PDU's bytes are sent as they are (at most ``mtu``). Bursts have unit mean power times
    ``amplitude``.
    """

    def __init__(
        self,
        mtu: int = 1500,
        src: int = 0,
        dst: int = 0xFFFF,
        mcs: int | str = ADAPTIVE,
        cp_len: int = 16,
        post_padding: int = DEFAULT_POST_PADDING,
        amplitude: float = 1.0,
        framing: bool = True,
        policy: McsPolicy | None = None,
        policy_config: McsPolicyConfig | None = None,
        len_tag_key: str = LEN_TAG_KEY,
    ) -> None:
        gr.hier_block2.__init__(
            self,
            "coded_ofdm_tx",
            gr.io_signature(0, 0, 0),
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
        )
        parsed = parse_mcs(mcs)
        self.adaptive = parsed == ADAPTIVE
        default = 0 if self.adaptive else parsed.index  # type: ignore[union-attr]
        sw1, sw2 = sync_words()
        self.cp_len, self.post_padding, self.mtu = cp_len, post_padding, mtu
        self.framer = _cpp().coded_ofdm_mod(
            sw1, sw2, cp_len, default, mtu, post_padding, framing, src, dst, len_tag_key
        )
        self.framer.set_amplitude(float(amplitude))
        # the longest burst must fit the output buffer of the modulator and its readers
        self.adapter = mcs_adapter(
            policy or McsPolicy(policy_config), self.framer if self.adaptive else None
        )
        self.message_port_register_hier_in("in")
        self.message_port_register_hier_in("feedback")
        self.msg_connect(self, "feedback", self.adapter, "feedback")
        if self.adaptive:
            self.msg_connect(self, "in", self.adapter, "in")
            self.msg_connect(self.adapter, "out", self.framer, "in")
        else:
            self.msg_connect(self, "in", self.framer, "in")
        self.connect(self.framer, self)

    @property
    def policy(self) -> McsPolicy:
        """The adaptation policy (also present, unused, for a fixed MCS)."""
        return self.adapter.policy

    def set_mcs(self, mcs: int | str) -> None:
        """MCS of PDUs without "mcs" metadata. An adaptive transmitter stays adaptive (a fixed
        MCS is refused) and a fixed one stays fixed ("adaptive" is refused): the wiring differs.
        """
        if parse_mcs(mcs) == ADAPTIVE:
            if not self.adaptive:
                raise ValueError("this transmitter was built with a fixed MCS, not 'adaptive'")
            return
        if self.adaptive:
            raise ValueError("this transmitter was built adaptive; give PDUs 'mcs' metadata")
        self.framer.set_mcs(_mcs_index(mcs))

    def set_output_bursts(self, bursts: int) -> None:
        """Room for ``bursts`` of the longest burst in the modulator's output buffer (before
        the flowgraph starts). The modulator holds two; a slow reader (a Python block) then
        makes it wait for each burst (64 bpsk-1/2 frames took 7.5 s to reach the shared
        medium's Python tap, 0.05 s with 8). More room also lets it modulate further ahead of
        link adaptation (frames take their MCS when they are modulated)."""
        longest = max(frame_samples(m, self.mtu, self.cp_len, self.post_padding) for m in MCS_TABLE)
        self.framer.set_min_output_buffer(0, max(8192, 1 << (bursts * longest).bit_length()))

    def set_amplitude(self, amplitude: float) -> None:
        """RMS amplitude of the bursts (1: unit mean power)."""
        self.framer.set_amplitude(float(amplitude))

    def frames_built(self) -> int:
        """Bursts put out."""
        return int(self.framer.frames_built())

    def frames_per_mcs(self) -> dict[str, int]:
        """Bursts put out per MCS name."""
        return {
            m.name: int(n) for m, n in zip(MCS_TABLE, self.framer.frames_per_mcs(), strict=True)
        }


class coded_ofdm_rx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """Complex samples in -> frames out (port "out") and one report per frame (port "report").

    ``framing``: the PSDUs go through ``frame_parser(node_id, mtu)`` (CRC-checked scaleflu
    frames, header fields in metadata; ``raw_frames``: whole frames, as link_arq takes them);
    False: the PSDUs themselves. Either way the metadata carries "mcs" and "snr_db".
    ``symbols_out`` > 0 adds a complex stream output with that many equalised data
    subcarrier values of each frame (unit-power constellation), for a constellation display.
    ``blocking_demux`` as in ``ofdm_link_rx`` (receivers fed bursts only). With ``node_id`` >= 0
    the reports carry "node" = node_id, so a transmitter's ``mcs_adapter`` fed with them knows
    which destination they describe.
    """

    def __init__(
        self,
        node_id: int = -1,
        mtu: int = 1500,
        cp_len: int = 16,
        sync_threshold: float = DEFAULT_SYNC_THRESHOLD,
        min_xcorr: float = DEFAULT_MIN_XCORR,
        raw_frames: bool = False,
        framing: bool = True,
        blocking_demux: bool = False,
        symbols_out: int = 0,
        min_output_buffer: int | None = None,
    ) -> None:
        gr.hier_block2.__init__(
            self,
            "coded_ofdm_rx",
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
            gr.io_signature(1, 1, gr.sizeof_gr_complex)
            if symbols_out
            else gr.io_signature(0, 0, 0),
        )
        if not 0 < sync_threshold < 1 or not 0 < min_xcorr < 1:
            raise ValueError(
                f"sync_threshold and min_xcorr must be in (0, 1), got {sync_threshold}, {min_xcorr}"
            )
        sym_len = FFT_LEN + cp_len
        max_syms = max(payload_symbols(m, mtu) for m in MCS_TABLE)
        stream_buf = min_output_buffer or max(
            8192, 1 << (4 * (max_syms + HEADER_SYMBOLS) * sym_len).bit_length()
        )
        vec_buf = max(64, 1 << (4 * max_syms).bit_length())
        frame_key = "frame_len"
        self.message_port_register_hier_out("out")
        self.message_port_register_hier_out("report")
        sw1, sw2 = sync_words()

        self.gate = blocks.tag_gate(gr.sizeof_gr_complex, False)
        self.sync = _cpp().ofdm_preamble_sync(
            FFT_LEN, cp_len, sw1, sw2, float(sync_threshold), float(min_xcorr), 4
        )
        delay = blocks.delay(gr.sizeof_gr_complex, self.sync.delay())
        osc = analog.frequency_modulator_fc(-2.0 / FFT_LEN)
        mixer = blocks.multiply_cc()
        if blocking_demux:
            from .ofdm import burst_demux_available

            if not burst_demux_available():
                raise ValueError("blocking_demux needs the compiled ofdm_burst_demux")
            hpd = _cpp().ofdm_burst_demux(HEADER_SYMBOLS, FFT_LEN, cp_len, frame_key, max_syms)
        else:
            hpd = _digital.header_payload_demux(
                HEADER_SYMBOLS, FFT_LEN, cp_len, frame_key, "", True
            )
        self.hpd = hpd
        self.blocking_demux = bool(blocking_demux)
        for b in (self.gate, delay, osc, mixer, self.sync):
            _set_min_buffer(b, stream_buf)
        hpd.set_log_level("warn")
        hpd.set_min_output_buffer(0, vec_buf)
        hpd.set_min_output_buffer(1, vec_buf)
        self.connect(self, self.gate, self.sync)
        self.connect(self.gate, delay, (mixer, 0), (hpd, 0))
        self.connect((self.sync, 0), osc, (mixer, 1))
        self.connect((self.sync, 1), (hpd, 1))

        hdr_fft = fft.fft_vcc(FFT_LEN, True, (), True)
        chanest = _digital.ofdm_chanest_vcvc(sw1, sw2, 2)
        self.signal = _cpp().coded_signal_decoder(mtu, frame_key)
        self.connect((hpd, 0), hdr_fft, chanest, self.signal)
        if self.blocking_demux:
            self.signal.set_demux(hpd)
        else:
            self.msg_connect(self.signal, "header_data", hpd, "header_data")

        pay_fft = fft.fft_vcc(FFT_LEN, True, (), True)
        _set_min_buffer(pay_fft, vec_buf)
        self.demod = _cpp().coded_ofdm_demod(mtu, frame_key, int(symbols_out))
        self.connect((hpd, 1), pay_fft, self.demod)
        if node_id >= 0:  # the reports say which receiver heard the frame
            self.signal.set_node_id(int(node_id))
            self.demod.set_node_id(int(node_id))
        self.msg_connect(self.signal, "report", self, "report")
        self.msg_connect(self.demod, "report", self, "report")
        self.parser = None
        if framing:
            self.parser = _cpp().frame_parser(node_id, mtu)
            if raw_frames:
                self.parser.set_raw_output(True)
            self.msg_connect(self.demod, "out", self.parser, "in")
            self.msg_connect(self.parser, "out", self, "out")
        else:
            self.msg_connect(self.demod, "out", self, "out")
        if symbols_out:
            from gnuradio import pdu

            self.to_stream = pdu.pdu_to_tagged_stream(gr.types.complex_t, "sym_len")
            self.msg_connect(self.demod, "symbols", self.to_stream, "pdus")
            self.connect(self.to_stream, self)

    def frames_ok(self) -> int:
        """Frames that passed the PHY CRC32 (and, with framing, the frame checks)."""
        if self.parser is not None:
            return int(self.parser.frames_ok())
        return int(self.demod.frames_ok())

    def crc_errors(self) -> int:
        """Frames whose SIGNAL was valid but whose payload failed the PHY CRC32."""
        return int(self.demod.crc_errors())

    def malformed(self) -> int:
        """PSDUs that passed the PHY CRC32 but are not valid link frames (framing only)."""
        return 0 if self.parser is None else int(self.parser.malformed())

    def headers_rejected(self) -> int:
        """SIGNAL fields rejected (CRC-16, version, unknown MCS, bad length)."""
        s = self.signal
        return int(s.crc_failed() + s.version_mismatch() + s.unknown_mcs() + s.bad_length())

    def counters(self) -> dict[str, Any]:
        """Every counter of the receiver, frames per MCS included."""
        s = self.signal
        return {
            "headers": int(s.headers()),
            "headers_ok": int(s.passed()),
            "signal_crc": int(s.crc_failed()),
            "signal_version": int(s.version_mismatch()),
            "signal_unknown_mcs": int(s.unknown_mcs()),
            "signal_bad_length": int(s.bad_length()),
            "payload_ok": int(self.demod.frames_ok()),
            "payload_crc": int(self.demod.crc_errors()),
            "payload_bad": int(self.demod.bad_frames()),
            "frames_ok": self.frames_ok(),
            "malformed": self.malformed(),
            "last_snr_db": float(self.demod.last_snr_db()),
            "ok_per_mcs": {
                m.name: int(n)
                for m, n in zip(MCS_TABLE, self.demod.frames_ok_per_mcs(), strict=True)
            },
        }
