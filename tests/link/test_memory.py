"""Bounded memory: the wire decoder's peak on many-group messages, reassembly buffers returned
when a partial message is dropped, the robot preset's bounds."""

from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

from scaleflu.link.arq import ROBOT_REASSEMBLY_BYTES, ArqConfig, ArqEndpoint, SendStatus
from scaleflu.link.fragment import Reassembler, fragment
from scaleflu.link.frame import Frame, FrameType, decode_frame
from scaleflu.link.sim import ChannelModel, SimNetwork
from scaleflu.link.wire import Encoding, decode_message, encode_tensors

N = 500_003  # elements of the big tensor; one parameter group per element


def _peak(fn):  # noqa: ANN001, ANN202
    gc.collect()
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak


@pytest.mark.parametrize("enc", list(Encoding))
@pytest.mark.parametrize("delta", [False, True])
def test_decoder_peak_on_many_group_message_is_bounded(enc: Encoding, delta: bool) -> None:
    rng = np.random.default_rng(0)
    ref = {
        "w": rng.standard_normal(N).astype(np.float32),
        "h": rng.standard_normal(1001).astype(np.float16),
        "n": np.arange(10, dtype=np.int64),
    }
    new = {k: v.copy() for k, v in ref.items()}
    new["w"][::3] += 1.0  # a third of the groups change (both group sizes occur: N % G = 0 here)
    sd = new if delta else ref
    data = encode_tensors(sd, encoding=enc, groups=N, reference=ref if delta else None)
    msg, peak = _peak(lambda: decode_message(data, reference=ref if delta else None))
    out = sum(a.nbytes for a in msg.tensors.values())
    # the decoded tensors themselves count: the bound is 2 x the larger of message and result
    assert peak <= 2 * max(len(data), out), (peak, len(data), out)
    if enc in (Encoding.RAW, Encoding.FP32):
        assert msg.tensors["w"].tobytes() == sd["w"].tobytes()
    assert msg.tensors["n"].tobytes() == ref["n"].tobytes()


def test_sparse_decode_matches_groups_of_uneven_size() -> None:
    rng = np.random.default_rng(1)
    n, g = 10_007, 1000  # 7 groups of 11 elements, 993 of 10
    ref = {"w": rng.standard_normal(n).astype(np.float32)}
    new = {"w": ref["w"].copy()}
    changed = [0, 3, 6, 7, 500, 999]
    base, rem = divmod(n, g)
    for j in changed:
        a = j * base + min(j, rem)
        b = a + base + (j < rem)
        new["w"][a:b] += 2.0
    data = encode_tensors(new, groups=g, reference=ref)
    got = decode_message(data, reference=ref).tensors["w"]
    assert got.tobytes() == new["w"].tobytes()
    for enc in (Encoding.INT8, Encoding.FP16):
        lossy = decode_message(
            encode_tensors(new, groups=g, reference=ref, encoding=enc), reference=ref
        ).tensors["w"]
        assert np.max(np.abs(lossy - new["w"])) < 0.05


def test_reassembly_memory_is_returned_when_a_partial_message_is_dropped() -> None:
    t = [0.0]
    ra = Reassembler(max_bytes=64 << 20, timeout=5.0, clock=lambda: t[0])
    msg = bytes(512 << 10)  # below MMAP_THRESHOLD: a bytearray, seen by tracemalloc
    frames = [decode_frame(f) for f in fragment(msg, 1, 3, 0)]
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for f in frames[: len(frames) // 2]:
            ra.push(f)
        held = tracemalloc.get_traced_memory()[0] - base
        assert ra.bytes_in_flight >= len(msg)  # the whole message is charged up front
        t[0] = 10.0
        assert ra.expire() == [(3, 1)]
        gc.collect()
        after = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held >= len(msg)  # one buffer of the message's size
    assert after < 16 * 1024, after  # ... handed back in one piece
    assert ra.bytes_in_flight == 0 and ra.sender_usage(3) == (0, 0)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_large_partial_message_memory_goes_back_to_the_system() -> None:
    t = [0.0]
    ra = Reassembler(max_bytes=256 << 20, timeout=5.0, clock=lambda: t[0])
    n = (48 << 20) // 1474  # a 48 MiB message: an anonymous mapping (MMAP_THRESHOLD)
    payload = bytes(range(256)) * 5 + bytes(194)
    frames = [Frame(FrameType.DATA, 3, 0, 1, seq, n, payload) for seq in range(n // 2)]
    gc.collect()
    before = _rss()
    for f in frames:  # the first half arrives
        ra.push(f)
    held = _rss() - before
    t[0] = 10.0
    assert ra.expire() == [(3, 1)]
    gc.collect()
    after = _rss() - before
    assert held >= 20 << 20, held  # about the half that was written (pages not yet written: 0)
    assert held <= 30 << 20, held
    assert after <= 1 << 20, after  # the mapping is gone


def test_reassembly_completion_peak_is_two_messages() -> None:
    ra = Reassembler(max_bytes=64 << 20)
    msg = np.random.default_rng(2).bytes(768 << 10)  # below MMAP_THRESHOLD: traced
    frames = [decode_frame(f) for f in fragment(msg, 1, 3, 0)]

    def run() -> bytes:
        out = None
        for f in frames:
            out = ra.push(f) or out
        return out.payload

    got, peak = _peak(run)
    assert got == msg
    assert peak <= 2 * len(msg) + (256 << 10)


def test_robot_preset_bounds_and_refuses_oversized_messages() -> None:
    cfg = ArqConfig.robot()
    assert cfg.reassembly_max_bytes == ROBOT_REASSEMBLY_BYTES <= 64 << 20
    assert cfg.reassembly_max_messages_per_sender < cfg.reassembly_max_messages
    net = SimNetwork(ChannelModel(), seed=0)
    server = net.add_endpoint(0)
    robot = net.add_endpoint(1, config=ArqConfig.robot(reassembly_max_bytes=1 << 20))
    h = server.send(1, bytes(2 << 20))
    assert net.run_until(h.done, max_time=30)
    assert h.status is SendStatus.FAILED and h.reason == "rejected by receiver: too_large"
    assert robot.reassembler.bytes_in_flight == 0
    with pytest.raises(ValueError):
        ArqEndpoint(1, lambda raw: None, config=ArqConfig.robot()).send(0, bytes(65 << 20))
