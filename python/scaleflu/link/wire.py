"""Versioned binary wire format for messages carrying named tensors or an opaque blob.

Layout (see docs/link.md for the full table). Header fields are big-endian; tensor data are
little-endian. Nothing is ever unpickled: decoding only parses fixed fields and numeric arrays.

Message::

    off size field
    0   4    magic b"SFLW"
    4   1    version (1)
    5   1    message type (MessageType; 128..255 application-defined)
    6   2    flags: bit0 TENSORS (payload is a tensor table, else an opaque blob),
                    bit1 DELTA (tensors update a reference state dict); other bits must be 0
    8   4    session / round (u32)
    12  2    sender node id (u16)
    14  2    receiver node id (u16)
    16  4    message id (u32)
    20  4    payload length P (u32)
    24  P    payload
    24+P 4   CRC32 (zlib, IEEE) of bytes 0 .. 24+P-1

Tensor table payload: u32 count, then per tensor::

    u16 name length (1..1024), name (UTF-8)
    u8  dtype code (DTYPE_CODES)
    u8  encoding (Encoding)
    u8  record flags: bit0 SPARSE (only the listed parameter groups are carried)
    u8  ndim (0..32), ndim x u32 dims
    u32 G, number of parameter groups (contiguous chunks of the flattened tensor; 0 iff empty)
    if SPARSE: u32 k, k x u32 group indices (strictly increasing, < G)   (else all G groups)
    if INT8:   one f32 scale per carried group
    u64 data length in bytes (= carried elements x element size of the encoding)
    data
"""

from __future__ import annotations

import enum
import logging
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MAGIC = b"SFLW"
VERSION = 1
HEADER = struct.Struct(">4sBBHIHHII")
HEADER_SIZE = HEADER.size  # 24
CRC_SIZE = 4
DEFAULT_MAX_MESSAGE_SIZE = 256 * 1024 * 1024
MAX_NAME_BYTES = 1024
MAX_NDIM = 32
DEFAULT_GROUPS = 8
MAX_ELEMENTS = 2**48  # keeps group arithmetic inside int64 for any shape a sparse record names

FLAG_TENSORS = 0x0001
FLAG_DELTA = 0x0002
_KNOWN_FLAGS = FLAG_TENSORS | FLAG_DELTA
RECORD_SPARSE = 0x01


class WireError(ValueError):
    """Base class of every error raised while decoding a wire message."""


class BadMagicError(WireError):
    """The message does not start with the wire magic."""


class UnsupportedVersionError(WireError):
    """The message has a format version this decoder does not know."""


class TruncatedError(WireError):
    """The message ends before a field it announces."""


class TrailingBytesError(WireError):
    """The message or a payload has bytes after its last field."""


class BadDtypeError(WireError):
    """A tensor record carries an unknown dtype code."""


class ShapeMismatchError(WireError):
    """A byte count does not match the shape, groups or encoding it belongs to."""


class TooLargeError(WireError):
    """A message exceeds the configured maximum message size."""


class ChecksumError(WireError):
    """The CRC32 of the message does not match its contents."""


class BadFieldError(WireError):
    """A header or record field has a value outside its allowed set."""


class ReferenceMismatchError(WireError):
    """A delta message does not fit the reference state dict it is applied to."""


class MessageType(enum.IntEnum):
    """What a message carries; 128..255 are free for applications."""

    MODEL = 1
    UPDATE = 2
    DELTA = 3
    CONTROL = 4
    BLOB = 5


class Encoding(enum.IntEnum):
    """Per-tensor value encoding; lossy ones apply to floating-point tensors only."""

    RAW = 0  # native dtype, bit-exact (float32 tensors: exact fp32)
    FP32 = 1  # cast to float32 (exact for float32/float16 tensors)
    FP16 = 2  # cast to float16 (relative error <= 2**-11 in the normal range)
    INT8 = 3  # symmetric int8, one fp32 scale per parameter group (error <= scale/2)


DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f2"),
    3: np.dtype("<f8"),
    4: np.dtype("<i8"),
    5: np.dtype("<i4"),
    6: np.dtype("u1"),
    7: np.dtype("?"),
    8: np.dtype("i1"),
    9: np.dtype("<i2"),
}
_CODE_OF = {dt.newbyteorder("=") if dt.itemsize > 1 else dt: c for c, dt in DTYPE_CODES.items()}
_FLOAT_CODES = {1, 2, 3}
_ENC_DTYPE = {
    Encoding.FP32: np.dtype("<f4"),
    Encoding.FP16: np.dtype("<f2"),
    Encoding.INT8: np.dtype("i1"),
}


@dataclass(frozen=True)
class MessageHeader:
    """Fixed header fields of a wire message."""

    type: int
    flags: int
    session: int
    sender: int
    receiver: int
    msg_id: int
    payload_length: int


@dataclass
class Message:
    """A message: either named tensors (dict of numpy arrays) or an opaque blob."""

    type: int = MessageType.BLOB
    tensors: dict[str, np.ndarray] | None = None
    blob: bytes | None = None
    session: int = 0
    sender: int = 0
    receiver: int = 0
    msg_id: int = 0
    flags: int = field(default=0, compare=False)


def dtype_code(dtype: np.dtype) -> int:
    """Return the wire code of a numpy dtype; raise TypeError for dtypes the format lacks."""
    dt = np.dtype(dtype)
    key = dt.newbyteorder("=") if dt.itemsize > 1 else dt
    try:
        return _CODE_OF[key]
    except KeyError:
        raise TypeError(f"dtype {dt} is not supported on the wire") from None


def group_bounds(n: int, groups: int) -> np.ndarray:
    """Return G+1 offsets splitting n elements into G contiguous chunks (numpy array_split rule)."""
    if groups == 0:
        return np.zeros(1, dtype=np.int64)
    base, rem = divmod(n, groups)
    sizes = np.full(groups, base, dtype=np.int64)
    sizes[:rem] += 1
    bounds = np.zeros(groups + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def _group_slices(n: int, groups: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start offsets and sizes of the groups ``idx`` without materialising all G groups."""
    if groups == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    base, rem = divmod(n, groups)
    starts = idx * base + np.minimum(idx, rem)
    sizes = base + (idx < rem).astype(np.int64)
    return starts, sizes


def effective_groups(n: int, groups: int) -> int:
    """Number of groups actually used for n elements: min(groups, n), 0 for an empty tensor."""
    if groups < 1:
        raise ValueError("groups must be >= 1")
    return 0 if n == 0 else min(groups, n)


def int8_error_bound(scale: float, max_abs: float = 0.0) -> float:
    """Largest |x - decoded| of an INT8 value in a group with this scale (half step + rounding)."""
    return 0.5 * float(scale) + 2.0**-22 * float(max_abs) + 1e-45


# --------------------------------------------------------------------------------------------
# encoding


def _changed_groups(new: np.ndarray, ref: np.ndarray, bounds: np.ndarray, tol: float) -> np.ndarray:
    """Indices of groups in which new differs from ref (bitwise if tol == 0, else by > tol)."""
    a = new.reshape(-1)
    b = ref.reshape(-1)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if tol <= 0 or a.dtype.kind not in "fc":
        diff = a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1)
        diff = diff.any(axis=1)
    else:
        with np.errstate(invalid="ignore"):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64)) > tol
        diff |= np.isnan(a) != np.isnan(b)
        diff |= np.isinf(a) & (a != b)
    counts = np.add.reduceat(diff.astype(np.int64), bounds[:-1])
    return np.nonzero(counts)[0].astype(np.int64)


def _encode_values(
    flat: np.ndarray, enc: Encoding, bounds: np.ndarray, idx: np.ndarray, name: str
) -> tuple[bytes, bytes]:
    """Return (scales, data) bytes for the carried groups of a flat tensor."""
    if len(idx) == len(bounds) - 1:
        vals = flat
        sizes = np.diff(bounds)
    else:
        vals = (
            np.concatenate([flat[bounds[i] : bounds[i + 1]] for i in idx]) if len(idx) else flat[:0]
        )
        sizes = (bounds[idx + 1] - bounds[idx]) if len(idx) else np.zeros(0, np.int64)
    if enc == Encoding.RAW:
        return b"", vals.astype(vals.dtype.newbyteorder("<"), copy=False).tobytes()
    if enc == Encoding.FP32:
        return b"", vals.astype("<f4").tobytes()
    if enc == Encoding.FP16:
        finite = vals[np.isfinite(vals)]
        if finite.size and np.max(np.abs(finite)) > 65504.0:
            raise ValueError(f"tensor {name!r}: values beyond the float16 range (|x| > 65504)")
        return b"", vals.astype("<f2").tobytes()
    # INT8
    if not np.all(np.isfinite(vals)):
        raise ValueError(f"tensor {name!r}: INT8 encoding needs finite values")
    v = vals.astype(np.float64)
    starts = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], out=starts[1:])
    maxabs = np.maximum.reduceat(np.abs(v), starts) if v.size else np.zeros(0)
    scales = (maxabs / 127.0).astype(np.float32)
    # a scale that underflows float32 would zero its group: use the smallest subnormal instead
    scales[(scales == 0) & (maxabs > 0)] = np.float32(2.0**-149)
    # a scale rounded down so far (subnormal groups) that the largest value would need more
    # than 127 steps: the next float32 up, so nothing is clipped
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.rint(maxabs / scales.astype(np.float64)) > 127
    while np.any(over):
        scales[over] = np.nextafter(scales[over], np.float32(np.inf))
        with np.errstate(divide="ignore", invalid="ignore"):
            over = np.rint(maxabs / scales.astype(np.float64)) > 127
    per_elem = np.repeat(scales.astype(np.float64), sizes)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(per_elem > 0, np.rint(v / per_elem), 0.0)
    q = np.clip(q, -127, 127).astype(np.int8)
    return scales.astype(">f4").tobytes(), q.tobytes()


def _encode_record(
    name: str,
    arr: np.ndarray,
    enc: Encoding,
    groups: int,
    ref: np.ndarray | None,
    tol: float,
) -> bytes | None:
    """Encode one tensor record, or None when a delta record would carry no group."""
    if not isinstance(name, str):
        raise TypeError("tensor names must be str")
    nb = name.encode("utf-8")
    if not 1 <= len(nb) <= MAX_NAME_BYTES:
        raise ValueError(f"tensor name must be 1..{MAX_NAME_BYTES} UTF-8 bytes: {name[:40]!r}")
    arr = np.asarray(arr)
    code = dtype_code(arr.dtype)
    if arr.ndim > MAX_NDIM:
        raise ValueError(f"tensor {name!r} has more than {MAX_NDIM} dimensions")
    if any(d > 0xFFFFFFFF for d in arr.shape):
        raise ValueError(f"tensor {name!r} has a dimension above 2**32-1")
    if code not in _FLOAT_CODES:
        enc = Encoding.RAW
    flat = np.ascontiguousarray(arr).reshape(-1)
    n = flat.size
    G = effective_groups(n, groups)
    bounds = group_bounds(n, G)
    idx = np.arange(G, dtype=np.int64)
    sparse = False
    if ref is not None:
        idx = _changed_groups(flat, np.ascontiguousarray(ref).reshape(-1), bounds, tol)
        if len(idx) == 0:
            return None
        sparse = len(idx) < G
    scales, data = _encode_values(flat, enc, bounds, idx, name)
    parts = [
        struct.pack(">H", len(nb)),
        nb,
        struct.pack(">BBBB", code, int(enc), RECORD_SPARSE if sparse else 0, arr.ndim),
        struct.pack(f">{arr.ndim}I", *arr.shape),
        struct.pack(">I", G),
    ]
    if sparse:
        parts.append(struct.pack(">I", len(idx)))
        parts.append(idx.astype(">u4").tobytes())
    parts += [scales, struct.pack(">Q", len(data)), data]
    return b"".join(parts)


def encode_message(
    msg: Message,
    encoding: Encoding | int = Encoding.RAW,
    groups: int = DEFAULT_GROUPS,
    reference: Mapping[str, np.ndarray] | None = None,
    tolerance: float = 0.0,
    encodings: Mapping[str, Encoding | int] | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> bytes:
    """Serialise a message; with a reference, only changed parameter groups are carried (delta).

    ``encoding`` applies to floating-point tensors (others are always RAW); ``encodings``
    overrides it per tensor name. ``groups`` is G, the parameter groups per tensor used for INT8
    scales and delta granularity. Raises ValueError/TypeError for values the format cannot carry
    and TooLargeError when the result exceeds ``max_message_size``.
    """
    if groups < 1:
        raise ValueError("groups must be >= 1")
    mtype = int(msg.type)
    _check_type(mtype, ValueError)
    for label, value, limit in (
        ("session", msg.session, 0xFFFFFFFF),
        ("sender", msg.sender, 0xFFFF),
        ("receiver", msg.receiver, 0xFFFF),
        ("msg_id", msg.msg_id, 0xFFFFFFFF),
    ):
        if not 0 <= int(value) <= limit:
            raise ValueError(f"{label} {value} out of range 0..{limit}")
    flags = 0
    if msg.tensors is not None:
        if msg.blob is not None:
            raise ValueError("a message carries tensors or a blob, not both")
        flags |= FLAG_TENSORS
        if reference is not None:
            flags |= FLAG_DELTA
        records = []
        for name, arr in msg.tensors.items():
            enc = Encoding((encodings or {}).get(name, encoding))
            ref = None
            if reference is not None and name in reference:
                r = np.asarray(reference[name])
                a = np.asarray(arr)
                if r.dtype == a.dtype and r.shape == a.shape:
                    ref = r
            rec = _encode_record(name, arr, enc, groups, ref, tolerance)
            if rec is not None:
                records.append(rec)
        payload = struct.pack(">I", len(records)) + b"".join(records)
    else:
        if reference is not None:
            raise ValueError("a delta needs tensors")
        payload = bytes(msg.blob or b"")
    total = HEADER_SIZE + len(payload) + CRC_SIZE
    if total > max_message_size or len(payload) > 0xFFFFFFFF:
        raise TooLargeError(f"message of {total} bytes exceeds the limit of {max_message_size}")
    head = HEADER.pack(
        MAGIC,
        VERSION,
        mtype,
        flags,
        int(msg.session),
        int(msg.sender),
        int(msg.receiver),
        int(msg.msg_id),
        len(payload),
    )
    body = head + payload
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def _check_type(mtype: int, exc: type[Exception]) -> None:
    """Accept known message types and the application range 128..255."""
    if not (mtype in MessageType._value2member_map_ or 128 <= mtype <= 255):
        raise exc(f"unknown message type {mtype}")


# --------------------------------------------------------------------------------------------
# decoding


def peek_header(data: bytes, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> MessageHeader:
    """Validate and return the fixed header (no CRC or payload check) to route a message early."""
    if len(data) > max_message_size:
        raise TooLargeError(f"message of {len(data)} bytes exceeds the limit of {max_message_size}")
    if len(data) < HEADER_SIZE + CRC_SIZE:
        if len(data) >= 4 and bytes(data[:4]) != MAGIC:
            raise BadMagicError("bad magic")
        raise TruncatedError(f"message of {len(data)} bytes is shorter than header + CRC")
    magic, version, mtype, flags, session, sender, receiver, msg_id, plen = HEADER.unpack_from(
        data, 0
    )
    if magic != MAGIC:
        raise BadMagicError(f"bad magic {magic!r}")
    if version != VERSION:
        raise UnsupportedVersionError(f"wire version {version} (this decoder knows {VERSION})")
    _check_type(mtype, BadFieldError)
    if flags & ~_KNOWN_FLAGS:
        raise BadFieldError(f"unknown flags 0x{flags:04x}")
    if flags & FLAG_DELTA and not flags & FLAG_TENSORS:
        raise BadFieldError("DELTA flag without TENSORS flag")
    if HEADER_SIZE + plen + CRC_SIZE > max_message_size:
        raise TooLargeError(f"payload length {plen} exceeds the limit of {max_message_size}")
    return MessageHeader(mtype, flags, session, sender, receiver, msg_id, plen)


class _Reader:
    """Bounds-checked cursor over a payload."""

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise TruncatedError(f"{what}: need {n} bytes, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple[Any, ...]:
        s = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(s, what))


def _decode_record(
    rd: _Reader, reference: Mapping[str, np.ndarray] | None
) -> tuple[str, np.ndarray]:
    """Parse one tensor record and return (name, array), applying a sparse record to reference."""
    (nlen,) = rd.unpack(">H", "name length")
    if not 1 <= nlen <= MAX_NAME_BYTES:
        raise BadFieldError(f"name length {nlen} outside 1..{MAX_NAME_BYTES}")
    try:
        name = bytes(rd.take(nlen, "name")).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadFieldError(f"tensor name is not UTF-8: {exc}") from None
    code, enc_code, rflags, ndim = rd.unpack(">BBBB", "record fields")
    if code not in DTYPE_CODES:
        raise BadDtypeError(f"tensor {name!r}: unknown dtype code {code}")
    dtype = DTYPE_CODES[code]
    try:
        enc = Encoding(enc_code)
    except ValueError:
        raise BadFieldError(f"tensor {name!r}: unknown encoding {enc_code}") from None
    if enc != Encoding.RAW and code not in _FLOAT_CODES:
        raise BadFieldError(f"tensor {name!r}: encoding {enc.name} on a non-float dtype")
    if rflags & ~RECORD_SPARSE:
        raise BadFieldError(f"tensor {name!r}: unknown record flags 0x{rflags:02x}")
    if ndim > MAX_NDIM:
        raise BadFieldError(f"tensor {name!r}: ndim {ndim} > {MAX_NDIM}")
    shape = rd.unpack(f">{ndim}I", "shape")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_ELEMENTS:
        raise ShapeMismatchError(f"tensor {name!r}: shape {shape} has more than 2**48 elements")
    (G,) = rd.unpack(">I", "group count")
    if (n == 0 and G != 0) or (n > 0 and not 1 <= G <= n):
        raise ShapeMismatchError(f"tensor {name!r}: {G} groups for {n} elements")
    if n > len(rd.buf):  # every element takes at least one byte unless the record is sparse
        if not rflags & RECORD_SPARSE:
            raise ShapeMismatchError(f"tensor {name!r}: shape {shape} larger than the message")
    if rflags & RECORD_SPARSE:
        (k,) = rd.unpack(">I", "sparse group count")
        if not 1 <= k < G:
            raise BadFieldError(f"tensor {name!r}: sparse record carries {k} of {G} groups")
        idx = np.frombuffer(rd.take(4 * k, "group indices"), dtype=">u4")  # a view, no copy
        if int(idx[-1]) >= G or (k > 1 and bool(np.any(idx[1:] <= idx[:-1]))):
            raise BadFieldError(f"tensor {name!r}: group indices not increasing or >= {G}")
    else:
        k = G
        idx = None
    # Groups follow numpy's array_split rule: the first ``rem`` have base + 1 elements, the rest
    # base. Carried groups are sorted, so they form two regular blocks too (``big`` groups of
    # base + 1, then k - big of base): scales and scatters are reshapes, never per-element index
    # arrays or per-group Python loops (peak memory stays within 2 x the message, docs/link.md).
    base, rem = divmod(n, G) if G else (0, 0)
    big = (rem if idx is None else int(np.searchsorted(idx, rem))) if G else 0
    m = big * (base + 1) + (k - big) * base if G else 0
    scales = None
    if enc == Encoding.INT8:
        scales = np.frombuffer(rd.take(4 * k, "int8 scales"), dtype=">f4")  # a view, no copy
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise BadFieldError(f"tensor {name!r}: INT8 scale not finite and >= 0")
    (dlen,) = rd.unpack(">Q", "data length")
    vdt = dtype if enc == Encoding.RAW else _ENC_DTYPE[enc]
    if dlen != m * vdt.itemsize:
        raise ShapeMismatchError(
            f"tensor {name!r}: {dlen} data bytes for {m} elements of {vdt} (shape {shape})"
        )
    raw = rd.take(dlen, "tensor data")
    vals = np.frombuffer(raw, dtype=vdt)
    if dtype == np.bool_ or vdt == np.bool_:
        u = np.frombuffer(raw, dtype=np.uint8)
        if u.size and u.max() > 1:
            raise BadFieldError(f"tensor {name!r}: bool bytes other than 0/1")
    native = dtype.newbyteorder("=")
    if enc == Encoding.INT8:
        assert scales is not None
        f = vals.astype(np.float32)
        cut = big * (base + 1)
        _scale_groups(f[:cut], scales[:big], base + 1)
        _scale_groups(f[cut:], scales[big:], base)
        vals = f if native == np.float32 else f.astype(native)
    else:
        with np.errstate(over="ignore"):  # a float32 value beyond float16 range decodes to inf
            vals = vals.astype(native, copy=True)
    if idx is None:
        return name, vals.reshape(shape)
    if reference is None:
        raise ReferenceMismatchError(f"tensor {name!r}: sparse record needs a reference")
    if name not in reference:
        raise ReferenceMismatchError(f"tensor {name!r} missing from the reference")
    ref = np.asarray(reference[name])
    if ref.shape != tuple(shape) or np.dtype(ref.dtype).newbyteorder("=") != native:
        raise ReferenceMismatchError(
            f"tensor {name!r}: reference {ref.dtype}{ref.shape} vs message {dtype}{tuple(shape)}"
        )
    out = np.array(ref, dtype=native, copy=True).reshape(-1)
    cut = big * (base + 1)
    head = rem * (base + 1)
    _scatter_groups(out[:head], idx[:big], 0, vals[:cut], base + 1)
    _scatter_groups(out[head:], idx[big:], rem, vals[cut:], base)
    return name, out.reshape(shape)


_GROUP_CHUNK = 1 << 16  # groups handled per numpy call: bounds the decoder's temporaries


def _scale_groups(f: np.ndarray, scales: np.ndarray, size: int) -> None:
    """Multiply consecutive groups of ``size`` values of ``f`` by their scales, in place."""
    for g0 in range(0, len(scales), _GROUP_CHUNK):
        g1 = min(len(scales), g0 + _GROUP_CHUNK)
        blk = f[g0 * size : g1 * size].reshape(g1 - g0, size)
        blk *= scales[g0:g1].astype(np.float32)[:, None]


def _scatter_groups(
    out: np.ndarray, rows: np.ndarray, first: int, vals: np.ndarray, size: int
) -> None:
    """Write consecutive groups of ``vals`` into groups ``rows - first`` of ``out``."""
    if not len(rows) or not size:
        return
    grid = out.reshape(-1, size)
    for g0 in range(0, len(rows), _GROUP_CHUNK):
        g1 = min(len(rows), g0 + _GROUP_CHUNK)
        r = rows[g0:g1].astype(np.intp)
        if first:
            r -= first
        grid[r] = vals[g0 * size : g1 * size].reshape(g1 - g0, size)


def decode_message(
    data: bytes | bytearray | memoryview,
    reference: Mapping[str, np.ndarray] | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> Message:
    """Parse and fully validate a wire message; delta messages are applied to ``reference``.

    Raises a WireError subclass for any malformed input; never executes code from the message.
    """
    data = memoryview(bytes(data)) if not isinstance(data, memoryview) else data
    hdr = peek_header(data, max_message_size)
    end = HEADER_SIZE + hdr.payload_length
    if len(data) < end + CRC_SIZE:
        raise TruncatedError(f"message announces {end + CRC_SIZE} bytes, has {len(data)}")
    if len(data) > end + CRC_SIZE:
        raise TrailingBytesError(f"{len(data) - end - CRC_SIZE} bytes after the CRC")
    (crc,) = struct.unpack_from(">I", data, end)
    if zlib.crc32(data[:end]) & 0xFFFFFFFF != crc:
        raise ChecksumError("message CRC32 mismatch")
    payload = data[HEADER_SIZE:end]
    msg = Message(
        type=hdr.type,
        session=hdr.session,
        sender=hdr.sender,
        receiver=hdr.receiver,
        msg_id=hdr.msg_id,
        flags=hdr.flags,
    )
    if not hdr.flags & FLAG_TENSORS:
        msg.blob = bytes(payload)
        return msg
    delta = bool(hdr.flags & FLAG_DELTA)
    if delta and reference is None:
        raise ReferenceMismatchError("delta message needs a reference state dict")
    rd = _Reader(payload)
    (count,) = rd.unpack(">I", "tensor count")
    if count > len(payload):
        raise TruncatedError(f"{count} tensors announced in {len(payload)} payload bytes")
    tensors: dict[str, np.ndarray] = {}
    for _ in range(count):
        name, arr = _decode_record(rd, reference if delta else None)
        if name in tensors:
            raise BadFieldError(f"duplicate tensor name {name!r}")
        tensors[name] = arr
    if rd.pos != len(payload):
        raise TrailingBytesError(f"{len(payload) - rd.pos} bytes after the last tensor record")
    if delta:
        assert reference is not None
        merged = {k: np.array(v, copy=True) for k, v in reference.items() if k not in tensors}
        merged.update(tensors)
        tensors = {k: merged[k] for k in [*reference, *(t for t in tensors if t not in reference)]}
    msg.tensors = tensors
    return msg


# --------------------------------------------------------------------------------------------
# convenience


def encode_tensors(
    tensors: Mapping[str, np.ndarray],
    type: int = MessageType.MODEL,
    encoding: Encoding | int = Encoding.RAW,
    groups: int = DEFAULT_GROUPS,
    reference: Mapping[str, np.ndarray] | None = None,
    **header: int,
) -> bytes:
    """Encode a state dict of numpy arrays as one message (delta when a reference is given)."""
    msg = Message(type=type, tensors=dict(tensors), **header)
    return encode_message(msg, encoding=encoding, groups=groups, reference=reference)


def decode_tensors(
    data: bytes, reference: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Decode a tensor message to a state dict of numpy arrays; raise WireError for blobs."""
    msg = decode_message(data, reference=reference)
    if msg.tensors is None:
        raise BadFieldError("message carries a blob, not tensors")
    return msg.tensors


def state_dict_to_numpy(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Convert a torch state dict (or any mapping of tensors/arrays) to numpy arrays on the CPU."""
    out: dict[str, np.ndarray] = {}
    for name, value in state_dict.items():
        if hasattr(value, "detach"):
            t = value.detach().cpu()
            if str(t.dtype) == "torch.bfloat16":
                raise TypeError(f"tensor {name!r}: bfloat16 is not supported on the wire")
            out[name] = t.contiguous().numpy().copy()
        else:
            out[name] = np.asarray(value)
    return out


def numpy_to_state_dict(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Convert numpy arrays back to a torch state dict (torch imported lazily here only)."""
    import torch  # noqa: PLC0415  (lazy: scaleflu.link must import without torch)

    return {name: torch.from_numpy(np.array(a, copy=True)) for name, a in arrays.items()}
