"""The C++ frame codec (frame_builder/frame_parser) and scaleflu.link.frame agree byte for byte."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleflu.link.frame import FrameError, FrameTooLongError, decode_frame, encode_frame

scaleflu_gr = pytest.importorskip("gnuradio.scaleflu", reason="C++ module not built")

pytestmark = pytest.mark.gnuradio

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)


@st.composite
def frames(draw):
    count = draw(st.integers(1, 0xFFFFFFFF))
    seq = draw(st.integers(0, count - 1))
    mtu = draw(st.integers(27, 1500))
    payload = draw(st.binary(max_size=mtu - 26))
    return draw(st.integers(0, 2)), draw(u16), draw(u16), draw(u32), seq, count, payload, mtu


@settings(max_examples=300, deadline=None)
@given(frames())
def test_cpp_and_python_build_identical_frames(f):
    ftype, src, dst, msg_id, seq, count, payload, mtu = f
    py = encode_frame(ftype, src, dst, msg_id, seq, count, payload, mtu=mtu)
    cpp = scaleflu_gr.frame_build(ftype, src, dst, msg_id, seq, count, payload, mtu)
    assert py == cpp
    parsed = scaleflu_gr.frame_parse(py)
    assert parsed["payload"] == payload
    assert (parsed["src"], parsed["dst"], parsed["msg_id"], parsed["seq"]) == (
        src,
        dst,
        msg_id,
        seq,
    )


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=1600))
def test_cpp_and_python_accept_the_same_bytes(raw):
    cpp = scaleflu_gr.frame_parse(raw)
    try:
        py = decode_frame(raw)
    except FrameError:
        assert isinstance(cpp, str), "C++ accepted a frame Python rejects"
        return
    assert isinstance(cpp, dict), f"C++ rejected a frame Python accepts: {cpp}"
    assert cpp["payload"] == py.payload


@settings(max_examples=200, deadline=None)
@given(frames(), st.data())
def test_any_single_bit_flip_is_rejected_by_both(f, data):
    ftype, src, dst, msg_id, seq, count, payload, mtu = f
    frame = bytearray(encode_frame(ftype, src, dst, msg_id, seq, count, payload, mtu=mtu))
    bit = data.draw(st.integers(0, len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    assert isinstance(scaleflu_gr.frame_parse(bytes(frame)), str)
    with pytest.raises(FrameError):
        decode_frame(bytes(frame))


@settings(max_examples=200, deadline=None)
@given(st.integers(27, 1600), st.binary(min_size=0, max_size=1600))
def test_cpp_and_python_enforce_the_same_mtu(mtu, payload):
    body = payload[:0xFFFF]
    frame = encode_frame(0, 1, 2, 3, 0, 1, body, mtu=26 + len(body) if body else 27)
    cpp = scaleflu_gr.frame_parse(frame, mtu)
    try:
        decode_frame(frame, mtu)
    except FrameTooLongError:
        assert cpp == "longer than the mtu"
        assert len(frame) > mtu
        return
    assert isinstance(cpp, dict) and len(frame) <= mtu


@pytest.mark.parametrize(
    "args",
    [
        (0, -1, 2, 3, 0, 1),
        (0, 1, 0x10000, 3, 0, 1),
        (0, 1, 2, 2**32, 0, 1),
        (0, 1, 2, -1, 0, 1),
        (0, 1, 2, 3, 2**32, 2**32),
        (0, 1, 2, 3, 0, 2**70),
        (256, 1, 2, 3, 0, 1),
        (3, 1, 2, 3, 0, 1),  # unknown type
        (0, 1, 2, 3, 1, 1),  # seq >= count
    ],
)
def test_cpp_frame_build_raises_value_error_like_python(args):
    with pytest.raises(ValueError):
        encode_frame(*args, b"x")
    with pytest.raises(ValueError):
        scaleflu_gr.frame_build(*args, b"x")


def test_cpp_frame_build_raises_type_error_for_non_ints():
    with pytest.raises(TypeError):
        scaleflu_gr.frame_build(0, "1", 2, 3, 0, 1, b"x")
    with pytest.raises(TypeError):
        encode_frame(0, "1", 2, 3, 0, 1, b"x")


def test_frame_parser_block_drops_frames_longer_than_its_mtu():
    import pmt
    from gnuradio import blocks, gr

    small = encode_frame(0, 1, 2, 3, 0, 1, b"a" * 100)
    big = encode_frame(0, 1, 2, 4, 0, 1, b"b" * 400)
    parser = scaleflu_gr.frame_parser(-1, 300)
    src = blocks.message_strobe(pmt.PMT_NIL, 1000)  # only to own a flowgraph
    debug = blocks.message_debug()
    tb = gr.top_block()
    tb.msg_connect(parser, "out", debug, "store")
    tb.msg_connect(src, "strobe", blocks.message_debug(), "store")
    tb.start()
    for raw in (small, big):
        parser.to_basic_block()._post(
            pmt.intern("in"), pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(raw), list(raw)))
        )
    import time

    deadline = time.monotonic() + 5
    while parser.frames_ok() + parser.malformed() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    tb.stop()
    tb.wait()
    assert parser.frames_ok() == 1 and parser.malformed() == 1
    with pytest.raises(ValueError):
        scaleflu_gr.frame_parser(-1, 26)
