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
    p.report(1, p.ladder[2].snr_db + 2.5)  # the first report sets the MCS at once
    assert p.choose(1) == p.ladder[2].index
    p.report(1, top.snr_db + 3.5)
    assert p.choose(1) == p.ladder[2].index  # one report is not enough to climb
    p.report(1, top.snr_db + 3.5)
    assert p.choose(1) == top.index
    # just under the threshold + margin: down at once, to the best MCS that fits
    p.report(1, top.snr_db + 1.5)
    assert p.choose(1) != top.index
    got = mcs_by_name(MCS_TABLE[p.choose(1)].name)
    assert got.snr_db + 2.0 <= top.snr_db + 1.5
    assert p.choose(2) == 0  # another peer has its own state
    assert "qpsk-uncoded" not in [m.name for m in p.ladder]  # dominated by 16qam-1/2


def test_hysteresis_keeps_a_noisy_report_sequence_from_flapping():
    """SNRs that wander +-1.5 dB around a threshold move the MCS a few times, not every
    report: the climb needs up_after reports up_hysteresis_db above the next threshold."""
    import random

    clock = _Clock()
    cfg = McsPolicyConfig(margin_db=2.0, up_hysteresis_db=1.0, up_after=2)
    p = McsPolicy(cfg, clock=clock)
    rng = random.Random(3)
    edge = p.ladder[5].snr_db + cfg.margin_db  # the threshold of rung 5
    seen = []
    for _ in range(200):
        clock.t += 0.05
        p.report(1, edge + rng.uniform(-1.5, 1.5))
        seen.append(p.choose(1))
    changes = sum(a != b for a, b in zip(seen, seen[1:], strict=False))
    assert changes <= 40, changes  # without hysteresis: one change about every other report
    naive = McsPolicy(McsPolicyConfig(margin_db=2.0, up_hysteresis_db=0.0, up_after=1))
    rng = random.Random(3)
    seen_naive = []
    for _ in range(200):
        naive.report(1, edge + rng.uniform(-1.5, 1.5))
        seen_naive.append(naive.choose(1))
    assert changes * 2 < sum(a != b for a, b in zip(seen_naive, seen_naive[1:], strict=False))
    assert {MCS_TABLE[i].name for i in seen} <= {m.name for m in p.ladder[3:7]}


def test_burst_outcomes_step_down_and_fall_back():
    clock = _Clock()
    cfg = McsPolicyConfig(down_loss=0.2, fallback_loss=0.5, hold=2, up_after=1)
    p = McsPolicy(cfg, clock=clock)
    p.report(4, 30.0)
    top = p.position(4)
    assert top == len(p.ladder) - 1
    p.outcome(4, 50, 0)  # nothing lost: stays
    p.outcome(4, 50, 5)  # 10 %: below down_loss
    assert p.position(4) == top
    p.outcome(4, 50, 12)  # 24 %: one rung down, held
    assert p.position(4) == top - 1
    p.report(4, 30.0)
    assert p.position(4) == top - 1  # held
    p.outcome(4, 10, 6)  # 60 %: the most robust at once
    assert p.choose(4) == p.robust and p.snapshot(4)["fallbacks"] == 1
    p.report(4, 30.0)
    p.report(4, 30.0)
    assert p.choose(4) == p.robust  # held for 2 reports
    p.report(4, 30.0)
    assert p.choose(4) == p.ladder[-1].index
    p.outcome(4, 0, 0)  # nothing sent: nothing learnt
    assert p.choose(4) == p.ladder[-1].index
    with pytest.raises(ValueError):
        McsPolicyConfig(down_loss=0.6, fallback_loss=0.5)


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


def test_the_configuration_offers_exactly_the_tables_mcs_names() -> None:
    from scaleflu.config import _MCS_NAMES, CHOICES

    names = sorted(m.name for m in MCS_TABLE)
    assert sorted(_MCS_NAMES) == names
    for key in ("history.link_phy", "testbed.mcs"):
        assert set(names) <= set(CHOICES[key]), key
