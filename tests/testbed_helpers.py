"""Set-up shared by the in-process testbed tests (tests/testbed, tests/security).

The federation itself (``TESTBED_OVERRIDES``, ``run_federation``) and the link fault
(``drop_broadcast_bodies``) live in the package, where the benchmarks take them too.
"""

from __future__ import annotations

from typing import Any

from scaleflu.config import Config, load_config
from scaleflu.link.faults import drop_broadcast_bodies
from scaleflu.testbed.inprocess import TESTBED_OVERRIDES, run_federation

__all__ = [
    "TESTBED_OVERRIDES",
    "base_config",
    "closer",
    "drop_broadcast_bodies",
    "halve_unlearn",
    "robot_data",
    "run_federation",
    "three_robots",
]


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
