"""One link-kind vocabulary (scaleflu.linkkinds), and the MAC in real time on a shared FrameHub."""

from __future__ import annotations

import random
import sys
import threading
import time
import warnings

import pytest

from scaleflu import linkkinds
from scaleflu.link import ChannelModel
from scaleflu.link.hub import FrameHub
from scaleflu.linkkinds import (
    KINDS,
    UnknownLinkKindError,
    app_kinds,
    canonical_kind,
    close_links,
    link_kind,
    open_link,
)

RATE = 712500.0


def test_one_spelling_with_old_names_that_warn_once(monkeypatch):
    monkeypatch.setattr(linkkinds, "_WARNED", set())
    assert set(KINDS) == {
        "memory",
        "frames",
        "frames-shared",
        "ofdm-loopback",
        "ofdm-pairs",
        "ofdm-shared",
        "uhd",
    }
    for k in KINDS:
        assert canonical_kind(k) == k
    for old, new in (
        ("ofdm-zmq", "ofdm-pairs"),
        ("zmq", "ofdm-pairs"),
        ("loopback", "ofdm-loopback"),
        ("ofdm_loopback", "ofdm-loopback"),
        ("shared", "ofdm-shared"),
    ):
        with pytest.warns(FutureWarning, match=new):
            assert canonical_kind(old) == new
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: the second use is silent
            assert canonical_kind(old) == new
    for bad in ("ofdm", "", "frames shared", None):
        with pytest.raises(UnknownLinkKindError):
            canonical_kind(bad)


def test_open_link_memory_and_frames_without_gnu_radio():
    before = set(sys.modules)
    a = open_link("memory", 1, network="t-kinds")
    b = open_link("memory", 2, network="t-kinds")
    try:
        assert a.send(2, b"hello", timeout=5).ok
        assert b.recv(5) == (1, b"hello")
    finally:
        close_links()
    assert not any(m.startswith("gnuradio") for m in set(sys.modules) - before)
    with pytest.raises(ValueError, match="hub"):
        open_link("frames", 1)


def test_kinds_say_what_they_are_and_refuse_what_they_do_not_run():
    assert app_kinds() == ("frames", "frames-shared", "ofdm-pairs", "ofdm-shared", "uhd")
    shared = {k.name for k in KINDS.values() if k.shared_medium}
    assert shared == {"frames-shared", "ofdm-shared", "uhd"}
    assert {k.name for k in KINDS.values() if k.mac_defaults is not None} == shared
    assert not any(KINDS[k].gnuradio for k in ("memory", "frames", "frames-shared"))
    # one table of defaults: the kinds on a frame hub and on the OFDM PHY start from its rows
    assert link_kind("frames").arq_defaults["window"] == 32
    assert link_kind("ofdm-pairs").arq_defaults["min_rto"] == 0.25
    assert link_kind("ofdm-shared").mac_defaults["guard_s"] == 0.03
    assert link_kind("frames-shared").mac_defaults["guard_s"] == 0.1
    # the MAC's options on a kind without a MAC are an error, not silently dropped (no GNU Radio
    # is needed to say so)
    for kind in ("memory", "frames", "ofdm-pairs", "ofdm-loopback"):
        with pytest.raises(ValueError, match="runs no MAC: mac, members"):
            open_link(kind, 1, hub="tcp://127.0.0.1:1", mac={"guard_s": 0.1}, members=(1,))


def _shared(n_robots: int, loss: float = 0.0):
    hub = FrameHub(model=ChannelModel(rate_bytes_per_s=RATE, loss=loss), shared=True, seed=1)
    robots = tuple(range(1, n_robots + 1))
    srv = open_link("frames-shared", 0, hub=hub.address, members=robots, rate_bytes_per_s=RATE)
    links = {
        r: open_link("frames-shared", r, hub=hub.address, rate_bytes_per_s=RATE, seed=r)
        for r in robots
    }
    time.sleep(0.3)  # the hub learns the receive sockets
    return hub, srv, links


def test_mac_over_shared_hub_three_robots_bit_exact_no_collision():
    hub, srv, links = _shared(3, loss=0.02)
    rng = random.Random(0)
    try:
        model = rng.randbytes(200_000)
        h = srv.broadcast(model, [1, 2, 3], timeout=30)
        for r, link in links.items():
            got = link.recv(30)
            assert got == (0, model), f"robot {r}"
        assert h.wait(30) and h.ok
        ups = {r: rng.randbytes(150_000) for r in links}
        res: dict[int, bool] = {}

        def up(r: int) -> None:
            res[r] = links[r].send(0, ups[r], timeout=60).ok

        threads = [threading.Thread(target=up, args=(r,)) for r in links]
        for t in threads:
            t.start()  # all three want the medium at once
        rx = {}
        end = time.monotonic() + 60
        while len(rx) < 3 and time.monotonic() < end:
            m = srv.recv(2)
            if m is not None:
                rx[m[0]] = m[1]
        for t in threads:
            t.join(10)
        assert rx == ups and all(res.values())
        assert hub.collided_frames == 0
        st = srv.stats()["mac"]
        assert st["grants_tx"] > 3 and st["reports_rx"] > 3
    finally:
        for link in [srv, *links.values()]:
            link.close()
        hub.close()


def test_unscheduled_links_on_the_shared_hub_collide():
    hub = FrameHub(model=ChannelModel(rate_bytes_per_s=RATE), shared=True, seed=1)
    srv = open_link("frames", 0, hub=hub.address)  # plain ARQ links: everyone sends at will
    links = {r: open_link("frames", r, hub=hub.address) for r in (1, 2, 3)}
    time.sleep(0.3)
    try:
        rng = random.Random(1)
        for r in links:
            links[r].send_async(0, rng.randbytes(60_000), timeout=30)
        end = time.monotonic() + 20
        while hub.collided_frames == 0 and time.monotonic() < end:
            time.sleep(0.1)
        assert hub.collided_frames > 0
    finally:
        for link in [srv, *links.values()]:
            link.close()
        hub.close()


def test_attach_mac_under_an_existing_arq_link():
    """The way ofdm-shared gets the MAC: under a back-end's ArqLink (here MemoryLinks)."""
    from scaleflu.link import MemoryChannel
    from scaleflu.link.mac import MacConfig
    from scaleflu.link.maclink import attach_mac

    cfg = MacConfig(rate_bytes_per_s=RATE, guard_s=0.1, turnaround_s=0.01, contention_slots=0)
    with MemoryChannel(seed=2, loss=0.05) as ch:
        links = {n: ch.attach(n, window=64, initial_rto=3.0) for n in (0, 1, 2)}
        attach_mac(links[0], cfg, members=(1, 2), seed=0)
        for r in (1, 2):
            attach_mac(links[r], cfg, seed=r)
        rng = random.Random(3)
        model = rng.randbytes(60_000)
        h = links[0].broadcast(model, [1, 2], timeout=30)
        assert links[1].recv(30) == (0, model) and links[2].recv(30) == (0, model)
        assert h.wait(30) and h.ok
        up = rng.randbytes(40_000)
        assert links[2].send(0, up, timeout=30).ok
        assert links[0].recv(10) == (2, up)
        st = links[0].stats()["mac"]
        assert st["grants_tx"] >= 2 and st["bcast_frames_tx"] >= 41
        assert links[2].stats()["mac"]["reports_tx"] >= 1


def test_mac_frames_before_the_robots_mac_is_attached_are_never_delivered():
    """The flake of the test above, made certain: the server's MAC beacons and grants while a
    robot's link has no MAC yet. Those frames (link DATA, the MAC's reserved msg_id) reached the
    robot's ArqEndpoint, which reassembled and delivered them as 23-byte messages; now the
    endpoint drops them (counted) and the robot later receives only the model."""
    from scaleflu.link import MemoryChannel
    from scaleflu.link.mac import MacConfig
    from scaleflu.link.maclink import attach_mac

    cfg = MacConfig(rate_bytes_per_s=RATE, guard_s=0.1, turnaround_s=0.01, contention_slots=0)
    with MemoryChannel(seed=2) as ch:
        links = {n: ch.attach(n, window=64, initial_rto=3.0) for n in (0, 1, 2)}
        attach_mac(links[0], cfg, members=(1, 2), seed=0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            links[r].stats()["arq"]["mac_frames_dropped"] for r in (1, 2)
        ):
            time.sleep(0.01)
        for r in (1, 2):  # the server's MAC frames reached the robots' bare ARQ ...
            st = links[r].stats()["arq"]
            assert st["mac_frames_dropped"] >= 1
            assert st["delivered"] == 0 and st["acks_tx"] == 0  # ... and were not messages
            assert links[r].recv(0.05) is None
        for r in (1, 2):
            attach_mac(links[r], cfg, seed=r)
        model = random.Random(3).randbytes(30_000)
        h = links[0].broadcast(model, [1, 2], timeout=30)
        assert links[1].recv(30) == (0, model) and links[2].recv(30) == (0, model)
        assert h.wait(30) and h.ok
        assert links[1].recv(0.2) is None and links[2].recv(0.2) is None


def test_shared_hub_places_bursts_at_the_senders_stamps():
    """Collisions follow the senders' send times, not the hub thread's lag; stamps are clamped."""
    from scaleflu.link.hub import MAX_STAMP_AGE_S

    hub = FrameHub(model=ChannelModel(rate_bytes_per_s=10_000), shared=True)
    try:
        frame = b"x" * 100  # 100 bytes at 10 kB/s: ~10 ms of airtime
        now = time.monotonic()
        # sent 0.2 s apart, ingested together (a late hub): no collision
        hub._ingest(1, frame, now - 0.25)
        hub._ingest(2, frame, now - 0.05)
        assert hub.collided_frames == 0
        # sent at the same time by two nodes: both collide
        hub._ingest(1, frame, now)
        hub._ingest(2, frame, now)
        assert hub.collided_frames == 2
        # a stamp far in the past is taken as MAX_STAMP_AGE_S old, one in the future as now
        hub._ingest(3, frame, now - 100.0)
        assert hub._recent[-1].start >= time.monotonic() - MAX_STAMP_AGE_S - 0.1
        hub._ingest(3, frame, now + 100.0)
        assert hub._recent[-1].start <= time.monotonic()
    finally:
        hub.close()


def test_shared_hub_phy_model_loses_stock_frames_at_low_snr_and_adaptation_gets_through():
    """frames-shared with the hub's PHY model (HubPhy): at 9 dB (no fading) the stock PHY loses
    every frame, the coded PHY with the MAC's link adaptation delivers bit-exact at a robust MCS,
    and the receivers get the SNR they measure."""
    from scaleflu.link.hub import HubPhy
    from scaleflu.link.mcs import mcs_by_name

    for mcs in ("adaptive", None):
        hub = FrameHub(
            model=ChannelModel(rate_bytes_per_s=RATE),
            shared=True,
            seed=1,
            phy=HubPhy(snr_db=9.0, fading="none", seed=2),
        )
        mac = {"mcs": mcs, "contention_slots": 0}
        srv = open_link("frames-shared", 0, hub=hub.address, members=(1,), mac=mac)
        robot = open_link("frames-shared", 1, hub=hub.address, mac=mac, seed=1)
        time.sleep(0.3)
        try:
            data = random.Random(3).randbytes(40_000)
            res = robot.send(0, data, timeout=3 if mcs is None else 30)
            got = srv.recv(1)
            if mcs is None:
                assert not res.ok and got is None and hub.phy_lost > 0
                assert set(hub.bytes_by_mcs) == {"stock"}
            else:
                assert res.ok and got == (1, data)
                a = srv.mac.adaptation()["robots"][1]
                assert a["up_snr_db"] is not None and 6.0 < a["up_snr_db"] < 12.0
                used = [mcs_by_name(n) for n in a["bytes_up_by_mcs"]]
                assert used and all(m.snr_db < 9.0 for m in used)  # what fits 9 dB
        finally:
            for link in (srv, robot):
                link.close()
            hub.close()


def test_hub_phy_is_checked():
    from scaleflu.link.hub import HubPhy

    for bad in ({"snr_db": 1000.0}, {"fading": "nakagami"}):
        with pytest.raises(ValueError):
            HubPhy(**bad)
