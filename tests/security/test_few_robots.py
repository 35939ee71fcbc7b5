"""Robust aggregation with one or two robots: the round's median cannot
single out a scaled update there, so the norm bound takes a floor from trusted norms: the
norms accepted in earlier rounds, or the server's own reference update on its validation
slice. Each test asserts the scaled update is refused with its reason and that the round
completes with the honest robot."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from scaleflu.config import load_config
from scaleflu.fl.aggregation import AggregationConfig, NoUpdateAcceptedError, robust_aggregate
from scaleflu.link import MemoryChannel
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.robot import RobotClient
from scaleflu.testbed.server import EdgeServer
from testbed_helpers import run_federation

pytestmark = pytest.mark.timeout(300)


def _two(scale: float = 100.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = {"w": rng.normal(size=(8, 16)).astype(np.float32)}
    d = rng.normal(size=(8, 16)) * 0.1
    honest = {"w": (base["w"] + d + rng.normal(size=d.shape) * 0.02).astype(np.float32)}
    bad = {"w": (base["w"] + scale * d).astype(np.float32)}
    t = {k: torch.from_numpy(v) for k, v in base.items()}
    locals_ = {
        n: {k: torch.from_numpy(v) for k, v in s.items()} for n, s in ((1, honest), (2, bad))
    }
    return t, locals_, float(np.linalg.norm(d))


def test_two_robots_round_median_alone_lets_a_scaled_update_through():
    """The weakness the floor closes (this test fails if the median alone were enough)."""
    base, locals_, _ = _two()
    res = robust_aggregate(base, locals_, {1: 100, 2: 100}, AggregationConfig())
    assert res.refused == {} and res.accepted == [1, 2]


def test_two_robots_floor_from_prior_norms_refuses_the_scaled_update():
    base, locals_, h = _two()
    cfg = AggregationConfig()
    res = robust_aggregate(base, locals_, {1: 100, 2: 100}, cfg, prior=[h, 1.1 * h, 0.9 * h])
    assert res.accepted == [1] and res.refused[2].startswith("norm:")
    assert torch.equal(res.state["w"], locals_[1]["w"])  # the honest model, exact
    # one robot alone, scaled: refused too (the round fails with the reason)
    with pytest.raises(NoUpdateAcceptedError, match="norm"):
        robust_aggregate(base, {2: locals_[2]}, {2: 100}, cfg, prior=[h])
    # an honest robot alone passes the floor
    assert robust_aggregate(base, {1: locals_[1]}, {1: 100}, cfg, prior=[h]).accepted == [1]
    # with small_round updates or more the round's own median rules (prior ignored)
    five = {n: locals_[1] for n in range(5)}
    res5 = robust_aggregate(base, five, dict.fromkeys(five, 1), cfg, prior=[1e-6])
    assert res5.refused == {}


def test_config_of_the_floor_is_checked():
    with pytest.raises(ValueError, match="norm_history"):
        AggregationConfig.from_dict({"norm_history": -1})
    with pytest.raises(ValueError, match="small_round"):
        AggregationConfig.from_dict({"small_round": 2.5})


def test_two_robots_end_to_end_reference_then_history_floor(tmp_path):
    """Two robots over the in-memory link, 3 rounds. Round 1: robot 2 sends a x100 update;
    the server's reference update gives the floor. Round 2: robot 1 sends a x100 update; the
    reference update of round 2 gives the floor again (norms accepted in rounds of two updates
    are never trusted: the updates they bound could walk them up). Each round completes with
    the honest robot; round 3 with both."""
    cfg = load_config(
        None,
        [
            "data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=1200",
            "data.test_subset=600", "fl.local_epochs=1", "fl.lr=0.05", "testbed.rounds=3",
            "testbed.round_deadline_s=30", "testbed.register_timeout_s=20",
            "testbed.unlearn.wait_s=0", "testbed.eval_test_samples=50", "testbed.min_robots=2",
            "testbed.refused_grace_s=0.5",
        ],
    )  # fmt: skip
    store = KeyStore.create([1, 2])
    with MemoryChannel(seed=5) as ch:
        server = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        robots = [
            RobotClient(
                ch.attach(r),
                r,
                store.robots[r],
                cfg,
                server_public_key=store.public_key,
                faults=("scaled",),
                fault_round=3 - r,
            )  # fmt: skip
            for r in (1, 2)
        ]
        report, _ = run_federation(server, robots, 150, lambda: None)  # the channel closes them
    rows = report["rounds"]
    ref = [e for e in report["events"] if e["event"] == "reference_norm"]
    rej = {(x["round"], x["robot"]): x for x in report["rejections"]}
    assert rej[(1, 2)]["reason"] == "norm" and rej[(2, 1)]["reason"] == "norm"
    assert [r["participants"] for r in rows] == [[1], [2], [1, 2]]
    assert [e["round"] for e in ref] == [1, 2, 3]  # every small round: the reference
    n1, n2 = rows[0]["update_norms"], rows[1]["update_norms"]
    assert n1[2] > 20 * n1[1] and n2[1] > 20 * n2[2]
    assert all(np.isfinite(r["test_acc"]) for r in rows)
    assert rows[2]["test_acc"] > 0.15  # chance is 0.1: the scaled updates never got in
    h = server.history
    assert h.participants(1) == [0] and h.participants(2) == [1]
    assert all(torch.isfinite(v).all() for v in h.final_model().values())
