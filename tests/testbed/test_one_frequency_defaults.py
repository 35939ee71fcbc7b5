"""One frequency by default: ofdm-shared in the demo, the MAC on uhd, the medium in the report."""

from __future__ import annotations

import argparse
import io

import pytest

from scaleflu import linkkinds
from scaleflu.cli import testbed as cli
from scaleflu.cli.testbed import (
    COMMON_OPTIONS,
    ROBOT_OPTIONS,
    SERVER_OPTIONS,
    add_launcher_args,
    build_app_parser,
)
from scaleflu.config import check_config, default_config, load_config
from scaleflu.testbed import transport
from scaleflu.testbed.report import print_summary


def _captured_link(monkeypatch, argv, node_id, peers):
    seen = {}

    def fake(kind, node, **opts):
        seen.update(kind=kind, node=node, **opts)
        return object()

    monkeypatch.setattr(linkkinds, "open_link", fake)
    tables = (COMMON_OPTIONS, SERVER_OPTIONS if node_id == 0 else ROBOT_OPTIONS)
    extra = ["--run-dir", "r"] if node_id == 0 else ["--robot-id", str(node_id)]
    args = build_app_parser("app", "", *tables).parse_args(["--keys", "k", *extra, *argv])
    cli.build_link(args, load_config(), node_id, peers, "type=b200", None)
    return seen


def test_defaults_are_one_shared_frequency_with_fading():
    cfg = default_config()
    assert cfg["testbed"]["link"] == "ofdm-shared"
    med = cfg["testbed"]["medium"]
    assert med["fading"] in ("rician", "rayleigh") and med["snr_db"] == 20.0
    p = argparse.ArgumentParser()
    add_launcher_args(p)
    assert p.parse_args([]).link == "ofdm-shared"
    with pytest.raises(ValueError, match="fading"):
        load_config(None, ["testbed.medium.fading=nakagami"])
    with pytest.raises(ValueError):
        load_config(None, ["testbed.medium.block=7"])
    check_config(load_config(None, ["testbed.mac.guard_s=0.05"]))


def test_apps_open_ofdm_shared_and_uhd_with_the_mac(monkeypatch):
    srv = _captured_link(monkeypatch, ["--link", "ofdm-shared", "--broker", "tcp://h:1"], 0, [1, 2])
    assert srv["kind"] == "ofdm-shared" and srv["broker"] == "tcp://h:1"
    assert srv["members"] == (1, 2) and isinstance(srv["mac"], dict)
    rob = _captured_link(monkeypatch, ["--link", "uhd"], 2, [0])
    assert rob["kind"] == "uhd" and rob["members"] == (2,) and "mac" in rob
    assert rob["tx_args"] == "type=b200" and rob["freq"] == 2.45e9
    pairs = _captured_link(monkeypatch, ["--link", "ofdm-pairs", "--base-port", "5"], 1, [0])
    assert "mac" not in pairs and "broker" not in pairs


def test_apps_pass_only_the_options_a_kind_takes(monkeypatch):
    hub = _captured_link(monkeypatch, ["--link", "frames", "--hub", "tcp://h:2"], 1, [0])
    assert hub == {"kind": "frames", "node": 1, "hub": "tcp://h:2", "arq": hub["arq"]}
    pairs = _captured_link(monkeypatch, ["--link", "ofdm-pairs"], 1, [0])
    assert None not in pairs.values()  # options not given are left to the kind's defaults
    assert not {"hub", "base_port", "snr_db", "drop_rate"} & set(pairs)


def test_round_row_takes_airtime_and_collisions_from_the_medium():
    before = {"retransmissions": 1.0, "medium_air_s": 2.0, "collision_s": 0.001, "virtual_s": 10}
    after = {"retransmissions": 5.0, "medium_air_s": 3.5, "collision_s": 0.001, "virtual_s": 14.5}
    after["rate_bytes_per_s"] = 748000.0
    row = transport.round_link_row(before, after, air_bytes=10**7)
    assert row["airtime_s"] == pytest.approx(1.5)  # measured, not bytes / rate
    assert row["collision_s"] == 0.0 and row["virtual_s"] == pytest.approx(4.5)
    assert row["retransmissions"] == 4
    fh = io.StringIO()
    print_summary({"rounds": [{"round": 1, "participants": [1], "link": row}]}, fh)
    text = fh.getvalue()
    assert "collided ms" in text and "virtual s" in text and " 1.50 " in text and " 4.50" in text
