"""Two robots, one malicious: the global model survives (in-process testbed, the real server).

The growth attack: robot 2 starts with a tiny update and grows its norm round by round
(0.001, 18, 28, 36, 61, ...), each time just under the bound the server will apply (it is given
the server's own bound, the strongest such attacker), in the direction that climbs its own loss.
Before, the bound's floor followed the norms of the earlier small rounds, the attacker walked
it up and the model fell to chance. Now the floor follows the server's own reference update and
an update pointing away from it is refused: over 10 rounds the model's test accuracy stays
within 0.05 of the same federation without the attacker.

The aggregate check: a robot whose update passes the screening (aligned with the server's own,
within the bound) but makes the model collapse (a large bias towards one class) is named by
the validation check; the round goes on without its update and the model does not fall.

Spread of the learning outcome (final test accuracy, attacked minus without the attacker) is in
docs/results/testbed.md ("Two robots, one malicious: spread of the outcome").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scaleflu.config import load_config
from scaleflu.link import MemoryChannel
from scaleflu.testbed.faults import RobotFaults
from scaleflu.testbed.keys import KeyStore
from scaleflu.testbed.protocol import SERVER_ID
from scaleflu.testbed.robot import RobotClient
from scaleflu.testbed.server import EdgeServer
from testbed_helpers import run_federation

pytestmark = pytest.mark.timeout(600)

SCHEDULE = [0.001, 18, 28, 36, 61, 80, 100, 130, 160, 200]  # the attack's norms, round by round
MARGIN = 0.05  # the property: within this of the run without the attacker


def _float_delta(local: dict[str, np.ndarray], received: Any) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) - received[k] for k, v in local.items() if v.dtype.kind == "f"}


class GrowthAttack(RobotFaults):
    """Norms of :data:`SCHEDULE`, capped at 0.95 x ``bound(t)`` (the server's floor for the
    round), along minus the robot's honest update (gradient ascent on its own data)."""

    def __init__(self, bound: Any) -> None:
        super().__init__()
        self.bound = bound
        self.sent: dict[int, float] = {}

    def replace_upload(self, t: int, local: Any, received: Any) -> Any:
        d = _float_delta(local, received)
        h = float(np.sqrt(sum(float((x**2).sum()) for x in d.values())))
        target = SCHEDULE[min(t, len(SCHEDULE)) - 1]
        b = self.bound(t)
        if b is not None:
            target = min(target, 0.95 * b)
        self.sent[t] = target
        return {
            k: (received[k] - target / h * d[k]).astype(v.dtype) if k in d else v
            for k, v in local.items()
        }


class BiasAttack(RobotFaults):
    """From round ``start``: the honest update plus a bias of the last layer towards class 0,
    of norm ``scale`` x the honest update's (aligned enough with the server's update to pass
    the direction test, within the norm bound: only the model's accuracy shows it)."""

    def __init__(self, start: int, scale: float = 6.0) -> None:
        super().__init__()
        self.start, self.scale = start, scale

    def replace_upload(self, t: int, local: Any, received: Any) -> Any:
        if t < self.start:
            return local
        d = _float_delta(local, received)
        h = float(np.sqrt(sum(float((x**2).sum()) for x in d.values())))
        last_bias = [k for k in local if k.endswith("bias")][-1]
        out = dict(local)
        b = local[last_bias].astype(np.float64).copy()
        b[0] += self.scale * h
        out[last_bias] = b.astype(local[last_bias].dtype)
        return out


def _federation(
    tmp_path: Any, robots: tuple[int, ...], rounds: int, attack: Any = None, seed: int = 0
):
    cfg = load_config(
        None,
        [
            "data.num_clients=2", "fl.clients_per_round=2", "data.train_subset=1200",
            "data.test_subset=1000", "fl.local_epochs=1", "fl.lr=0.05", f"testbed.rounds={rounds}",
            "testbed.round_deadline_s=60", "testbed.register_timeout_s=30",
            "testbed.unlearn.wait_s=0", "testbed.eval_test_samples=50",
            f"testbed.min_robots={len(robots)}", "testbed.refused_grace_s=0.5", "fl.threads=1",
            f"seed={seed}",
        ],
    )  # fmt: skip
    store = KeyStore.create([1, 2])
    with MemoryChannel(seed=5) as ch:
        server = EdgeServer(
            ch.attach(SERVER_ID), store.robots, cfg, tmp_path, False, signing_key=store.signing_key
        )
        fault = attack(server) if attack is not None else None
        clients = [
            RobotClient(
                ch.attach(r),
                r,
                store.robots[r],
                cfg,
                server_public_key=store.public_key,
                faults=fault if (r == 2 and fault is not None) else (),
            )  # fmt: skip
            for r in robots
        ]
        report, _ = run_federation(server, clients, 600, lambda: None)
    return report, fault


def _server_bound(server: EdgeServer) -> Any:
    """The floor of the norm bound the server applies to round t's two updates."""

    def bound(t: int) -> float | None:
        prior = server.rounds.trusted(t, server.rounds.global_state, [0, 1])
        return 10.0 * float(np.median(prior)) if prior else None

    return bound


def test_two_robots_one_growing_its_norm_cannot_wreck_the_model(tmp_path):
    alone, _ = _federation(tmp_path / "alone", (1,), 10)
    attacked, attack = _federation(
        tmp_path / "attacked", (1, 2), 10, lambda s: GrowthAttack(_server_bound(s))
    )
    acc_alone = [r["test_acc"] for r in alone["rounds"]]
    acc_attacked = [r["test_acc"] for r in attacked["rounds"]]
    assert acc_alone[-1] > 0.3  # the honest robot alone learns: the comparison means something
    assert abs(acc_attacked[-1] - acc_alone[-1]) <= MARGIN, (acc_attacked, acc_alone)
    # the bound never followed the attacker: each of its updates of round 2 on was refused
    refused = {(x["round"], x["robot"]): x["reason"] for x in attacked["rejections"]}
    assert all(refused.get((t, 2)) in ("norm", "direction") for t in range(2, 11)), refused
    assert all(attack.sent[t] <= SCHEDULE[t - 1] for t in attack.sent)


def test_a_candidate_that_collapses_is_refused_and_the_robot_named(tmp_path):
    report, _ = _federation(tmp_path, (1, 2), 5, lambda s: BiasAttack(start=4))
    rows = report["rounds"]
    named = [e for e in report["events"] if e["event"] == "candidate_rejected"]
    assert {e["round"] for e in named} == {4, 5}, named
    assert all(e["robots"] == [2] for e in named)
    assert all(e["scores"]["candidate"] < e["scores"]["previous"] - 0.1 for e in named)
    assert [r["participants"] for r in rows[:3]] == [[1, 2]] * 3
    # an attacked round goes on with robot 1 alone, or, when robot 1's update alone falls too
    # far as well (its data is not the validation's), it is refused: the model stays
    for row in rows[3:]:
        assert row["participants"] in ([1], []), row
        assert row.get("failed") or "rejected_candidate" in row
    refused = [x for x in report["rejections"] if x["robot"] == 2 and x["round"] >= 4]
    assert refused and all(x["reason"] == "aggregate" for x in refused)
    assert rows[-1]["test_acc"] >= rows[2]["test_acc"] - 0.1  # the model did not fall
