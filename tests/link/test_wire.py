"""Wire format: round trips, error bounds, deltas, every malformed-input path, fuzzing."""

from __future__ import annotations

import struct
import zlib

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scaleflu.link import wire
from scaleflu.link.wire import (
    BadDtypeError,
    BadFieldError,
    BadMagicError,
    ChecksumError,
    Encoding,
    Message,
    MessageType,
    ReferenceMismatchError,
    ShapeMismatchError,
    TooLargeError,
    TrailingBytesError,
    TruncatedError,
    UnsupportedVersionError,
    WireError,
    decode_message,
    decode_tensors,
    encode_message,
    encode_tensors,
)

DTYPES = ["float32", "float16", "float64", "int64", "int32", "uint8", "bool", "int8", "int16"]
FLOATS = {"float32", "float16", "float64"}
names = st.text(min_size=1, max_size=12)
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)


def _array(dtype: str, finite: bool = True) -> st.SearchStrategy[np.ndarray]:
    if dtype in FLOATS:
        width = {"float16": 16, "float32": 32, "float64": 64}[dtype]
        elements = st.floats(-1e4, 1e4, width=width) if finite else None
        return hnp.arrays(dtype, shapes, elements=elements)
    return hnp.arrays(dtype, shapes)


@st.composite
def state_dicts(draw: st.DrawFn, finite: bool = True) -> dict[str, np.ndarray]:
    keys = draw(st.lists(names, min_size=0, max_size=5, unique=True))
    return {k: draw(_array(draw(st.sampled_from(DTYPES)), finite)) for k in keys}


def _recrc(body: bytes) -> bytes:
    return body[:-4] + struct.pack(">I", zlib.crc32(body[:-4]) & 0xFFFFFFFF)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------------- round trips
@settings(max_examples=150, deadline=None)
@given(sd=state_dicts(finite=False), groups=st.integers(1, 20))
def test_raw_round_trip_is_bit_exact(sd: dict[str, np.ndarray], groups: int) -> None:
    msg = Message(MessageType.MODEL, tensors=sd, session=7, sender=3, receiver=9, msg_id=11)
    out = decode_message(encode_message(msg, Encoding.RAW, groups=groups))
    assert (out.type, out.session, out.sender, out.receiver, out.msg_id) == (1, 7, 3, 9, 11)
    assert list(out.tensors) == list(sd)
    for k, v in sd.items():
        assert _same_bits(out.tensors[k], v)


@settings(max_examples=100, deadline=None)
@given(sd=state_dicts())
def test_fp32_encoding_exact_for_float32_and_bounded_for_float64(sd: dict) -> None:
    out = decode_tensors(encode_tensors(sd, encoding=Encoding.FP32))
    for k, v in sd.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        if v.dtype in (np.float32, np.float16) or v.dtype.kind not in "f":
            assert _same_bits(out[k], v)
        else:
            np.testing.assert_array_equal(out[k], v.astype(np.float32).astype(v.dtype))


@settings(max_examples=100, deadline=None)
@given(sd=state_dicts())
def test_fp16_error_bound(sd: dict) -> None:
    out = decode_tensors(encode_tensors(sd, encoding=Encoding.FP16))
    for k, v in sd.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        if v.dtype.kind != "f":
            assert _same_bits(out[k], v)
            continue
        x = v.astype(np.float64)
        bound = np.maximum(np.abs(x) * 2.0**-11, 2.0**-25)
        assert np.all(np.abs(out[k].astype(np.float64) - x) <= bound)


@settings(max_examples=100, deadline=None)
@given(sd=state_dicts(), groups=st.integers(1, 12))
# a subnormal group whose float32 scale rounds down: 952 / 7 steps would clip at 127
@example(sd={"0": np.array(1.334e-42, dtype=np.float32)}, groups=1)
def test_int8_error_bound_per_group(sd: dict, groups: int) -> None:
    out = decode_tensors(encode_tensors(sd, encoding=Encoding.INT8, groups=groups))
    for k, v in sd.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        if v.dtype.kind != "f":
            assert _same_bits(out[k], v)
            continue
        flat = v.reshape(-1).astype(np.float64)
        err = np.abs(out[k].reshape(-1).astype(np.float64) - flat)
        G = wire.effective_groups(flat.size, groups)
        b = wire.group_bounds(flat.size, G)
        for g in range(G):
            chunk = flat[b[g] : b[g + 1]]
            maxabs = float(np.max(np.abs(chunk)))
            scale = float(np.float32(maxabs / 127.0))
            if maxabs > 0:
                scale = max(scale, 2.0**-149)
                while round(maxabs / scale) > 127:  # the encoder's scale never clips
                    scale = float(np.nextafter(np.float32(scale), np.float32(np.inf)))
            bound = wire.int8_error_bound(scale, maxabs)
            if v.dtype == np.float16:  # the decoded value is rounded to float16 as well
                bound += maxabs * 2.0**-11 + 2.0**-25
            assert np.all(err[b[g] : b[g + 1]] <= bound)


def test_int8_groups_chosen_by_g(lenet_sd: dict) -> None:
    small = encode_tensors(lenet_sd, encoding=Encoding.INT8, groups=8)
    raw = encode_tensors(lenet_sd, encoding=Encoding.RAW)
    assert len(small) < len(raw) / 3.9
    fine = decode_tensors(encode_tensors(lenet_sd, encoding=Encoding.INT8, groups=64))
    coarse = decode_tensors(small)
    e_f = sum(float(np.abs(fine[k] - v).sum()) for k, v in lenet_sd.items())
    e_c = sum(float(np.abs(coarse[k] - v).sum()) for k, v in lenet_sd.items())
    assert e_f <= e_c


def test_lossy_encodings_refuse_values_they_cannot_carry() -> None:
    with pytest.raises(ValueError, match="finite"):
        encode_tensors({"a": np.array([1.0, np.nan], np.float32)}, encoding=Encoding.INT8)
    with pytest.raises(ValueError, match="float16"):
        encode_tensors({"a": np.array([1e6], np.float32)}, encoding=Encoding.FP16)
    keep = decode_tensors(encode_tensors({"a": np.array([np.inf, np.nan])}, encoding=Encoding.FP16))
    assert np.isinf(keep["a"][0]) and np.isnan(keep["a"][1])


def test_blob_round_trip_and_header_fields() -> None:
    msg = Message(MessageType.CONTROL, blob=b"\x00hello", session=2**32 - 1, sender=65535)
    out = decode_message(encode_message(msg))
    assert out.blob == b"\x00hello" and out.tensors is None
    assert out.session == 2**32 - 1 and out.sender == 65535 and out.type == MessageType.CONTROL
    assert decode_message(encode_message(Message(200, blob=b""))).type == 200
    hdr = wire.peek_header(encode_message(msg))
    assert hdr.payload_length == 6 and hdr.flags == 0


def test_encode_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        encode_message(Message(MessageType.BLOB, blob=b"", sender=70000))
    with pytest.raises(ValueError):
        encode_message(Message(6, blob=b""))
    with pytest.raises(ValueError):
        encode_message(Message(tensors={"a": np.zeros(1)}, blob=b"x"))
    with pytest.raises(ValueError):
        encode_tensors({"": np.zeros(1)})
    with pytest.raises(ValueError):
        encode_tensors({"x" * 1025: np.zeros(1)})
    with pytest.raises(TypeError):
        encode_tensors({"c": np.zeros(2, np.complex64)})
    with pytest.raises(TooLargeError):
        encode_message(Message(blob=b"x" * 100), max_message_size=100)


# -------------------------------------------------------------------------------------- deltas
def test_delta_carries_only_changed_groups(lenet_sd: dict) -> None:
    new = {k: v.copy() for k, v in lenet_sd.items()}
    new["fc1.weight"][3, 7] += 1.0
    new["conv1.bias"][0] = -0.0 if new["conv1.bias"][0] == 0 else 0.0
    data = encode_tensors(new, type=MessageType.DELTA, reference=lenet_sd, groups=8)
    assert len(data) < len(encode_tensors(new)) / 7
    out = decode_tensors(data, reference=lenet_sd)
    assert list(out) == list(lenet_sd)
    for k in new:
        assert _same_bits(out[k], new[k])
    same = encode_tensors(lenet_sd, reference=lenet_sd)
    assert struct.unpack_from(">I", same, wire.HEADER_SIZE)[0] == 0
    with pytest.raises(ReferenceMismatchError):
        decode_tensors(data)
    bad_ref = dict(lenet_sd)
    bad_ref["fc1.weight"] = np.zeros((1,), np.float32)
    with pytest.raises(ReferenceMismatchError):
        decode_tensors(data, reference=bad_ref)
    del bad_ref["fc1.weight"]
    with pytest.raises(ReferenceMismatchError):
        decode_tensors(data, reference=bad_ref)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sd=state_dicts(),
    groups=st.integers(1, 10),
    enc=st.sampled_from(list(Encoding)),
    data=st.data(),
)
def test_delta_round_trip(sd: dict, groups: int, enc: Encoding, data: st.DataObject) -> None:
    new = {}
    for k, v in sd.items():
        w = v.copy()
        if w.size and data.draw(st.booleans()):
            i = data.draw(st.integers(0, w.size - 1))
            w.reshape(-1)[i] = (
                np.array(1, dtype=w.dtype) if w.dtype == np.bool_ else w.reshape(-1)[i] + 1
            )
        new[k] = w
    new["extra"] = np.arange(3, dtype=np.int32)
    exact = decode_tensors(encode_tensors(new, reference=sd, groups=groups), reference=sd)
    for k in new:
        assert _same_bits(exact[k], new[k])
    lossy = decode_tensors(
        encode_tensors(new, reference=sd, groups=groups, encoding=enc), reference=sd
    )
    assert set(lossy) == set(new)


# ------------------------------------------------------------------------------ error classes
def _good() -> bytes:
    return encode_tensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, groups=2)


def _field_offset() -> int:
    return wire.HEADER_SIZE + 4 + 2 + 1  # count, name length, name "w"


@pytest.mark.parametrize(
    ("mutate", "exc"),
    [
        (lambda b: b"XXXX" + b[4:], BadMagicError),
        (lambda b: _recrc(b[:4] + b"\x02" + b[5:]), UnsupportedVersionError),
        (lambda b: b[:10], TruncatedError),
        (lambda b: b[:-1], TruncatedError),
        (lambda b: b + b"\x00", TrailingBytesError),
        (lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:], ChecksumError),
        (lambda b: _recrc(b[:5] + b"\x06" + b[6:]), BadFieldError),  # reserved type
        (lambda b: _recrc(b[:6] + b"\x00\x04" + b[8:]), BadFieldError),  # unknown flag
        (lambda b: _recrc(b[:6] + b"\x00\x02" + b[8:]), BadFieldError),  # DELTA w/o TENSORS
    ],
)
def test_header_errors(mutate, exc) -> None:  # noqa: ANN001
    with pytest.raises(exc):
        decode_message(mutate(_good()))


def _patch(offset: int, value: bytes) -> bytes:
    b = _good()
    return _recrc(b[:offset] + value + b[offset + len(value) :])


def test_record_errors() -> None:
    o = _field_offset()
    with pytest.raises(BadDtypeError):
        decode_message(_patch(o, b"\x63"))
    with pytest.raises(BadFieldError):
        decode_message(_patch(o + 1, b"\x09"))  # encoding
    with pytest.raises(BadFieldError):
        decode_message(_patch(o + 2, b"\x02"))  # record flags
    with pytest.raises(BadFieldError):
        decode_message(_patch(o + 3, b"\x21"))  # ndim 33
    with pytest.raises(ShapeMismatchError):
        decode_message(_patch(o + 4, b"\x00\x00\x00\x03"))  # dims 3x3 vs 6 values
    with pytest.raises(ShapeMismatchError):
        decode_message(_patch(o + 12, b"\x00\x00\x00\x09"))  # 9 groups for 6 elements
    with pytest.raises(ShapeMismatchError):
        decode_message(_patch(o + 16, b"\x00" * 7 + b"\x10"))  # data length 16
    with pytest.raises(BadFieldError):
        decode_message(_patch(wire.HEADER_SIZE + 4, b"\x00\x00"))  # empty name
    with pytest.raises(BadFieldError):
        decode_message(_patch(wire.HEADER_SIZE + 6, b"\xff"))  # name not UTF-8
    with pytest.raises(TruncatedError):
        decode_message(_patch(wire.HEADER_SIZE, b"\x00\x00\x00\x02"))  # 2 tensors, 1 present
    nonfloat = encode_tensors({"i": np.arange(3, dtype=np.int32)})
    with pytest.raises(BadFieldError):
        b = nonfloat
        decode_message(_recrc(b[: _field_offset() + 1] + b"\x02" + b[_field_offset() + 2 :]))
    booleans = encode_tensors({"b": np.array([True, False])})
    with pytest.raises(BadFieldError):
        decode_message(_recrc(booleans[:-5] + b"\x02" + booleans[-4:]))
    dup = encode_tensors({"w": np.zeros(1, np.float32)})
    rec = dup[wire.HEADER_SIZE + 4 : -4]
    body = dup[: wire.HEADER_SIZE] + struct.pack(">I", 2) + rec + rec
    body = body[:20] + struct.pack(">I", len(body) - wire.HEADER_SIZE) + body[24:]
    with pytest.raises(BadFieldError):
        decode_message(body + struct.pack(">I", zlib.crc32(body)))
    body = dup[:-4] + b"\x00"
    body = body[:20] + struct.pack(">I", len(body) - wire.HEADER_SIZE) + body[24:]
    with pytest.raises(TrailingBytesError):
        decode_message(body + struct.pack(">I", zlib.crc32(body)))


def test_int8_scale_and_sparse_index_validation() -> None:
    ref = {"w": np.zeros(8, np.float32)}
    new = {"w": np.zeros(8, np.float32)}
    new["w"][[1, 6]] = 5.0
    b = encode_tensors(new, reference=ref, groups=4, encoding=Encoding.INT8)
    o = _field_offset() + 4 + 4 + 4  # after fields, one dim, G
    assert struct.unpack_from(">I", b, o)[0] == 2  # k
    assert struct.unpack_from(">II", b, o + 4) == (0, 3)
    with pytest.raises(BadFieldError):  # not increasing
        decode_message(_recrc(b[: o + 4] + struct.pack(">II", 3, 0) + b[o + 12 :]), reference=ref)
    with pytest.raises(BadFieldError):  # index >= G
        decode_message(_recrc(b[: o + 4] + struct.pack(">II", 0, 4) + b[o + 12 :]), reference=ref)
    with pytest.raises(BadFieldError):  # k == G is not sparse
        decode_message(_recrc(b[:o] + struct.pack(">I", 4) + b[o + 4 :]), reference=ref)
    with pytest.raises(BadFieldError):  # negative scale
        decode_message(_recrc(b[: o + 12] + struct.pack(">f", -1.0) + b[o + 16 :]), reference=ref)
    out = decode_tensors(b, reference=ref)
    np.testing.assert_allclose(out["w"], new["w"], atol=5.0 / 254 + 1e-6)
    huge = b[: o - 9] + b"\x03" + b[o - 8 : o - 4] + b"\xff\xff\xff\xff" * 2 + b[o - 4 :]
    huge = huge[:20] + struct.pack(">I", len(huge) - 4 - wire.HEADER_SIZE) + huge[24:]
    with pytest.raises(ShapeMismatchError, match="2\\*\\*48"):  # sparse record, absurd shape
        decode_message(_recrc(huge), reference=ref)


def test_size_limit() -> None:
    b = encode_tensors({"w": np.zeros(100, np.float32)})
    with pytest.raises(TooLargeError):
        decode_message(b, max_message_size=100)
    huge = b[:20] + struct.pack(">I", 2**32 - 1) + b[24:]
    with pytest.raises(TooLargeError):
        decode_message(huge)


# ----------------------------------------------------------------------------------- fuzzing
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_raise_only_wire_errors(data: bytes) -> None:
    for blob in (data, wire.MAGIC + bytes([1]) + data):
        try:
            decode_message(blob)
        except WireError:
            pass


@settings(max_examples=400, deadline=None)
@given(sd=state_dicts(), enc=st.sampled_from(list(Encoding)), data=st.data())
def test_mutated_messages_with_valid_crc_raise_only_wire_errors(
    sd: dict, enc: Encoding, data: st.DataObject
) -> None:
    b = bytearray(encode_tensors(sd, encoding=enc, groups=3))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(b) - 5))
        b[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, 8))
    body = bytes(b[: len(b) - 4 - cut])
    try:
        decode_message(body + struct.pack(">I", zlib.crc32(body)), reference=sd)
    except WireError:
        pass


def test_torch_helpers_round_trip() -> None:
    torch = pytest.importorskip("torch")
    sd = {"w": torch.randn(3, 4), "n": torch.tensor(5), "h": torch.ones(2, dtype=torch.float16)}
    arrays = wire.state_dict_to_numpy(sd)
    back = wire.numpy_to_state_dict(decode_tensors(encode_tensors(arrays)))
    for k, v in sd.items():
        assert torch.equal(back[k], v)
    with pytest.raises(TypeError):
        wire.state_dict_to_numpy({"b": torch.ones(1, dtype=torch.bfloat16)})


@settings(max_examples=300, deadline=None)
@given(sd=state_dicts(), enc=st.sampled_from(list(Encoding)), data=st.data())
def test_mutated_delta_messages_raise_only_wire_errors(
    sd: dict, enc: Encoding, data: st.DataObject
) -> None:
    ref = {k: np.zeros_like(v) for k, v in sd.items()}
    b = bytearray(encode_tensors(sd, encoding=enc, groups=4, reference=ref))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(b) - 5))
        b[i] = data.draw(st.integers(0, 255))
    body = bytes(b[:-4])
    try:
        decode_message(body + struct.pack(">I", zlib.crc32(body)), reference=ref)
    except WireError:
        pass
