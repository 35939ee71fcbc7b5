"""The OFDM receiver's own header/payload demux (ofdm_burst_demux): the same frames as the stock
header_payload_demux from the same samples, header failures included, without polling."""

from __future__ import annotations

import math
import time

import numpy as np
import pmt
import pytest
from gnuradio import blocks, channels, gr

gr_scaleflu = pytest.importorskip("gnuradio.scaleflu")
if not hasattr(gr_scaleflu, "ofdm_burst_demux"):
    pytest.skip(
        "gnuradio.scaleflu is an old build without ofdm_burst_demux", allow_module_level=True
    )

from scaleflu.radio.ofdm import ofdm_link_rx, ofdm_link_tx  # noqa: E402
from scaleflu.radio.phy import PhyConfig, burst_power  # noqa: E402


def _run(snr_db: float, n: int, seed: int) -> tuple[list[bytes], list[bytes], ofdm_link_rx]:
    """n frames of random sizes through one channel into two receivers: stock demux, ours."""
    rng = np.random.default_rng(seed)
    phy = PhyConfig()
    tb = gr.top_block()
    tx = ofdm_link_tx(mtu=phy.mtu, src=0, dst=1)
    nv = math.sqrt(burst_power(phy) / 10 ** (snr_db / 10))
    chan = channels.channel_model(nv, 0.002, 1.0, [1.0, 0.3 + 0.2j, 0.1j], seed, False)
    rx_stock = ofdm_link_rx(node_id=1, mtu=phy.mtu, blocking_demux=False)
    rx_ours = ofdm_link_rx(node_id=1, mtu=phy.mtu, blocking_demux=True)
    sinks = [blocks.message_debug(), blocks.message_debug()]
    tb.connect(tx, chan)
    for rx, sink in zip((rx_stock, rx_ours), sinks, strict=True):
        tb.connect(chan, rx)
        tb.msg_connect(rx, "out", sink, "store")
    tb.start()
    port = pmt.intern("in")
    for _ in range(n):
        data = rng.integers(0, 256, int(rng.integers(1, phy.mtu - 26)), dtype=np.uint8)
        tx.framer.to_basic_block()._post(
            port, pmt.cons(pmt.make_dict(), pmt.init_u8vector(len(data), data))
        )
    last, deadline = (-1, -1), time.monotonic() + 60
    while time.monotonic() < deadline:  # until neither receiver got anything for 2 s
        time.sleep(2.0)
        now = (sinks[0].num_messages(), sinks[1].num_messages())
        if now == last and tx.frames_built() == n:
            break
        last = now
    tb.stop()
    tb.wait()
    got = [
        [bytes(pmt.u8vector_elements(pmt.cdr(s.get_message(i)))) for i in range(s.num_messages())]
        for s in sinks
    ]
    return got[0], got[1], rx_ours


@pytest.mark.parametrize(("snr_db", "seed"), [(30.0, 1), (17.5, 2)])
def test_same_frames_as_the_stock_demux(snr_db: float, seed: int) -> None:
    stock, ours, rx = _run(snr_db, 80, seed)
    assert rx.blocking_demux and isinstance(rx.hpd, gr_scaleflu.ofdm_burst_demux)
    assert ours == stock  # bit for bit, in order
    assert rx.hpd.payloads() == rx.guard.passed()
    assert rx.hpd.headers() == rx.hpd.payloads() + rx.hpd.failed()
    if snr_db > 25:
        assert len(ours) == 80 and rx.hpd.failed() == 0
    else:  # near the PHY's threshold: payloads lost to their CRC, the same frames kept
        assert 0 < len(ours) < 80


def _demux_by_hand(ours: bool, first=pmt.PMT_F) -> tuple[list[int], list[int], list]:  # noqa: ANN001
    """Samples numbered 0, 1, 2 ... (as complex values), triggers at 10 and 40, FFT 4, CP 2,
    a 1-symbol header: the first header gets #f, the second a 2-symbol payload."""
    from gnuradio import digital

    fft, cp = 4, 2
    samples = [complex(i) for i in range(200)]
    trig = [0] * 200
    trig[10] = trig[40] = 1
    tb = gr.top_block()
    src = blocks.vector_source_c(samples, True)  # repeated: the stream never ends
    tsrc = blocks.vector_source_b(trig, True)
    if ours:
        demux = gr_scaleflu.ofdm_burst_demux(1, fft, cp, "frame_len", 16)
        verdict = demux.header_data
    else:
        demux = digital.header_payload_demux(1, fft, cp, "frame_len", "", True)

        def verdict(msg):  # noqa: ANN001, ANN202
            demux.to_basic_block()._post(pmt.intern("header_data"), msg)

    hdr, pay = blocks.vector_sink_c(fft), blocks.vector_sink_c(fft)
    tb.connect(src, (demux, 0))
    tb.connect(tsrc, (demux, 1))
    tb.connect((demux, 0), hdr)
    tb.connect((demux, 1), pay)
    tb.start()

    def wait_for(sink, n):  # noqa: ANN001, ANN202
        deadline = time.monotonic() + 10
        while len(sink.data()) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(sink.data()) >= n

    wait_for(hdr, fft)
    verdict(first)
    wait_for(hdr, 2 * fft)
    verdict(pmt.dict_add(pmt.make_dict(), pmt.intern("frame_len"), pmt.from_long(2)))
    wait_for(pay, 2 * fft)
    tb.stop()
    tb.wait()
    tags = [(t.offset, pmt.symbol_to_string(t.key), pmt.to_long(t.value)) for t in pay.tags()]
    return (
        [int(x.real) for x in hdr.data()[: 2 * fft]],
        [int(x.real) for x in pay.data()[: 2 * fft]],
        tags[:1],
    )


@pytest.mark.parametrize("ours", [True, False])
def test_demux_semantics_by_hand(ours: bool) -> None:
    # the header at trigger 10 (prefix dropped: 12..15) is rejected, the search goes on one
    # sample later and finds trigger 40: header 42..45; its payload starts after the header,
    # two symbols without their prefixes (48..51, 54..57), tagged frame_len = 2
    hdr, pay, tags = _demux_by_hand(ours)
    assert hdr == [12, 13, 14, 15, 42, 43, 44, 45]
    assert pay == [48, 49, 50, 51, 54, 55, 56, 57]
    assert tags == [(0, "frame_len", 2)]


def test_bad_arguments_are_refused() -> None:
    for args in (
        (0, 64, 16, "frame_len", 127),
        (3, 0, 16, "frame_len", 127),
        (3, 64, -1, "frame_len", 127),
        (3, 64, 16, "frame_len", 0),
    ):
        with pytest.raises(ValueError):
            gr_scaleflu.ofdm_burst_demux(*args)
    with pytest.raises(ValueError, match="blocking_demux"):
        ofdm_link_rx(node_id=1, guard_headers=False, blocking_demux=True)


@pytest.mark.parametrize(
    "bad",
    [
        pmt.dict_add(pmt.make_dict(), pmt.intern("frame_len"), pmt.from_long(17)),  # > max 16
        pmt.dict_add(pmt.make_dict(), pmt.intern("frame_len"), pmt.from_long(-3)),
        pmt.dict_add(pmt.make_dict(), pmt.intern("frame_len"), pmt.intern("x")),
        pmt.dict_add(pmt.make_dict(), pmt.intern("packet_num"), pmt.from_long(2)),  # no length
        pmt.intern("junk"),
    ],
)
def test_a_bad_verdict_is_a_rejected_header(bad) -> None:  # noqa: ANN001
    # the demux never waits for more samples than the longest payload: a verdict with a bad
    # or missing length counts as failed, and the search goes on as after #f
    hdr, pay, tags = _demux_by_hand(True, bad)
    assert hdr == [12, 13, 14, 15, 42, 43, 44, 45]
    assert pay == [48, 49, 50, 51, 54, 55, 56, 57]


def test_which_receivers_use_it() -> None:
    """gr-digital's demux by default (GRC, radios, the shared medium: noise between bursts);
    ours on the simulated per-pair links (PhyConfig.rx) when the build has it."""
    from gnuradio import digital

    from scaleflu.radio.ofdm import burst_demux_available
    from scaleflu.radio.phy import PhyConfig

    assert burst_demux_available()
    assert isinstance(ofdm_link_rx(node_id=1).hpd, digital.header_payload_demux)
    assert PhyConfig().rx(1).blocking_demux
    assert not PhyConfig().rx(1, blocking_demux=False).blocking_demux
