"""Fast bytes <-> pmt u8vector conversion of the link blocks equals the slow, obvious one."""

import os

import pytest

pmt = pytest.importorskip("pmt")
blocks = pytest.importorskip(
    "scaleflu.radio.message_blocks", reason="GNU Radio blocks not importable"
)

pytestmark = pytest.mark.gnuradio


@pytest.mark.parametrize("n", [0, 1, 7, 8, 255, 256, 1474, 65536, 1_000_003])
def test_u8_round_trip_matches_init_u8vector(n):
    data = os.urandom(n)
    v = blocks._u8(data)
    assert pmt.is_u8vector(v) and pmt.length(v) == n
    if n <= 65536:
        assert pmt.equal(v, pmt.init_u8vector(n, list(data)))
    assert blocks._u8_bytes(v) == data
    assert blocks._pdu_bytes(pmt.cons(pmt.make_dict(), v)) == data


def test_frame_pdu_round_trip_and_refusals():
    from scaleflu.link.frame import encode_frame

    raw = encode_frame(0, 1, 2, 77, 3, 9, os.urandom(1000))
    assert blocks.pdu_to_frame(blocks.frame_to_pdu(raw), 1500) == raw
    assert blocks.pdu_to_frame(pmt.cons(pmt.make_dict(), blocks._u8(raw)), 1500) == raw
    # whole-frame ("raw") PDUs: the frame as it is, metadata "raw" = #t and the frame type
    for ftype in (0, 1, 2):
        f = encode_frame(ftype, 1, 2, 77, 0, 1, os.urandom(40))
        p = blocks.frame_to_raw_pdu(f)
        assert blocks._pdu_bytes(p) == f
        assert pmt.to_long(pmt.dict_ref(pmt.car(p), pmt.intern("type"), pmt.PMT_NIL)) == ftype
        assert pmt.equal(pmt.dict_ref(pmt.car(p), pmt.intern("raw"), pmt.PMT_F), pmt.PMT_T)
        assert blocks.pdu_to_frame(p, 1500) == f
    # a raw PDU that also carries header fields (frame_parser's raw output) is not re-encoded
    meta = pmt.dict_add(pmt.car(blocks.frame_to_raw_pdu(raw)), pmt.intern("seq"), pmt.from_long(5))
    assert blocks.pdu_to_frame(pmt.cons(meta, blocks._u8(raw)), 1500) == raw
    assert blocks._pdu_bytes(pmt.intern("x")) is None
    assert blocks._pdu_bytes(pmt.cons(pmt.PMT_NIL, pmt.init_f32vector(2, [1.0, 2.0]))) is None
