"""OFDM link hier blocks: scaleflu frames over stock gr-digital OFDM (QPSK payload, BPSK header).

``ofdm_link_tx``: PDU in (message port "in") -> frame_builder -> digital.ofdm_tx -> zero padding
after every burst (digital.burst_shaper_cc) -> amplitude scaling -> complex samples out.

``ofdm_link_rx``: complex samples in -> digital.ofdm_rx -> pdu.tagged_stream_to_pdu ->
frame_parser -> CRC-checked frame PDUs out (message port "out", header fields in metadata).

Why the padding and the buffers (docs/link.md 8.3; benchmarks/link_bench.py measures them): the
Schmidl & Cox detector of the stock receiver misses about 5 % of abutting frames, so every burst
is followed by ``post_padding`` zero samples; the zeros also push the last burst through the
receiver so it is not stuck in the pipeline when no more samples come. Frames of 600 B or more
need larger minimum output buffers than GNU Radio picks ("Buffer too small for
min_noutput_items"); ``min_output_buffer`` sets them on the stock hier blocks.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pmt
from gnuradio import analog, blocks, digital, fft, gr, pdu
from gnuradio.digital import ofdm_txrx as _ofdm_txrx


def _cpp() -> Any:
    """The compiled blocks (``gnuradio.scaleflu``), imported when a block is built, not when this
    module loads: that package star-imports :mod:`scaleflu.radio.blocks`, which imports this
    module, so an import at load time would run in a circle whichever of the two came first."""
    try:
        from gnuradio import scaleflu
    except ImportError as exc:  # pragma: no cover - build problem, say so plainly
        raise ImportError(f"gnuradio.scaleflu (the C++ blocks) is not importable: {exc}") from exc
    return scaleflu


__all__ = [
    "DEFAULT_POST_PADDING",
    "burst_demux_available",
    "ofdm_carriers",
    "auto_min_output_buffer",
    "ofdm_link_rx",
    "ofdm_link_tx",
    "samples_per_frame",
]

logger = logging.getLogger(__name__)


def burst_demux_available() -> bool:
    """Whether this build has ``ofdm_burst_demux`` and the header parser guard it needs."""
    cpp = _cpp()
    return hasattr(cpp, "ofdm_burst_demux") and hasattr(cpp, "header_parser_guard")


LEN_TAG_KEY = "packet_len"
DEFAULT_POST_PADDING = 160  # zero samples after each burst (2 OFDM symbols at FFT 64, CP 16)

try:  # gr-digital's default 127-symbol pilot sequence (4 pilots), reused for every FFT size
    from gnuradio.digital.ofdm_txrx import _def_pilot_symbols as _PILOT_SYMBOLS
except ImportError:  # pragma: no cover - private name moved
    _PILOT_SYMBOLS = ((1, 1, 1, -1), (-1, -1, -1, 1))


def ofdm_carriers(
    fft_len: int,
) -> tuple[tuple[tuple[int, ...]], tuple[tuple[int, ...]], tuple[tuple[int, ...], ...]]:
    """Occupied carriers, pilot carriers and pilot symbols for ``fft_len``.

    FFT 64 gives exactly gr-digital's defaults (48 data + 4 pilots); other sizes scale the same
    layout (about 81 % of the band occupied, DC empty, 4 pilots at +-7/26 and +-21/26 of the edge).
    """
    if fft_len == 64:
        occ = tuple(list(range(-26, -21)) + list(range(-20, -7)) + list(range(-6, 0)))
        occ = occ + tuple(range(1, 7)) + tuple(range(8, 21)) + tuple(range(22, 27))
        pil = (-21, -7, 7, 21)
    else:
        if fft_len < 16 or fft_len & (fft_len - 1):
            raise ValueError(f"fft_len must be a power of two >= 16, got {fft_len}")
        half = int(fft_len * 26 // 64)
        p_out = max(2, round(half * 21 / 26))
        p_in = max(1, round(half * 7 / 26))
        if p_in == p_out:
            p_in = max(1, p_out - 1)
        pil = (-p_out, -p_in, p_in, p_out)
        occ = tuple(k for k in range(-half, half + 1) if k != 0 and k not in pil)
    return (occ,), (pil,), tuple(tuple(r) for r in _PILOT_SYMBOLS)


def samples_per_frame(
    frame_bytes: int,
    fft_len: int = 64,
    cp_len: int = 16,
    bps_payload: int = 2,
    post_padding: int = DEFAULT_POST_PADDING,
) -> int:
    """Samples on air for one frame of ``frame_bytes`` (2 sync + 1 header symbols + payload)."""
    occ, _, _ = ofdm_carriers(fft_len)
    bits = 8 * (frame_bytes + 4)  # the stock chain appends its own CRC32
    n_sym = math.ceil(bits / (len(occ[0]) * bps_payload))
    return (3 + n_sym) * (fft_len + cp_len) + post_padding


def auto_min_output_buffer(mtu: int, bps_payload: int) -> int:
    """Minimum output buffer (items) that lets frames of ``mtu`` bytes through the stock chain.

    Four times the payload symbols of one frame, as a power of two, at least 8192: 32768 for
    1500 B QPSK (measured: 16384 stalls the chain, 32768 and 2^17 work; 2^17 runs about half as
    fast on 2 cores because the vector buffers grow to 64 MiB each).
    """
    need = 4 * (mtu + 4) * 8 // max(1, bps_payload)
    return max(8192, 1 << (need - 1).bit_length())


def _set_min_buffer(block, n: int) -> None:
    if n < 0:
        return
    impl = getattr(block, "_impl", block)
    # GNU Radio logs each call at INFO ("set_min_output_buffer on block 16 to 32768", 72 lines
    # for the loopback): that is our sizing, not news. Quiet the block's logger first.
    if hasattr(impl, "set_log_level"):
        impl.set_log_level("warn")
    impl.set_min_output_buffer(n)


class ofdm_link_tx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """PDU in (port "in", header fields in metadata) -> OFDM bursts (complex) out."""

    def __init__(
        self,
        mtu: int = 1500,
        src: int = 0,
        dst: int = 0xFFFF,
        fft_len: int = 64,
        cp_len: int = 16,
        bps_header: int = 1,
        bps_payload: int = 2,
        scramble_bits: bool = True,
        post_padding: int = DEFAULT_POST_PADDING,
        pre_padding: int = 0,
        amplitude: float = 1.0,
        min_output_buffer: int | None = None,
        len_tag_key: str = LEN_TAG_KEY,
    ) -> None:
        gr.hier_block2.__init__(
            self,
            "ofdm_link_tx",
            gr.io_signature(0, 0, 0),
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
        )
        if post_padding < 0 or pre_padding < 0:
            raise ValueError("padding must be >= 0")
        occ, pil, psym = ofdm_carriers(fft_len)
        mob = min_output_buffer or auto_min_output_buffer(mtu, bps_payload)
        self.fft_len, self.cp_len = fft_len, cp_len
        self.bps_header, self.bps_payload = bps_header, bps_payload
        self.post_padding = post_padding
        self.message_port_register_hier_in("in")
        self.framer = _cpp().frame_builder(mtu, src, dst, len_tag_key)
        self.ofdm = digital.ofdm_tx(
            fft_len=fft_len,
            cp_len=cp_len,
            packet_length_tag_key=len_tag_key,
            occupied_carriers=occ,
            pilot_carriers=pil,
            pilot_symbols=psym,
            bps_header=bps_header,
            bps_payload=bps_payload,
            rolloff=0,
            scramble_bits=scramble_bits,
        )
        _set_min_buffer(self.ofdm, mob)
        self.gain = blocks.multiply_const_cc(complex(amplitude))
        self.msg_connect(self, "in", self.framer, "in")
        self.connect(self.framer, self.ofdm)
        head = self.ofdm
        if pre_padding:
            # digital.burst_shaper_cc pads before the burst; its post padding is not used
            # because it is only written out when the *next* burst arrives (forecast needs
            # input), so the last burst would wait in the transmitter.
            self.shaper = digital.burst_shaper_cc([], pre_padding, 0, False, len_tag_key)
            _set_min_buffer(self.shaper, mob)
            self.connect(head, self.shaper)
            head = self.shaper
        if post_padding:
            # Zeros after each burst, appended at once: a tagged-stream mux takes one packet
            # from the OFDM burst and one packet of post_padding zeros from an endless
            # tagged zero source (back-pressured, so it costs nothing while idle).
            zero_tag = gr.tag_utils.python_to_tag(
                (0, pmt.intern(len_tag_key), pmt.from_long(post_padding), pmt.PMT_NIL)
            )
            self.zeros = blocks.vector_source_c([0j] * post_padding, True, 1, [zero_tag])
            self.pad = blocks.tagged_stream_mux(gr.sizeof_gr_complex, len_tag_key, 0)
            _set_min_buffer(self.pad, mob)
            self.connect(head, (self.pad, 0))
            self.connect(self.zeros, (self.pad, 1))
            head = self.pad
        self.connect(head, self.gain, self)

    def set_amplitude(self, amplitude: float) -> None:
        """Scale of the output samples (the stock modulator's RMS is about 13 at FFT 64)."""
        self.gain.set_k(complex(amplitude))

    def frames_built(self) -> int:
        """Frames the frame builder has put out."""
        return int(self.framer.frames_built())


class ofdm_link_rx(gr.hier_block2):  # noqa: N801 - GNU Radio block naming
    """Complex samples in -> CRC-checked frame PDUs out (port "out").

    The receiver is gr-digital's ofdm_rx, block for block (Schmidl & Cox sync, header/payload
    demux, simple DFE equalisers, CRC32), with two changes: a header guard (the C++ block
    scaleflu.header_parser_guard, packet_headerparser_b and the guard in one block, or
    scaleflu.header_guard after it on an older build: OFDM headers announcing more than ``mtu``
    bytes are rejected, since a
    noisy header that passes its 8-bit CRC would otherwise stall the demux for good)
    and minimum output buffers sized for frames of ``mtu`` bytes on each block rather than one
    size everywhere. Stream tags at the input are dropped (a radio never passes tags; a
    transmitter's own "packet_len" tags in the same flowgraph would corrupt the receiver).
    With ``raw_frames`` the PDUs carry the whole checked frame (metadata "raw" = #t plus the
    header fields) instead of its payload: what link_arq's "frames_in" takes without Python
    re-encoding. ``blocking_demux`` puts our ``ofdm_burst_demux`` in place of gr-digital's
    header/payload demux (less CPU; for receivers fed bursts only, see docs/link.md 8.3).
    """

    def __init__(
        self,
        node_id: int = -1,
        fft_len: int = 64,
        cp_len: int = 16,
        bps_header: int = 1,
        bps_payload: int = 2,
        scramble_bits: bool = True,
        mtu: int = 1500,
        min_output_buffer: int | None = None,
        len_tag_key: str = LEN_TAG_KEY,
        guard_headers: bool = True,
        symbols_out: bool = False,
        raw_frames: bool = False,
        blocking_demux: bool = False,
    ) -> None:
        gr.hier_block2.__init__(
            self,
            "ofdm_link_rx",
            gr.io_signature(1, 1, gr.sizeof_gr_complex),
            # symbols_out: the equalised payload symbols (complex) for a constellation display
            gr.io_signature(1, 1, gr.sizeof_gr_complex)
            if symbols_out
            else gr.io_signature(0, 0, 0),
        )
        occ, pil, psym = ofdm_carriers(fft_len)
        n_data = len(occ[0])
        frame_key = "frame_len"
        max_packet = mtu + 4  # the stock chain's own CRC32 rides in its packet length
        max_syms = 1 + math.ceil(8 * max_packet / (n_data * bps_payload))
        sym_len = fft_len + cp_len
        stream_buf = min_output_buffer or max(
            8192, 1 << (4 * (max_syms + 3) * sym_len).bit_length()
        )
        vec_buf = max(64, 1 << (4 * max_syms).bit_length())
        bit_buf = max(8192, 1 << (4 * 8 * max_packet // bps_payload).bit_length())
        self.message_port_register_hier_out("out")
        sw1 = _ofdm_txrx._make_sync_word1(fft_len, occ, pil)
        sw2 = _ofdm_txrx._make_sync_word2(fft_len, occ, pil)
        seed = 0x7F if scramble_bits else 0x00

        self.gate = blocks.tag_gate(gr.sizeof_gr_complex, False)
        sync = digital.ofdm_sync_sc_cfb(fft_len, cp_len)
        delay = blocks.delay(gr.sizeof_gr_complex, sym_len)
        osc = analog.frequency_modulator_fc(-2.0 / fft_len)
        mixer = blocks.multiply_cc()
        # blocking_demux: our header/payload demux, which sleeps until the header parser hands
        # it the header's verdict; the stock one polls on a core meanwhile (docs/link.md 9.4.1).
        # It needs the C++ header parser + guard (the verdict is handed over directly).
        can_block = guard_headers and burst_demux_available()
        # Off by default: ours is measured only on receivers fed bursts; one that hears noise
        # and other nodes' bursts between its frames (the shared medium, a real radio) is not
        # validated (docs/link.md 8.3 item 5). The simulated per-pair links turn it on
        # (PhyConfig.rx).
        if blocking_demux and not can_block:
            raise ValueError("blocking_demux needs the compiled ofdm_burst_demux and header guard")
        self.blocking_demux = bool(blocking_demux)
        if self.blocking_demux:
            hpd = _cpp().ofdm_burst_demux(3, fft_len, cp_len, frame_key, max_syms)
        else:
            hpd = digital.header_payload_demux(3, fft_len, cp_len, frame_key, "", True)
        self.hpd = hpd
        for b in (self.gate, delay, osc, mixer):
            _set_min_buffer(b, stream_buf)
        _set_min_buffer(sync, stream_buf)
        hpd.set_log_level("warn")
        hpd.set_min_output_buffer(0, vec_buf)
        hpd.set_min_output_buffer(1, vec_buf)
        self.connect(self, self.gate, sync)
        self.connect(self.gate, delay, (mixer, 0), (hpd, 0))
        self.connect((sync, 0), osc, (mixer, 1))
        self.connect((sync, 1), (hpd, 1))

        hdr_const = _ofdm_txrx._get_constellation(bps_header)
        hdr_fft = fft.fft_vcc(fft_len, True, (), True)
        chanest = digital.ofdm_chanest_vcvc(sw1, sw2, 1)
        hdr_equalizer = digital.ofdm_equalizer_simpledfe(
            fft_len, hdr_const.base(), occ, pil, psym, symbols_skipped=0
        )
        hdr_eq = digital.ofdm_frame_equalizer_vcvc(hdr_equalizer.base(), cp_len, frame_key, True, 1)
        hdr_ser = digital.ofdm_serializer_vcc(fft_len, occ, frame_key)
        hdr_demod = digital.constellation_decoder_cb(hdr_const.base())
        hdr_format = digital.packet_header_ofdm(
            occ,
            1,
            len_tag_key,
            frame_key,
            "packet_num",
            bps_header,
            bps_payload,
            scramble_header=scramble_bits,
        )
        # header_data counts the packet in payload symbols (bits / bps), not bytes
        max_symbols = math.ceil(8 * max_packet / bps_payload)
        if guard_headers and hasattr(_cpp(), "header_parser_guard"):
            # parser and guard in one C++ block: no message hop (thread wake-up) between the
            # header and the demux, which waits for it (about 10 % of this chain's CPU time
            # with packet_headerparser_b -> header_guard, measured: docs/link.md §9.4.1)
            hdr_parser = _cpp().header_parser_guard(
                occ,
                1,
                len_tag_key,
                frame_key,
                "packet_num",
                bps_header,
                bps_payload,
                scramble_bits,
                max_symbols,
            )
            self.guard = hdr_parser
            self.connect((hpd, 0), hdr_fft, chanest, hdr_eq, hdr_ser, hdr_demod, hdr_parser)
            if self.blocking_demux:
                hdr_parser.set_demux(hpd)  # the verdict straight to the waiting demux
            else:
                self.msg_connect(hdr_parser, "header_data", hpd, "header_data")
        else:
            hdr_parser = digital.packet_headerparser_b(hdr_format.formatter())
            self.guard = _cpp().header_guard(max_symbols, len_tag_key)
            self.connect((hpd, 0), hdr_fft, chanest, hdr_eq, hdr_ser, hdr_demod, hdr_parser)
            if guard_headers:
                self.msg_connect(hdr_parser, "header_data", self.guard, "in")
                self.msg_connect(self.guard, "out", hpd, "header_data")
            else:
                self.msg_connect(hdr_parser, "header_data", hpd, "header_data")

        pay_const = _ofdm_txrx._get_constellation(bps_payload)
        pay_fft = fft.fft_vcc(fft_len, True, (), True)
        pay_equalizer = digital.ofdm_equalizer_simpledfe(
            fft_len, pay_const.base(), occ, pil, psym, symbols_skipped=1, alpha=0.1
        )
        pay_eq = digital.ofdm_frame_equalizer_vcvc(pay_equalizer.base(), cp_len, frame_key)
        pay_ser = digital.ofdm_serializer_vcc(fft_len, occ, frame_key, len_tag_key, 1)
        pay_demod = digital.constellation_decoder_cb(pay_const.base())
        pack = blocks.repack_bits_bb(bps_payload, 8, len_tag_key, True)
        descrambler = digital.additive_scrambler_bb(
            0x8A, seed, 7, 0, bits_per_byte=8, reset_tag_key=len_tag_key
        )
        self.crc = digital.crc32_bb(True, len_tag_key)
        for b in (pay_fft, pay_eq):
            _set_min_buffer(b, vec_buf)
        for b in (pay_ser, pay_demod, pack, descrambler, self.crc):
            _set_min_buffer(b, bit_buf)
        self.to_pdu = pdu.tagged_stream_to_pdu(gr.types.byte_t, len_tag_key)
        try:
            self.parser = _cpp().frame_parser(node_id, mtu)
        except TypeError:  # a C++ build older than the parser's MTU check: rebuild it
            logger.warning("gnuradio.scaleflu is an old build: frame_parser has no mtu check")
            self.parser = _cpp().frame_parser(node_id)
        # raw_frames: whole checked frames out (metadata "raw" = #t), which link_arq takes as
        # they are instead of re-encoding them from the metadata in Python
        if raw_frames and hasattr(self.parser, "set_raw_output"):
            self.parser.set_raw_output(True)
        self.connect((hpd, 1), pay_fft, pay_eq, pay_ser, pay_demod, pack, descrambler)
        self.connect(descrambler, self.crc, self.to_pdu)
        if symbols_out:
            self.connect(pay_ser, self)
        self.msg_connect(self.to_pdu, "pdus", self.parser, "in")
        self.msg_connect(self.parser, "out", self, "out")

    def frames_ok(self) -> int:
        """Frames that passed the CRC and header checks."""
        return int(self.parser.frames_ok())

    def crc_errors(self) -> int:
        """Frames the stock chain passed but whose scaleflu CRC32 failed."""
        return int(self.parser.crc_errors())

    def malformed(self) -> int:
        """Frames rejected for size, magic, version, length, type or sequence."""
        return int(self.parser.malformed())

    def headers_rejected(self) -> int:
        """OFDM headers rejected by the header guard (oversized, i.e. corrupt)."""
        return int(self.guard.rejected())
