"""open_link on the GNU Radio kinds: option routing, errors, the PHY's arithmetic."""

from __future__ import annotations

import pytest

from scaleflu.linkkinds import open_link
from scaleflu.radio.ofdm import auto_min_output_buffer, ofdm_carriers, samples_per_frame
from scaleflu.radio.phy import ChannelConfig, PhyConfig, phy_rate_bytes_per_s, split_phy_options

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(60)]


def test_memory_kind_delivers():
    a = open_link("memory", 0, network="m1", loss=0.1, seed=2)
    b = open_link("memory", 1, network="m1")
    assert a.send(1, b"hello" * 1000, timeout=10).ok
    assert b.recv(timeout=5) == (0, b"hello" * 1000)


def test_option_routing():
    phy, ch, rest = split_phy_options(
        dict(fft_len=128, bps_payload=1, snr_db=15, taps=[1, 0.5j], window=8, deadline=5.0)
    )
    assert phy == PhyConfig(fft_len=128, bps_payload=1)
    assert ch == ChannelConfig(snr_db=15, taps=(1 + 0j, 0.5j))
    assert rest == {"window": 8, "deadline": 5.0}
    assert abs(sum(abs(t) ** 2 for t in ch.normalised_taps()) - 1.0) < 1e-12


def test_errors():
    with pytest.raises(ValueError, match="unknown link kind"):
        open_link("carrier-pigeon", 0)
    with pytest.raises(ValueError, match="needs nodes"):
        open_link("ofdm-loopback", 0, network="nobody")
    with pytest.raises(ValueError, match="do not apply"):
        open_link("uhd", 0, snr_db=10)
    with pytest.raises(ValueError, match="at least one peer"):
        open_link("ofdm-pairs", 0, peers=[0])


def test_phy_arithmetic():
    occ, pil, _ = ofdm_carriers(64)
    assert len(occ[0]) == 48 and pil == ((-21, -7, 7, 21),)
    occ128, pil128, _ = ofdm_carriers(128)
    assert len(occ128[0]) + 4 == 2 * 52 and 0 not in occ128[0]
    # 1500 B + 4 B CRC in QPSK over 48 carriers: 126 symbols + 3 preamble/header, 80 samples each
    assert samples_per_frame(1500, post_padding=0) == (3 + 126) * 80
    assert auto_min_output_buffer(1500, 2) == 32768
    assert 500_000 < phy_rate_bytes_per_s(PhyConfig(), 5e6) < 800_000
