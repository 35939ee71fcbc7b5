"""Hostile input to the coded PHY: SIGNAL fields naming unknown MCS, another table version,
impossible lengths or a broken CRC, bursts cut short, garbage and non-finite samples, bad PDUs
and bad feedback. Each is dropped and counted; the receiver keeps decoding the frames after."""

from __future__ import annotations

import time

import coded_reference as ref
import numpy as np
import pmt
import pytest

gr = pytest.importorskip("gnuradio.gr")
S = pytest.importorskip("gnuradio.scaleflu")

from gnuradio import blocks, pdu  # noqa: E402

from scaleflu.radio.coded_ofdm import coded_ofdm_rx, coded_ofdm_tx, sync_words  # noqa: E402

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(120)]


def _wait(cond, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and not cond():
        time.sleep(0.02)
    return cond()


def _run_rx(x: np.ndarray, expect_reports: int, **rx_opts):
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
    _wait(lambda: rep.num_messages() >= expect_reports)
    time.sleep(0.3)
    tb.stop()
    tb.wait()
    got = [
        bytes(pmt.u8vector_elements(pmt.cdr(out.get_message(i)))) for i in range(out.num_messages())
    ]
    reports = [pmt.to_python(rep.get_message(i)) for i in range(rep.num_messages())]
    return got, reports, rx


def test_hostile_signal_fields_are_dropped_and_counted():
    """Between good frames: SIGNAL fields with an unknown MCS, another table version, length 0,
    a length over the receiver's MTU (valid CRC each), a broken CRC, and a valid SIGNAL
    whose payload is cut short. No stall: the good frames after each are delivered."""
    rng = np.random.default_rng(11)
    sw = sync_words()
    good = [rng.integers(0, 256, 200, dtype=np.uint8).tobytes() for _ in range(7)]
    psdu = rng.integers(0, 256, 200, dtype=np.uint8).tobytes()
    broken = bytearray(ref.signal_bytes(2, 200))
    broken[4] ^= 0xFF
    hostile = [
        ref.burst("qpsk-1/2", psdu, sw, signal=ref.signal_bytes(23, 200)),  # unknown MCS
        ref.burst("qpsk-1/2", psdu, sw, signal=ref.signal_bytes(2, 200, version=5)),
        ref.burst("qpsk-1/2", psdu, sw, signal=ref.signal_bytes(2, 0)),  # length 0
        ref.burst("qpsk-1/2", psdu, sw, signal=ref.signal_bytes(2, 60000), n_sym=3),  # > MTU
        ref.burst("qpsk-1/2", psdu, sw, signal=bytes(broken)),
        # a valid SIGNAL for 1500 B, but only 5 payload symbols follow, then the next frame
        ref.burst("qpsk-1/2", psdu, sw, signal=ref.signal_bytes(2, 1500), n_sym=5),
    ]
    parts = [np.zeros(300, np.complex64)]
    for i, h in enumerate(hostile):
        parts += [ref.burst("qpsk-1/2", good[i], sw), h]
    parts += [np.zeros(20000, np.complex64), ref.burst("qpsk-1/2", good[6], sw)]
    x = np.concatenate(parts).astype(np.complex64)
    x += rng.standard_normal(2 * len(x)).astype(np.float32).view(np.complex64) * 0.01
    got, reports, rx = _run_rx(x, 12)
    c = rx.counters()
    assert c["signal_unknown_mcs"] == 1
    assert c["signal_version"] == 1
    assert c["signal_bad_length"] == 2
    assert c["signal_crc"] >= 1
    # every good frame arrives; the cut-off one does not (its "payload" is the next frame, which
    # it swallows or the CRC32 rejects: at most one good frame is lost to it)
    assert set(good[:5]) <= set(got) and good[6] in got
    assert psdu not in got
    assert c["payload_ok"] >= 6
    reasons = sorted(r["reason"] for r in reports if not r["header_ok"])
    assert "unknown mcs" in reasons and "other mcs table version" in reasons
    assert reasons.count("bad length") == 2


def test_garbage_and_non_finite_samples_then_frames_still_decode():
    rng = np.random.default_rng(12)
    sw = sync_words()
    good = [rng.integers(0, 256, 300, dtype=np.uint8).tobytes() for _ in range(3)]
    junk = [
        (rng.standard_normal(50000) + 1j * rng.standard_normal(50000)) * 3,  # loud noise
        np.full(3000, np.nan + 1j * np.nan),
        np.full(3000, np.inf),
        np.full(3000, 1e30 + 0j),
        np.tile(np.asarray(ref.burst("bpsk-1/2", good[0], sw)[:240]), 20),  # preambles only
        np.zeros(10000),
    ]
    x = np.concatenate([*junk, *(ref.burst("qpsk-3/4", g, sw) for g in good)]).astype(np.complex64)
    got, reports, rx = _run_rx(x, 3)
    assert got == good
    assert rx.counters()["payload_ok"] == 3


def test_bad_pdus_into_the_transmitter_are_dropped_and_counted():
    tb = gr.top_block()
    tx = coded_ofdm_tx(mcs="qpsk-1/2", framing=False, mtu=500)
    sink = blocks.vector_sink_c()
    tb.connect(tx, sink)
    tb.start()
    port = pmt.intern("in")
    post = tx.framer.to_basic_block()._post
    u8 = pmt.init_u8vector(10, list(range(10)))

    def meta(**kv):
        m = pmt.make_dict()
        for k, v in kv.items():
            m = pmt.dict_add(m, pmt.intern(k), v)
        return m

    for bad in (
        pmt.intern("not a pdu"),
        pmt.cons(pmt.make_dict(), pmt.init_f32vector(3, [1.0, 2.0, 3.0])),  # not u8
        pmt.cons(meta(mcs=pmt.from_long(31)), u8),  # unknown MCS index
        pmt.cons(meta(mcs=pmt.intern("256qam-5/6")), u8),  # unknown MCS name
        pmt.cons(meta(mcs=pmt.from_double(2.5)), u8),
        pmt.cons(pmt.make_dict(), pmt.init_u8vector(501, [0] * 501)),  # over the MTU
        pmt.cons(pmt.make_dict(), pmt.init_u8vector(0, [])),  # empty
    ):
        post(port, bad)
    post(port, pmt.cons(meta(mcs=pmt.intern("64qam-3/4")), u8))
    assert _wait(lambda: tx.frames_built() == 1)
    time.sleep(0.1)
    tb.stop()
    tb.wait()
    assert tx.framer.frames_dropped() == 7
    assert tx.frames_per_mcs()["64qam-3/4"] == 1
    with pytest.raises(ValueError):
        tx.set_mcs("nope")
    with pytest.raises(ValueError):
        tx.framer.set_dst_mcs(1, 17)


def test_bad_feedback_is_ignored_and_counted():
    tx = coded_ofdm_tx(mcs="adaptive")
    a = tx.adapter
    for bad in (
        pmt.intern("x"),
        pmt.make_dict(),
        pmt.dict_add(pmt.make_dict(), pmt.intern("snr_db"), pmt.intern("high")),
        pmt.dict_add(pmt.make_dict(), pmt.intern("snr_db"), pmt.from_double(float("nan"))),
    ):
        a._on_feedback(bad)
    assert a.bad_feedback == 3 and a.policy.choose(None) == 0  # NaN: counted, not used
    good = pmt.dict_add(pmt.make_dict(), pmt.intern("snr_db"), pmt.from_double(30.0))
    good = pmt.dict_add(good, pmt.intern("node"), pmt.from_long(4))
    for _ in range(3):
        a._on_feedback(good)
    assert a.policy.choose(4) == 7 and tx.framer.dst_mcs(4) == 7
    assert tx.framer.dst_mcs(5) == 0  # other destinations keep the robust MCS
