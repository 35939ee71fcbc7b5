"""The C++ frame codec (frame_builder/frame_parser) and scaleflu.link.frame agree byte for byte."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaleflu.link.frame import FrameError, decode_frame, encode_frame

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
