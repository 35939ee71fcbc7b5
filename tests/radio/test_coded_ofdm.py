"""The coded OFDM hier blocks: bursts as the 802.11a reference builds them, frames of every MCS
back to back through one receiver, per-frame reports, tensor messages bit-exact through the
OFDM loopback link at every MCS and at 6 dB with the default (adaptive) MCS."""

from __future__ import annotations

import hashlib
import time

import coded_reference as ref
import numpy as np
import pmt
import pytest

gr = pytest.importorskip("gnuradio.gr")
pytest.importorskip("gnuradio.scaleflu")

from gnuradio import blocks, pdu  # noqa: E402

from scaleflu.link.mcs import MCS_TABLE, frame_samples, mcs_by_name  # noqa: E402
from scaleflu.link.wire import Message, MessageType, encode_message  # noqa: E402
from scaleflu.linkkinds import open_link  # noqa: E402
from scaleflu.radio.coded_ofdm import coded_ofdm_rx, coded_ofdm_tx, sync_words  # noqa: E402

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(180)]


def _wait(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.02)
    return cond()


def _pdu(data: bytes, **meta) -> pmt.pmt_t:
    m = pmt.make_dict()
    for k, v in meta.items():
        m = pmt.dict_add(m, pmt.intern(k), pmt.to_pmt(v))
    return pmt.cons(m, pmt.init_u8vector(len(data), list(data)))


def _tx_bursts(items: list[tuple[int | str, bytes]]) -> list[np.ndarray]:
    """Bursts of coded_ofdm_tx (framing off) for (mcs, psdu) pairs, split by length."""
    tb = gr.top_block()
    tx = coded_ofdm_tx(mcs="bpsk-1/2", framing=False)
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    tb.start()
    want = 0
    for mcs, psdu in items:
        tx.framer.to_basic_block()._post(pmt.intern("in"), _pdu(psdu, mcs=mcs))
        want += frame_samples(mcs_by_name(mcs) if isinstance(mcs, str) else mcs, len(psdu))
    assert _wait(lambda: len(sink.data()) >= want)
    tb.stop()
    tb.wait()
    x = np.asarray(sink.data(), np.complex64)
    assert len(x) == want
    out, at = [], 0
    for mcs, psdu in items:
        n = frame_samples(mcs_by_name(mcs) if isinstance(mcs, str) else mcs, len(psdu))
        out.append(x[at : at + n])
        at += n
    return out


def _receive(x: np.ndarray, n_frames: int, **rx_opts) -> tuple[list, list, coded_ofdm_rx]:
    tb = gr.top_block()
    # a source that never ends: a finished one lets GNU Radio stop the demux while it waits for
    # the last header's verdict (a finite stream's artefact, not a receiver's)
    src = pdu.pdu_to_tagged_stream(gr.types.complex_t, "chunk_len")
    src.set_min_output_buffer(1 << 17)
    rx = coded_ofdm_rx(framing=False, **rx_opts)
    out, rep = blocks.message_debug(), blocks.message_debug()
    tb.connect(src, rx)
    tb.msg_connect(rx, "out", out, "store")
    tb.msg_connect(rx, "report", rep, "store")
    tb.start()
    y = np.concatenate([x, np.zeros(4000, np.complex64)]).astype(np.complex64)
    for i in range(0, len(y), 1 << 15):
        c = y[i : i + (1 << 15)]
        src.to_basic_block()._post(
            pmt.intern("pdus"), pmt.cons(pmt.make_dict(), pmt.init_c32vector(len(c), c))
        )
    _wait(lambda: rep.num_messages() >= n_frames)
    time.sleep(0.2)
    tb.stop()
    tb.wait()
    got = [
        (
            pmt.to_python(pmt.car(out.get_message(i))),
            bytes(pmt.u8vector_elements(pmt.cdr(out.get_message(i)))),
        )
        for i in range(out.num_messages())
    ]
    reports = [pmt.to_python(rep.get_message(i)) for i in range(rep.num_messages())]
    return got, reports, rx


def test_bursts_are_the_reference_modulators():
    rng = np.random.default_rng(5)
    items = [
        (m.name, rng.integers(0, 256, 40 + 17 * m.index, dtype=np.uint8).tobytes())
        for m in MCS_TABLE
    ]
    bursts = _tx_bursts(items)
    sw = sync_words()
    for (name, psdu), b in zip(items, bursts, strict=True):
        want = ref.burst(name, psdu, sw)
        assert len(b) == len(want), name
        np.testing.assert_allclose(b, want, atol=2e-5, err_msg=name)
    power = np.mean(np.concatenate([np.abs(b[:-160]) ** 2 for b in bursts]))
    assert power == pytest.approx(1.0, rel=0.05)  # unit mean power


def test_every_mcs_back_to_back_without_reconfiguration():
    """Frames of all nine MCS, twice, abutting (160 zeros each), CFO and noise: one receiver
    decodes each with the MCS its SIGNAL field names, in order."""
    rng = np.random.default_rng(6)
    items = [(m.name, rng.integers(0, 256, 300, dtype=np.uint8).tobytes()) for m in MCS_TABLE] * 2
    rng.shuffle(items)
    x = np.concatenate([np.zeros(500, np.complex64), *_tx_bursts(items)])
    x *= np.exp(2j * np.pi * 0.003 * np.arange(len(x))).astype(np.complex64)  # CFO
    x += rng.standard_normal(2 * len(x)).astype(np.float32).view(np.complex64) * 0.02  # 31 dB
    got, reports, rx = _receive(x, len(items))
    assert [p for _, p in got] == [p for _, p in items]
    assert [meta["mcs"] for meta, _ in got] == [mcs_by_name(n).index for n, _ in items]
    assert all(r["crc_ok"] and r["header_ok"] for r in reports)
    assert [r["mcs"] for r in reports] == [mcs_by_name(n).index for n, _ in items]
    c = rx.counters()
    assert c["payload_ok"] == len(items) and c["payload_crc"] == 0
    assert sum(c["ok_per_mcs"].values()) == len(items)
    assert all(v == 2 for v in c["ok_per_mcs"].values())


@pytest.mark.parametrize("snr_db", [8.0, 20.0])
def test_reported_snr_follows_the_channel(snr_db):
    rng = np.random.default_rng(int(snr_db))
    items = [("qpsk-1/2", rng.integers(0, 256, 200, dtype=np.uint8).tobytes())] * 12
    x = np.concatenate([np.zeros(500, np.complex64), *_tx_bursts(items)])
    sigma = np.sqrt(10 ** (-snr_db / 10) / 2)
    x = x + (rng.standard_normal(2 * len(x)).astype(np.float32).view(np.complex64) * sigma)
    got, reports, _ = _receive(x, len(items))
    snrs = [r["snr_db"] for r in reports if r.get("crc_ok")]
    assert len(snrs) >= 10
    assert abs(np.median(snrs) - snr_db) < 1.5, snrs
    assert all(abs(meta["snr_db"] - snr_db) < 4 for meta, _ in got)


def _tensor_message(n_params: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    t = {"w": rng.standard_normal(n_params).astype(np.float32)}
    return encode_message(Message(type=MessageType.UPDATE, tensors=t))


def _transfer(msg: bytes, **kw) -> tuple[bytes | None, object]:
    a = open_link("ofdm-loopback", 0, nodes=[0, 1], **kw)
    b = open_link("ofdm-loopback", 1, nodes=[0, 1], **kw)
    a.send_async(1, msg, timeout=60)
    got = b.recv(timeout=70)
    return (None if got is None else got[1]), a.network


def test_tensor_message_bit_exact_at_every_mcs():
    """A 12 kB tensor message through link_arq and the coded hier blocks at each MCS in turn
    (one network, 22 dB: above every MCS's 10 % FER SNR; the MCS set on both transmitters
    while the flowgraph runs)."""
    a = open_link("ofdm-loopback", 0, nodes=[0, 1], mcs="bpsk-1/2", snr_db=22.0, network="each")
    b = open_link("ofdm-loopback", 1, nodes=[0, 1], mcs="bpsk-1/2", snr_db=22.0, network="each")
    net = a.network
    before = net.tx[0].frames_per_mcs()
    for mcs in MCS_TABLE:
        net.tx[0].set_mcs(mcs.name)
        net.tx[1].set_mcs(mcs.name)
        msg = _tensor_message(3000, mcs.index)
        a.send_async(1, msg, timeout=60)
        got = b.recv(timeout=70)
        assert got is not None and hashlib.sha256(got[1]).digest() == hashlib.sha256(msg).digest()
        sent = net.tx[0].frames_per_mcs()
        assert sent[mcs.name] - before[mcs.name] >= len(msg) // 1474, mcs.name
        before = sent
    rx = net.rx_chains[0].rx.counters()
    assert all(rx["ok_per_mcs"][m.name] > 0 for m in MCS_TABLE)


@pytest.mark.slow
def test_lenet_update_bit_exact_at_6_db_with_default_options(lenet_state_dict):
    """A LeNet-5 update (fp32, as the link carries it) at 6 dB AWGN, coded PHY with its default
    MCS ("adaptive"); the uncoded PHY delivers nothing below about 17 dB (docs/link.md 9.4)."""
    msg = encode_message(Message(type=MessageType.UPDATE, tensors=lenet_state_dict(3)))
    assert len(msg) > 180_000
    got, net = _transfer(msg, mcs="adaptive", snr_db=6.0, network="lenet6")
    assert got == msg
    assert net.tx[0].frames_per_mcs()["bpsk-1/2"] > 0


def test_adaptive_mcs_climbs_on_a_good_channel():
    """At 25 dB the receiver's reports make the sender leave the robust MCS for a fast one."""
    msg = _tensor_message(40000, 9)
    got, net = _transfer(msg, mcs="adaptive", snr_db=25.0, network="adapt25")
    assert got == msg
    sent = net.tx[0].frames_per_mcs()
    fast = sum(v for k, v in sent.items() if k.startswith(("16qam", "64qam")))
    assert fast > sum(sent.values()) // 2, sent
    assert net.tx[0].policy.snapshot(1)["snr_db"] > 20


def test_link_arq_hands_the_frames_snr_to_its_acks_and_stamps_a_macs_mcs():
    """link_arq: a received frame's "snr_db" metadata goes into the ARQ's ACK (version 2) to its
    sender, every ACK of our own sends comes out on "mcs_feedback" (the peer, its SNR, fragments
    settled and lost) and a frame put out with an MCS (a MAC's choice) carries it as "mcs"."""
    from gnuradio import gr

    from scaleflu.link.arq import AckInfo, decode_ack, encode_ack
    from scaleflu.link.frame import FrameType, decode_frame, encode_frame
    from scaleflu.radio.message_blocks import _KEYS, _meta_int, frame_to_raw_pdu, link_arq

    a = link_arq(1, ack_every=1, raw_frames=True)
    out: list = []
    fb: list = []

    class Tap(gr.basic_block):
        def __init__(self, into: list) -> None:
            gr.basic_block.__init__(self, "tap", None, None)
            self.into = into
            self.message_port_register_in(pmt.intern("in"))
            self.set_msg_handler(pmt.intern("in"), self.handle)

        def handle(self, msg: object) -> None:
            self.into.append(msg)

    tb = gr.top_block()
    t_out, t_fb = Tap(out), Tap(fb)
    tb.msg_connect(a, "frames_out", t_out, "in")
    tb.msg_connect(a, "mcs_feedback", t_fb, "in")
    tb.start()
    try:
        raw = encode_frame(FrameType.DATA, 2, 1, 7, 0, 2, b"x" * 100)
        pdu_in = frame_to_raw_pdu(raw)
        meta = pmt.dict_add(pmt.car(pdu_in), _KEYS["snr_db"], pmt.from_double(13.5))
        a.to_basic_block()._post(pmt.intern("frames_in"), pmt.cons(meta, pmt.cdr(pdu_in)))
        a._transmit(encode_frame(FrameType.DATA, 1, 2, 9, 0, 1, b"y"), 4)  # as a MAC does
        end = time.monotonic() + 5
        while len(out) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        acks = [m for m in out if _meta_int(pmt.car(m), "type") == FrameType.ACK]
        assert acks
        ack = decode_frame(bytes(pmt.u8vector_elements(pmt.cdr(acks[0]))))
        assert decode_ack(ack.payload).snr_db == 13.5
        stamped = [m for m in out if _meta_int(pmt.car(m), "mcs") is not None]
        assert [_meta_int(pmt.car(m), "mcs") for m in stamped] == [4]
        # an ACK of our send to node 2 reporting 21 dB: the feedback for the transmitter
        h = a.send(2, b"z" * 3000)
        done = AckInfo(True, h.count, h.count, b"", 21.0)
        ack_in = encode_frame(FrameType.ACK, 2, 1, h.msg_id, 0, 1, encode_ack(done))
        a.to_basic_block()._post(pmt.intern("frames_in"), frame_to_raw_pdu(ack_in))
        end = time.monotonic() + 5
        while not fb and time.monotonic() < end:
            time.sleep(0.01)
        d = pmt.to_python(fb[0])
        assert d["peer"] == 2 and d["snr_db"] == 21.0 and d["sent"] == h.count
    finally:
        tb.stop()
        tb.wait()
