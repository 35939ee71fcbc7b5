"""The coded PHY's bit chain (C++ through its bindings) against a numpy reference written from
IEEE 802.11 clause 17: encoder, puncturing, Viterbi, interleaver, scrambler, mapping, LLRs,
SIGNAL field, the MCS table shared with the pure-Python side."""

from __future__ import annotations

import coded_reference as ref
import numpy as np
import pytest

from scaleflu.link import mcs as phy_mcs

S = pytest.importorskip("gnuradio.scaleflu")
pytestmark = pytest.mark.gnuradio


def test_mcs_tables_agree_and_versions_match():
    cpp = S.phy_mcs_table()
    assert S.PHY_MCS_TABLE_VERSION == phy_mcs.MCS_TABLE_VERSION == 1
    assert [m["name"] for m in cpp] == [m.name for m in phy_mcs.MCS_TABLE] == ref.NAMES
    for c, p in zip(cpp, phy_mcs.MCS_TABLE, strict=True):
        assert (c["index"], c["bpsc"], tuple(c["rate"]), c["coded"]) == (
            p.index,
            p.bpsc,
            p.rate,
            p.coded,
        )
        assert (c["cbps"], c["dbps"]) == (p.cbps, p.dbps)
    rng = np.random.default_rng(0)
    for m in phy_mcs.MCS_TABLE:
        for n in [1, 2, 25, 26, 1474, 1500, *rng.integers(1, 4000, 20).tolist()]:
            assert S.phy_payload_symbols(m.index, int(n)) == phy_mcs.payload_symbols(m, int(n))
            assert phy_mcs.payload_symbols(m, int(n)) == ref.payload_symbols(m.name, int(n))


def test_encoder_puncturing_interleaver_scrambler_match_the_reference():
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2, 432, dtype=np.uint8)  # whole periods of every rate
    coded = S.phy_conv_encode(bits)
    assert np.array_equal(coded, ref.conv_encode(bits))
    for rate in ((1, 2), (2, 3), (3, 4)):
        assert np.array_equal(S.phy_puncture(coded, *rate), ref.puncture(coded, rate))
    for bpsc in (1, 2, 4, 6):
        assert (
            S.phy_interleaver_map(48 * bpsc, bpsc) == ref.interleave_index(48 * bpsc, bpsc).tolist()
        )
    z = np.zeros(300, np.uint8)
    for seed in (0x7F, 0x5D, 1):
        assert np.array_equal(S.phy_scramble(z, seed), ref.scrambler_sequence(300, seed))
    with pytest.raises(ValueError):
        S.phy_puncture(coded[:10], 3, 4)  # not whole puncturing periods
    with pytest.raises(ValueError):
        S.phy_puncture(coded, 5, 6)


@pytest.mark.parametrize("rate", [(1, 2), (2, 3), (3, 4)])
def test_viterbi_matches_a_textbook_viterbi_on_noisy_llrs(rate):
    rng = np.random.default_rng(rate[0] * 10 + rate[1])
    n = 120
    bits = rng.integers(0, 2, n, dtype=np.uint8)
    bits[-6:] = 0
    sent = S.phy_puncture(S.phy_conv_encode(bits), *rate)
    llr = ((2.0 * sent - 1.0) + 0.9 * rng.standard_normal(len(sent))).astype(np.float32)
    full = S.phy_depuncture(llr, n, *rate)
    assert np.count_nonzero(full == 0) == 2 * n - len(sent)
    ours = S.phy_viterbi_decode(full)
    assert np.array_equal(ours, ref.viterbi(full))
    assert np.count_nonzero((llr > 0) != sent) > 0  # hard decisions are wrong in places
    # at a milder noise the rate-1/2 code corrects every wrong hard decision
    if rate == (1, 2):
        mild = ((2.0 * sent - 1.0) + 0.6 * rng.standard_normal(len(sent))).astype(np.float32)
        assert np.count_nonzero((mild > 0) != sent) > 0
        assert np.array_equal(S.phy_viterbi_decode(S.phy_depuncture(mild, n, *rate)), bits)


def test_mapping_matches_the_802_11a_tables():
    rng = np.random.default_rng(2)
    for bpsc in (1, 2, 4, 6):
        bits = rng.integers(0, 2, 96 * bpsc, dtype=np.uint8)
        np.testing.assert_allclose(S.phy_map_bits(bits, bpsc), ref.map_bits(bits, bpsc), atol=1e-6)


def test_llr_signs_scale_and_reliability():
    rng = np.random.default_rng(3)
    for bpsc in (1, 2, 4, 6):
        bits = rng.integers(0, 2, 480 * bpsc, dtype=np.uint8)
        x = S.phy_map_bits(bits, bpsc)
        h = (rng.standard_normal(len(x)) + 1j * rng.standard_normal(len(x))).astype(np.complex64)
        y = (x * h).astype(np.complex64)
        llr = S.phy_demap_llr(y, h, 0.05, bpsc)
        assert np.array_equal(llr > 0, bits == 1)  # noise-free: every sign right
        # LLRs scale with 1 / noise_var and |h|^2
        np.testing.assert_allclose(S.phy_demap_llr(y, h, 0.1, bpsc), llr / 2, rtol=1e-4)
        np.testing.assert_allclose(
            S.phy_demap_llr((2 * y).astype(np.complex64), (2 * h).astype(np.complex64), 0.2, bpsc),
            llr,
            rtol=1e-4,
        )
        # noisy (y = h x + w): an LLR of magnitude l is wrong about 1 / (1 + e^l) of the time
        nv = 0.5
        w = (rng.standard_normal(len(x)) + 1j * rng.standard_normal(len(x))) * np.sqrt(nv / 2)
        ln = S.phy_demap_llr((y + w).astype(np.complex64), h, nv, bpsc)
        wrong = (ln > 0) != (bits == 1)
        assert wrong[np.abs(ln) > 6].mean() < 0.01
        assert 0.2 < wrong[np.abs(ln) < 1].mean() < 0.6
    # BPSK closed form: L = 4 Re(y h*) / noise_var
    y = np.array([0.3 + 0.4j], np.complex64)
    h = np.array([2 - 1j], np.complex64)
    assert S.phy_demap_llr(y, h, 0.5, 1)[0] == pytest.approx(4 * (0.6 - 0.4) / 0.5, rel=1e-5)


def test_signal_field_round_trip_and_rejections():
    for mcs in range(len(ref.NAMES)):
        for length in (1, 100, 1500, 65535):
            sig = S.phy_signal_bytes(mcs, length)
            assert sig == ref.signal_bytes(mcs, length)
            coded = S.phy_signal_coded_bits(mcs, length)
            assert np.array_equal(coded, ref.signal_coded(sig))
            llr = (4.0 * coded - 2.0).astype(np.float32)
            assert S.phy_decode_signal(llr, 65535) == (mcs, length)
    assert S.phy_parse_signal(ref.signal_bytes(3, 2000), 1500) == "bad length"
    assert S.phy_parse_signal(ref.signal_bytes(3, 0), 1500) == "bad length"
    assert S.phy_parse_signal(ref.signal_bytes(17, 100), 1500) == "unknown mcs"
    assert S.phy_parse_signal(ref.signal_bytes(3, 100, version=2), 1500) == (
        "other mcs table version"
    )
    bad = bytearray(ref.signal_bytes(3, 100))
    bad[2] ^= 0x10
    assert S.phy_parse_signal(bytes(bad), 1500) == "signal crc mismatch"
    assert S.phy_crc16(b"123456789") == 0x29B1 == ref.crc16(b"123456789")
    with pytest.raises(ValueError):
        S.phy_signal_bytes(9, 100)


def test_random_signal_llrs_are_never_accepted():
    rng = np.random.default_rng(4)
    for _ in range(3000):
        llr = (3.0 * rng.standard_normal(96)).astype(np.float32)
        assert isinstance(S.phy_decode_signal(llr, 1500), str)


@pytest.mark.parametrize("name", ref.NAMES)
def test_payload_coding_matches_the_reference_and_decodes(name):
    rng = np.random.default_rng(ref.NAMES.index(name))
    psdu = rng.integers(0, 256, 301, dtype=np.uint8).tobytes()
    mcs = ref.NAMES.index(name)
    bits = S.phy_encode_payload_bits(mcs, psdu)
    assert np.array_equal(bits, ref.payload_coded(name, psdu))
    llr = (3.0 * bits - 1.5).astype(np.float32)
    assert S.phy_decode_payload_bits(mcs, llr, len(psdu)) == (True, psdu)
    llr[5] = -llr[5]  # one wrong bit: a code corrects it, the uncoded MCS fails its CRC
    ok, out = S.phy_decode_payload_bits(mcs, llr, len(psdu))
    assert ok == (name != "qpsk-uncoded") and (out == psdu) == ok
