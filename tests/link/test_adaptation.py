"""Link adaptation at frame level: the MCS error model, the frames that carry SNRs and MCS
choices (ACK version 2, MAC version 2), and the server's MAC choosing each robot's MCS."""

from __future__ import annotations

import random
import struct

import pytest

from scaleflu.link.arq import ACK_SNR, AckInfo, ArqConfig, ArqEndpoint, decode_ack, encode_ack
from scaleflu.link.defaults import ARQ_DEFAULTS, MAC_DEFAULTS
from scaleflu.link.frame import decode_frame
from scaleflu.link.mac import MacConfig, MacFrameError, MacServer, MacStation
from scaleflu.link.mac.frames import (
    HEARD_UNKNOWN,
    NO_MCS,
    _grant_body,
    _parse_grant,
    _parse_report,
    _report_body,
)
from scaleflu.link.macsim import MacSim, simulate_round
from scaleflu.link.mcs import (
    MCS_TABLE,
    STOCK,
    frame_airtime_s,
    frame_error_rate,
    mcs_by_name,
    mcs_name,
    parse_phy_mcs,
)

# -- the error model ---------------------------------------------------------------------------


def test_error_model_follows_the_measured_curves():
    for m in MCS_TABLE:
        # the table's 10 % FER SNR lies where the curve crosses 10 % (within a dB)
        assert frame_error_rate(m, m.snr_db - 1.0) > 0.1 > frame_error_rate(m, m.snr_db + 1.0)
        assert frame_error_rate(m, m.snr_db + 6) == 0.0 and frame_error_rate(m, -20) == 1.0
        # shorter frames lose fewer bits, but never less than the preamble / SIGNAL detection
        assert frame_error_rate(m, m.snr_db, 100) <= frame_error_rate(m, m.snr_db, 1500)
        assert frame_error_rate(m, 0.0, 40) >= frame_error_rate("bpsk-1/2", 0.0)
    assert 0.3 < frame_error_rate(STOCK, 18.0) < 0.5 and frame_error_rate(None, 20.0) == 0.0
    assert frame_error_rate(7, float("nan")) == 1.0
    with pytest.raises(ValueError):
        frame_error_rate("adaptive", 10.0)
    # airtime: the stock frame as radio.ofdm.samples_per_frame (10 480 samples at 1500 B)
    assert frame_airtime_s(STOCK, 1500) * 5e6 == pytest.approx(10480)
    assert frame_airtime_s("64qam-3/4", 1500) < frame_airtime_s(STOCK, 1500) / 2
    assert parse_phy_mcs(None) == parse_phy_mcs("none") == parse_phy_mcs("Stock") == STOCK
    assert mcs_name("auto") == "adaptive" and mcs_name(3) == "qpsk-3/4"
    # a bad PHY name (config, --mcs) is one line naming the modes and the table's MCS
    with pytest.raises(ValueError, match=r"'bogus': not auto \(adaptive\), stock .*bpsk-1/2"):
        mcs_name("bogus")


# -- ACK version 2: the receiver's SNR ------------------------------------------------------------


def test_ack_snr_round_trips_and_bad_fields_are_refused():
    for info in (
        AckInfo(False, 100, 3, b"\xf0\x01", 17.25),
        AckInfo(True, 9, 9, b"", -3.5),
        AckInfo(False, 5, 0, b"", None),
    ):
        assert decode_ack(encode_ack(info)) == info
    assert encode_ack(AckInfo(True, 9, 9, b"")) == bytes([1]) + struct.pack(">IIH", 9, 9, 0)
    assert decode_ack(encode_ack(AckInfo(True, 9, 9, b"", 500.0))).snr_db == 100.0  # clamped
    good = encode_ack(AckInfo(False, 100, 3, b"\xf0", 12.0))
    for bad in (
        good[:-1],  # SNR field cut
        good + b"\x00",
        bytes([good[0] | 0x04]) + good[1:],  # unknown flag
        bytes([good[0] & ~ACK_SNR]) + good[1:],  # SNR bytes without the flag
        good[:-2] + struct.pack(">h", 4 * 120),  # 120 dB: out of range
        good[:-2] + struct.pack(">h", -4 * 60),
    ):
        with pytest.raises(ValueError):
            decode_ack(bad)
    rng = random.Random(5)
    for _ in range(2000):  # fuzz: decode raises ValueError or gives a consistent ACK
        n = rng.randrange(0, 24)
        junk = bytes([rng.choice((0, 1, 2, 3, rng.randrange(256)))]) + rng.randbytes(n)
        try:
            a = decode_ack(junk)
        except ValueError:
            continue
        assert a.base <= a.count and (a.snr_db is None or -50 <= a.snr_db <= 100)


def test_acks_carry_the_snr_of_the_senders_frames_and_feed_the_report_hook():
    out_a: list[bytes] = []
    out_b: list[bytes] = []
    t = [0.0]
    a = ArqEndpoint(1, out_a.append, clock=lambda: t[0], config=ArqConfig(ack_every=4))
    b = ArqEndpoint(2, out_b.append, clock=lambda: t[0], config=ArqConfig(ack_every=4))
    reports = []
    a.on_peer_report = lambda peer, snr, acked, lost: reports.append((peer, snr, acked, lost))
    a.send(2, bytes(range(256)) * 30)
    for raw in out_a:
        b.on_frame(raw, snr_db=14.5)  # what b's PHY measured on a's frames
    acks = [decode_frame(r) for r in out_b]
    assert acks and all(decode_ack(f.payload).snr_db == 14.5 for f in acks)
    for raw in out_b:
        a.on_frame(raw)
    assert reports and reports[0][:2] == (2, 14.5) and sum(r[2] for r in reports) > 0
    assert b.rx_snr(1) == 14.5 and b.rx_snr(9) is None


# -- MAC version 2: the MCS in the GRANT, SNR and losses in the REPORT ----------------------------


def test_grant_and_report_v2_round_trip_and_refuse_bad_fields():
    g = _parse_grant(_grant_body(7, 4096, [(11, 168)], mcs=5, heard=12))
    assert (g.seq, g.budget, g.mcs, g.heard, g.bcasts) == (7, 4096, 5, 12, [(11, 168)])
    g = _parse_grant(_grant_body(8, 4096, []))
    assert g.mcs is None and g.heard is None
    with pytest.raises(ValueError):
        _grant_body(1, 10, [], mcs=len(MCS_TABLE))
    bad_mcs = struct.pack(">IIBHB", 1, 10, len(MCS_TABLE), HEARD_UNKNOWN, 0)
    with pytest.raises(MacFrameError, match="MCS"):
        _parse_grant(bad_mcs)
    r = _parse_report(_report_body(3, 9, [], sent=40, snr_db=-7.75))
    assert (r.seq, r.backlog, r.sent, r.snr_db, r.items) == (3, 9, 40, -7.75, [])
    assert _parse_report(_report_body(3, 9, [])).snr_db is None
    with pytest.raises(MacFrameError, match="SNR"):
        _parse_report(struct.pack(">IIHhB", 1, 0, 0, 4 * 101, 0))
    rng = random.Random(2)
    for _ in range(3000):  # fuzz: MacFrameError or a parse within the fields' ranges
        body = rng.randbytes(rng.randrange(0, 40))
        for parse in (_parse_grant, _parse_report):
            try:
                v = parse(body)
            except MacFrameError:
                continue
            if parse is _parse_grant:
                assert v.mcs is None or 0 <= v.mcs < len(MCS_TABLE)
            else:
                assert v.snr_db is None or -50 <= v.snr_db <= 100
    assert NO_MCS == 0xFF


def test_a_stock_robot_refuses_a_grant_that_names_an_mcs():
    sim = MacSim(MacConfig(contention_slots=0))
    ep = ArqEndpoint(1, lambda raw: None, clock=sim.clock)
    st = MacStation(ep, sim.transmitter(1), sim.config, joined=True)
    from scaleflu.link.mac import MacType, encode_mac, mac_on_air

    body = _grant_body(1, 4096, [], mcs=3)
    st.on_frame(mac_on_air(encode_mac(MacType.GRANT, 0, 1, body), 0, 1))
    assert st.stats.bad_frames == 1 and st.stats.reports_tx == 0


# -- the server's choices -------------------------------------------------------------------------


def _adaptive_sim(snr: dict[int, float]) -> tuple[MacSim, MacServer, dict[int, ArqEndpoint]]:
    cfg = MacConfig(**MAC_DEFAULTS["virtual"], contention_slots=0, mcs="adaptive")
    sim = MacSim(cfg, snr_fn=lambda src, dst, t: snr[max(src, dst)], seed=1)
    eps = {n: ArqEndpoint(n, sim.transmitter(n), clock=sim.clock) for n in (0, 1, 2)}
    srv = MacServer(eps[0], sim.transmitter(0), cfg, members=[1, 2], seed=0)
    sim.add(0, srv)
    for r in (1, 2):
        sim.add(r, MacStation(eps[r], sim.transmitter(r), cfg, joined=True, seed=r))
    return sim, srv, eps


def test_the_server_grants_a_high_mcs_at_high_snr_and_the_robust_one_to_a_weak_robot():
    snr = {1: 30.0, 2: 4.0}
    sim, srv, eps = _adaptive_sim(snr)
    sim.run_until(lambda: False, max_time=2.0)
    top = mcs_by_name("64qam-3/4").index
    assert srv.mcs_up(1) == top and srv.mcs_down(1) == top
    weak = srv.mcs_up(2)
    assert MCS_TABLE[weak].snr_db + 2.0 <= 4.0 + 1.0  # what fits 4 dB with the margin
    assert srv.mcs_broadcast([1, 2]) == srv.mcs_down(2)  # the weakest target's
    assert srv.mcs_broadcast([1]) == top
    # an upload of robot 1 goes at the top MCS, robot 2's at its own
    done = {}
    for r in (1, 2):
        eps[r].send(0, bytes(30000), deadline=30)
        eps[0].on_message = lambda src, p: done.setdefault(src, p)
        sim.touch(r)
    sim.run_until(lambda: len(done) == 2, max_time=sim.now + 20)
    assert set(done) == {1, 2} and all(p == bytes(30000) for p in done.values())
    a = srv.adaptation()["robots"]
    assert a[1]["bytes_up_by_mcs"].get("64qam-3/4", 0) > 25000
    assert MCS_TABLE[weak].name in a[2]["bytes_up_by_mcs"]


def test_after_losses_the_server_falls_back_to_the_most_robust_mcs_quickly():
    snr = {1: 30.0, 2: 30.0}
    sim, srv, eps = _adaptive_sim(snr)
    sim.run_until(lambda: False, max_time=1.5)
    assert srv.mcs_up(1) == mcs_by_name("64qam-3/4").index
    eps[1].send(0, bytes(200000), deadline=60)
    sim.touch(1)
    sim.run_until(lambda: srv.links[1].up_frames > 20, max_time=sim.now + 5)
    snr[1] = 7.0  # a deep fade: every 64-QAM frame is lost, BPSK control frames pass
    t_fade = sim.now
    sim.run_until(lambda: srv.mcs_up(1) == srv.up.robust, max_time=sim.now + 5)
    assert srv.mcs_up(1) == srv.up.robust
    assert sim.now - t_fade < 0.5  # within the next grant or two, not seconds
    assert srv.stats.mcs_fallbacks >= 1


def test_adaptive_round_on_a_fading_channel_is_bit_exact_and_faster_than_stock():
    from scaleflu.link.fading import FadingTrace

    traces: dict = {}

    def snr_fn(src: int, dst: int, t: float) -> float:  # the demo's channel, as the medium's
        if (src, dst) not in traces:
            traces[(src, dst)] = FadingTrace(3, src, dst, "rician", 6.0, 2.0)
        return 20.0 + traces[(src, dst)].gain_db(t)

    res = {}
    for mode in ("adaptive", None):
        mac = MacConfig(**MAC_DEFAULTS["virtual"], mcs=mode)
        r = simulate_round(
            "scheduled",
            3,
            100000,
            train_s=0.5,
            deadline_s=60,
            seed=3,
            mac=mac,
            arq=ArqConfig(**ARQ_DEFAULTS["mac"], deadline=60),
            snr_fn=snr_fn,
        )
        assert r["models_bit_exact"] == 3 and r["updates_bit_exact"] == 3
        res[mode] = r
    assert res["adaptive"]["closed_s"] < res[None]["closed_s"]
    assert STOCK not in res["adaptive"]["bytes_by_mcs"]
    assert set(res[None]["bytes_by_mcs"]) == {STOCK}


def test_without_any_snr_the_adaptive_mac_sends_at_the_phys_one_rate():
    """A medium whose PHY measures no SNR (a frame hub without a PHY model): an adaptive MAC has
    nothing to adapt from, so its grants name no MCS and DATA goes at the one rate."""
    cfg = MacConfig(**MAC_DEFAULTS["virtual"], contention_slots=0, mcs="adaptive")
    sim = MacSim(cfg, seed=1)  # no snr_fn: frames arrive without an SNR
    eps = {n: ArqEndpoint(n, sim.transmitter(n), clock=sim.clock) for n in (0, 1)}
    srv = MacServer(eps[0], sim.transmitter(0), cfg, members=[1], seed=0)
    sim.add(0, srv)
    sim.add(1, MacStation(eps[1], sim.transmitter(1), cfg, joined=True, seed=1))
    done = {}
    eps[0].on_message = lambda src, p: done.setdefault(src, p)
    eps[1].send(0, bytes(20000), deadline=30)
    sim.touch(1)
    sim.run_until(lambda: 1 in done, max_time=10)
    assert done == {1: bytes(20000)}
    assert srv.mcs_up(1) is None and srv.mcs_broadcast([1]) is None
    assert sim.stats.bytes_by_mcs.get(STOCK, 0) >= 20000  # the DATA at the one rate
