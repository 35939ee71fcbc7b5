"""Set-up shared by the in-process testbed tests (tests/testbed, tests/security).

Three robots on three FL clients with client 0 backdoored, a small data set, two rounds and
a short wait for the unlearning request; each module adds its deadlines and link.
"""

from __future__ import annotations

import threading
from typing import Any

from scaleflu.config import Config, load_config

TESTBED_OVERRIDES = (
    "data.num_clients=3",
    "fl.clients_per_round=3",
    "data.train_subset=1500",
    "data.test_subset=300",
    "fl.local_epochs=1",
    "fl.lr=0.05",
    "data.poison.backdoor_clients=[0]",
    "testbed.rounds=2",
    "testbed.unlearn.wait_s=3",
    "testbed.eval_test_samples=100",
    "testbed.min_robots=3",
)


def base_config(*extra: str) -> Config:
    """The shared overrides, then ``extra`` (``key=value``, later wins)."""
    return load_config(None, [*TESTBED_OVERRIDES, *extra])


def robot_data(cfg: Config) -> dict[int, Any]:
    """Robots 1..3's local data (the same builder as the robot app's)."""
    from scaleflu.testbed.robot import RobotData

    return {r: RobotData(cfg, r) for r in (1, 2, 3)}


def halve_unlearn(
    run: Any, request: Any, method: str, mode: str, overrides: Any, progress: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stand-in for SCALE (tested elsewhere): halve the server's final model (the run it holds,
    which must be the one its history stores), say which request ran."""
    import torch

    final = run.history.final_model()
    held = run.model.state_dict()
    assert all(torch.equal(held[k], v) for k, v in final.items()), "not the server's model"
    state = {k: v * 0.5 if v.is_floating_point() else v for k, v in held.items()}
    return state, {"protocol": "backdoor", "request": request.text}


def run_federation(
    server: Any, robots: list[Any], robot_s: float, close: Any
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """Each robot's ``run(robot_s)`` in a thread, the server's ``run()`` here; then join them
    and call ``close()`` (the links, channel or hub). Returns the report and each robot's
    summary (a robot that crashed on purpose, the ``crash`` fault, has none)."""
    outs: dict[int, dict[str, Any]] = {}

    def target(rb: Any) -> None:
        try:
            outs[rb.robot_id] = rb.run(robot_s)
        except SystemExit:  # the "crash" fault (os._exit is patched to raise in-process)
            rb.link.close()

    threads = [threading.Thread(target=target, args=(rb,)) for rb in robots]
    for t in threads:
        t.start()
    try:
        report = server.run()
    finally:
        for t in threads:
            t.join(60)
        close()
    return report, outs


def drop_broadcast_bodies(link: Any, dropped: list[int]) -> None:
    """Make ``link`` (an object with a ``feed(raw)`` frame input) lose every broadcast DATA frame
    that carries a model body (not the MAC's own messages); the lost sequence numbers go to
    ``dropped``."""
    from scaleflu.link.frame import BROADCAST, FrameType
    from scaleflu.link.mac import MAC_MSG_ID, _frame_key

    feed = link.feed

    def lossy_feed(raw: bytes) -> None:
        k = _frame_key(raw)
        if k and k[0] == FrameType.DATA and k[2] == BROADCAST and k[3] != MAC_MSG_ID:
            dropped.append(k[4])
            return
        feed(raw)

    link.feed = lossy_feed


def three_robots(link: Any, keys: Any, cfg: Any, tmp_path: Any) -> tuple[Any, list[Any]]:
    """The edge server (``halve_unlearn`` standing in for SCALE) on ``link(SERVER_ID)`` and
    robots 1-3 on ``link(r)``; robot 1 asks to be forgotten after round 2."""
    from scaleflu.testbed.protocol import SERVER_ID
    from scaleflu.testbed.robot import RobotClient, RobotData
    from scaleflu.testbed.server import EdgeServer

    server = EdgeServer(link(SERVER_ID), keys, cfg, tmp_path, False, halve_unlearn)
    robots = [
        RobotClient(
            link(r),
            r,
            keys[r],
            cfg,
            data=RobotData(cfg, r),
            **({"unlearn": {"kind": "client"}, "unlearn_after_round": 2} if r == 1 else {}),
        )
        for r in (1, 2, 3)
    ]
    return server, robots


def closer(server: Any, robots: list[Any], *others: Any) -> Any:
    """A ``close()`` for :func:`run_federation`: the robots' links, the server's, then ``others``
    (a hub, a channel)."""

    def close() -> None:
        for rb in robots:
            rb.link.close()
        server.link.close()
        for o in others:
            o.close()

    return close
