"""The pure-Python MCS table and link adaptation policy (no GNU Radio)."""

from __future__ import annotations

import pytest

from scaleflu.link.mcs import (
    ADAPTIVE,
    MCS_TABLE,
    McsPolicy,
    McsPolicyConfig,
    airtime_s,
    frame_samples,
    mcs_by_name,
    parse_mcs,
    payload_symbols,
)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_parse_and_airtime():
    assert parse_mcs("auto") == ADAPTIVE == parse_mcs("Adaptive")
    assert parse_mcs(3) is MCS_TABLE[3] is parse_mcs("QPSK-3/4") is parse_mcs("3")
    for bad in ("qpsk", 9, -1, True, "64qam-5/6"):
        with pytest.raises(ValueError):
            parse_mcs(bad)
    with pytest.raises(ValueError, match="known: bpsk-1/2"):
        mcs_by_name("nope")
    # 1500 B at BPSK 1/2: (8 * 1504 + 6) / 24 -> 502 symbols; + 4 preamble/SIGNAL, 80 each
    assert payload_symbols("bpsk-1/2", 1500) == 502
    assert frame_samples("bpsk-1/2", 1500) == (4 + 502) * 80 + 160
    assert airtime_s("64qam-3/4", 1500) == pytest.approx((4 + 56) * 80 / 5e6 + 160 / 5e6)
    assert not mcs_by_name("qpsk-uncoded").coded and payload_symbols(8, 1500) == 126
    with pytest.raises(ValueError):
        payload_symbols(0, 0)


def test_policy_climbs_with_hysteresis_and_drops_at_once():
    clock = _Clock()
    p = McsPolicy(McsPolicyConfig(margin_db=2.0, up_hysteresis_db=1.0, up_after=2), clock=clock)
    assert p.choose(1) == 0  # no report yet: the most robust
    top = p.ladder[-1]
    p.report(1, top.snr_db + 3.5)
    assert p.choose(1) == 0  # one report is not enough to climb
    p.report(1, top.snr_db + 3.5)
    assert p.choose(1) == top.index
    # just under the threshold + margin: down at once, to the best MCS that fits
    p.report(1, top.snr_db + 1.5)
    assert p.choose(1) != top.index
    got = mcs_by_name(MCS_TABLE[p.choose(1)].name)
    assert got.snr_db + 2.0 <= top.snr_db + 1.5
    assert p.choose(2) == 0  # another peer has its own state
    assert "qpsk-uncoded" not in [m.name for m in p.ladder]  # dominated by 16qam-1/2


def test_policy_falls_back_after_losses_and_when_stale():
    clock = _Clock()
    cfg = McsPolicyConfig(fallback_after=3, hold=2, stale_s=5.0, up_after=1)
    p = McsPolicy(cfg, clock=clock)
    p.report(None, 30.0)
    assert p.choose(7) == p.ladder[-1].index  # a link-wide report covers every peer
    p.report(7, 30.0)
    for _ in range(2):
        p.lost(7)
    assert p.choose(7) == p.ladder[-1].index
    p.lost(7)
    assert p.choose(7) == 0
    p.report(7, 30.0)  # held at the robust MCS for 2 reports
    p.report(7, 30.0)
    assert p.choose(7) == 0
    p.report(7, 30.0)
    assert p.choose(7) == p.ladder[-1].index
    assert p.snapshot(7)["fallbacks"] == 1
    clock.t += 6.0
    assert p.choose(7) == 0  # no report for stale_s: robust again
    p.report(7, float("nan"))  # ignored
    assert p.choose(7) == 0


def test_policy_config_is_checked():
    for bad in (
        {"up_after": 0},
        {"stale_s": 0},
        {"margin_db": float("inf")},
        {"candidates": ()},
        {"candidates": ("qpsk-9/10",)},
    ):
        with pytest.raises(ValueError):
            McsPolicyConfig(**bad)
    p = McsPolicy(McsPolicyConfig(candidates=("qpsk-uncoded", "bpsk-1/2")))
    assert [m.name for m in p.ladder] == ["bpsk-1/2", "qpsk-uncoded"]
