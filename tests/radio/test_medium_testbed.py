"""The edge server and 3 robots on the sample-level shared medium (ofdm-shared), in one process:
a robot that loses every broadcast frame gets the model by unicast (its reports after 4 repair
passes showed nothing new), and
nobody registers again although the round takes longer than ``robot_idle_s`` of wall time.

The medium runs at a fraction of real time here (4 OFDM receivers on a loaded 2-core machine),
which is what made the robots' wall-clock idle timer re-register them (docs/testbed.md, "Waits
on the link's clock"); every wait now runs on the medium's virtual clock.
"""

from __future__ import annotations

import pytest

from scaleflu.radio.medium import LinkChannel, MediumBroker, MediumConfig

pytestmark = [pytest.mark.gnuradio, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_robot_without_the_broadcast_gets_the_model_by_unicast_on_the_medium(tmp_path):
    from scaleflu.config import load_config
    from scaleflu.link.faults import drop_broadcast_bodies
    from scaleflu.linkkinds import open_link
    from scaleflu.testbed.inprocess import TESTBED_OVERRIDES, run_federation
    from scaleflu.testbed.protocol import generate_keys
    from scaleflu.testbed.robot import RobotClient, RobotData
    from scaleflu.testbed.server import EdgeServer

    cfg = load_config(
        None,
        [
            *TESTBED_OVERRIDES,
            "testbed.rounds=1",
            "testbed.unlearn.wait_s=1",
            "testbed.register_timeout_s=120",
            "testbed.link=ofdm-shared",
            # 12 s of the medium's clock: over twice what this round takes in virtual time (about
            # 5 s), less than it takes in wall time here (20-30 s at 0.15 x real time): on the
            # wall clock robots 1 and 3, silent after their uploads, would register again
            "testbed.robot_idle_s=12",
        ],
    )
    medium = MediumConfig(
        nodes=(0, 1, 2, 3),
        seed=3,
        address="tcp://127.0.0.1:0",
        default=LinkChannel(snr_db=25.0),
        hub=0,
    )
    keys = generate_keys([1, 2, 3])
    mac = {"contention_slots": 0}
    dropped: list[int] = []
    with MediumBroker(medium).start() as br:
        srv = open_link("ofdm-shared", 0, broker=br.address, members=(1, 2, 3), mac=mac, seed=0)
        links = {
            r: open_link("ofdm-shared", r, broker=br.address, mac=mac, seed=r) for r in (1, 2, 3)
        }
        # robot 2's receiver hands every frame to this ArqLink's feed
        drop_broadcast_bodies(links[2].arq.link, dropped)
        server = EdgeServer(srv, keys, cfg, tmp_path, False)
        robots = [RobotClient(links[r], r, keys[r], cfg, data=RobotData(cfg, r)) for r in (1, 2, 3)]

        def close() -> None:
            for lk in (*links.values(), srv):
                lk.close()

        v0 = srv.virtual_time()
        report, outs = run_federation(server, robots, 1200, close)
        stats = br.stats()
    assert dropped
    (row,) = report["rounds"]
    assert row["participants"] == [1, 2, 3] and row["missing"] == []
    assert row["link"]["unicast_fallbacks"] == 1
    # served long before the broadcast's own deadline (send_timeout_s, virtual seconds), which
    # is when robot 2 got a unicast without the fall-back
    assert row["link"]["virtual_s"] < float(cfg.testbed.send_timeout_s)
    falls = [e for e in report["events"] if e["event"] == "broadcast_fallback"]
    assert [(e["robot"], e["purpose"]) for e in falls] == [(2, "train")]
    assert all(v["registrations"] == 1 for v in report["robots"].values())
    assert all(o["registrations"] == 1 and o["idle_reregistrations"] == 0 for o in outs.values())
    assert [x["upload"] for x in outs[2]["rounds"]] == ["delivered"]
    # the link kinds' PHY: coded, its MCS chosen by the server's MAC (25 dB: above bpsk-1/2),
    # the models checked bit-exact by every robot (SHA-256 of the tensors it trained from). The
    # first broadcast pass leaves above bpsk-1/2; robot 2 then reports every body lost, so the
    # repairs (at the weakest target's MCS) fall back to the most robust one, as they should
    adapt = row["link"]["adaptation"]
    assert adapt["mode"] == "adaptive"
    assert set(adapt["server_bytes_by_mcs"]) - {"bpsk-1/2"}, adapt["server_bytes_by_mcs"]
    # each robot's upload is counted at its grants' MCS: above bpsk-1/2 at 25 dB. A grant whose
    # REPORT misses its window (a robot's host slowed by a loaded machine while the medium's clock
    # runs on) counts as lost and its bytes go uncounted (1 of 35 grants in the runs measured
    # here, 6 runs side by side); three in a row fall back to bpsk-1/2. Once in CI (4 test workers
    # on 2 cores) a robot had nothing counted above bpsk-1/2 (its numbers were not printed then;
    # they are now), so every robot above bpsk-1/2 only where no grant timed out
    ups = {r: set(a["bytes_up_by_mcs"]) - {"bpsk-1/2"} for r, a in adapt["robots"].items()}
    assert any(ups.values()), adapt
    assert all(ups.values()) or row["link"]["grant_timeouts"] > 0, (row["link"], adapt)
    shas = {o["rounds"][0]["model_sha256"] for o in outs.values()}
    assert len(shas) == 1 and None not in shas  # one global model, the same bytes at every robot
    # the MAC schedules the air: no more than stray overlaps (measured: 0 s in 4 of 6 runs,
    # 0.6 ms and 1.0 ms in the others, cause not found); the bound allows a few such overlaps
    assert stats["collision_s"] < 0.005, stats["collision_s"]
    print(  # the speed of this run, for the record (pytest -s)
        f"virtual {stats['virtual_s'] - v0:.1f} s, round wall {row['wall_s']:.1f} s, "
        f"link {row['link']}"
    )
