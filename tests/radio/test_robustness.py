"""CRC rejection of corrupted frames, hostile bytes into parser and ARQ block, header guard."""

from __future__ import annotations

import random
import time

import pmt
import pytest
from gnuradio import blocks, digital, gr, pdu

from scaleflu.link.frame import encode_frame
from scaleflu.radio.blocks import link_arq
from scaleflu.radio.ofdm import ofdm_carriers, ofdm_link_rx

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(60)]


def _u8(data: bytes):
    return pmt.init_u8vector(len(data), list(data))


def _wait(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.01)
    return cond()


def test_flipped_bits_rejected_by_crc():
    """Frames whose bits were flipped before the OFDM CRC reach frame_parser and fail its CRC32."""
    rng = random.Random(11)
    frames, bad = [], 0
    for i in range(40):
        raw = bytearray(
            encode_frame(0, 5, 1, 77, i, 40, bytes(rng.getrandbits(8) for _ in range(300)))
        )
        if i % 4 == 1:
            raw[rng.randrange(0, 22)] ^= 1 << rng.randrange(8)  # header bit
            bad += 1
        elif i % 4 == 2:
            raw[rng.randrange(22, len(raw))] ^= 1 << rng.randrange(8)  # payload or CRC bit
            bad += 1
        frames.append(bytes(raw))
    tb = gr.top_block()
    # the stock modulator (no scaleflu framing): corrupted bytes get a valid OFDM CRC, so only
    # the scaleflu CRC32 can catch them
    occ, pil, psym = ofdm_carriers(64)
    tx = digital.ofdm_tx(64, 16, "packet_len", occ, pil, psym, 1, 2, scramble_bits=True)
    pad = digital.burst_shaper_cc([], 160, 0, False, "packet_len")  # zeros between bursts
    p2s = pdu.pdu_to_tagged_stream(gr.types.byte_t, "packet_len")
    rx = ofdm_link_rx(node_id=1)
    debug = blocks.message_debug()
    tb.connect(p2s, tx, pad, rx)
    tb.msg_connect(rx, "out", debug, "store")
    tb.start()
    for f in frames:
        p2s.to_basic_block()._post(pmt.intern("pdus"), pmt.cons(pmt.make_dict(), _u8(f)))
        time.sleep(0.002)
    assert _wait(lambda: rx.frames_ok() + rx.crc_errors() + rx.malformed() >= len(frames) - 1)
    tb.stop()
    tb.wait()
    assert rx.crc_errors() + rx.malformed() >= bad - 1  # the very last burst may stay unflushed
    assert rx.crc_errors() >= bad // 2
    assert rx.frames_ok() >= len(frames) - bad - 1
    for i in range(debug.num_messages()):
        assert bytes(pmt.u8vector_elements(pmt.cdr(debug.get_message(i)))) in {
            f[22:-4] for f in frames
        }


def test_random_bytes_never_crash_parser_or_arq():
    """Random PDUs into frame_parser and link_arq: no crash, no hang, and both still work."""
    from gnuradio import scaleflu

    rng = random.Random(3)
    tb = gr.top_block()
    parser = scaleflu.frame_parser(-1)
    arq = link_arq(node_id=2)
    peer = link_arq(node_id=9)
    tb.msg_connect(parser, "out", arq, "frames_in")
    tb.msg_connect(arq, "frames_out", peer, "frames_in")
    tb.msg_connect(peer, "frames_out", arq, "frames_in")
    delivered = blocks.message_debug()
    tb.msg_connect(peer, "delivered", delivered, "store")
    tb.start()
    n = 3000
    for i in range(n):
        data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 300)))
        if i % 2:
            data = b"SF\x01" + data[3:]
        parser.to_basic_block()._post(pmt.intern("in"), pmt.cons(pmt.make_dict(), _u8(data)))
        arq.to_basic_block()._post(pmt.intern("frames_in"), pmt.cons(pmt.make_dict(), _u8(data)))
    assert _wait(lambda: parser.crc_errors() + parser.malformed() + parser.frames_ok() == n)
    assert _wait(lambda: arq.frames_in_count >= n)
    assert parser.frames_ok() == 0
    s = arq.stats()["arq"]
    assert s["delivered"] == 0 and s["bad_frames"] + s["crc_errors"] == n
    # still working afterwards
    h = arq.send(9, b"after the storm" * 200)
    assert h.wait(10) and h.status.value == "delivered"
    assert _wait(lambda: delivered.num_messages() == 1)
    tb.stop()
    tb.wait()


def test_header_guard_rejects_oversized_headers():
    from gnuradio import scaleflu

    guard = scaleflu.header_guard(6016)
    out = blocks.message_debug()
    tb = gr.top_block()
    tb.msg_connect(guard, "out", out, "store")
    ok = pmt.dict_add(pmt.make_dict(), pmt.intern("packet_len"), pmt.from_long(6016))
    big = pmt.dict_add(pmt.make_dict(), pmt.intern("packet_len"), pmt.from_long(16000))
    for m in (ok, big, pmt.PMT_F):
        guard.to_basic_block()._post(pmt.intern("in"), m)
    guard.to_basic_block()._post(
        pmt.intern("system"), pmt.cons(pmt.intern("done"), pmt.from_long(1))
    )
    tb.run()
    got = [out.get_message(i) for i in range(out.num_messages())]
    assert len(got) == 3 and pmt.is_dict(got[0])
    assert pmt.eq(got[1], pmt.PMT_F) and pmt.eq(got[2], pmt.PMT_F)
    assert guard.rejected() == 1 and guard.passed() == 1


def _ofdm_header_bits(packet_bytes: list[int], bps_payload: int = 2) -> list[int]:
    """Header bits (one per item, BPSK header) digital's packet_headergenerator_bb makes for
    tagged packets of the given byte lengths, with the OFDM link's header format."""
    occ, _, _ = ofdm_carriers(64)
    fmt = digital.packet_header_ofdm(
        occ, 1, "packet_len", "frame_len", "packet_num", 1, bps_payload, scramble_header=True
    )
    data, tags, off = [], [], 0
    for n in packet_bytes:
        tags.append(
            gr.tag_utils.python_to_tag(
                (off, pmt.intern("packet_len"), pmt.from_long(n), pmt.PMT_NIL)
            )
        )
        data += [0] * n
        off += n
    tb = gr.top_block()
    src = blocks.vector_source_b(data, False, 1, tags)
    gen = digital.packet_headergenerator_bb(fmt.formatter(), "packet_len")
    sink = blocks.vector_sink_b()
    tb.connect(src, gen, sink)
    tb.run()
    return list(sink.data())


@pytest.mark.parametrize("max_symbols", [6016, 300])
def test_header_parser_guard_parses_checks_crc_and_rejects_oversized(max_symbols):
    # scaleflu.header_parser_guard = packet_headerparser_b + header_guard in one block
    from gnuradio import scaleflu

    occ, _, _ = ofdm_carriers(64)
    bits = _ofdm_header_bits([100, 1500])
    hlen = len(bits) // 2
    corrupt = bits[:hlen]
    corrupt[3] ^= 1  # a header whose CRC fails
    blk = scaleflu.header_parser_guard(
        occ, 1, "packet_len", "frame_len", "packet_num", 1, 2, True, max_symbols
    )
    assert blk.header_len() == hlen == 48
    ref = digital.packet_headerparser_b(
        digital.packet_header_ofdm(
            occ, 1, "packet_len", "frame_len", "packet_num", 1, 2, scramble_header=True
        ).formatter()
    )
    tb = gr.top_block()
    src = blocks.vector_source_b(bits + corrupt)
    out, ref_out = blocks.message_debug(), blocks.message_debug()
    tb.connect(src, blk)
    tb.connect(src, ref)
    tb.msg_connect(blk, "header_data", out, "store")
    tb.msg_connect(ref, "header_data", ref_out, "store")
    tb.run()
    tb.stop()
    tb.wait()
    got = [out.get_message(i) for i in range(out.num_messages())]
    ref_got = [ref_out.get_message(i) for i in range(ref_out.num_messages())]
    assert len(got) == len(ref_got) == 3
    lens = []
    for g, r in zip(got, ref_got, strict=True):  # what the stock parser says, or #f
        if pmt.is_dict(r):
            n = pmt.to_long(pmt.dict_ref(r, pmt.intern("packet_len"), pmt.PMT_NIL))
            lens.append(n)
            if n <= max_symbols:
                assert pmt.equal(g, r)
            else:
                assert pmt.eq(g, pmt.PMT_F)
        else:
            assert pmt.eq(g, pmt.PMT_F) and pmt.eq(r, pmt.PMT_F)
    assert lens == [400, 6000]  # packet_len in payload symbols: 8 bits / 2 per symbol
    assert blk.invalid() == 1
    assert (blk.passed(), blk.rejected()) == ((2, 0) if max_symbols == 6016 else (0, 2))
