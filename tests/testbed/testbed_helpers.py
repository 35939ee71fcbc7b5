"""Set-up shared by the in-process testbed tests (tests/testbed, tests/security).

Three robots on three FL clients with client 0 backdoored, a small data set, two rounds and
a short wait for the unlearning request; each module adds its deadlines and link.
"""

from __future__ import annotations

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
    run_dir: Any, request: str, method: str, mode: str, overrides: Any, progress: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stand-in for SCALE (tested elsewhere): halve the final model, say which request ran."""
    from scaleflu.fl.run import load_run

    run = load_run(run_dir)
    state = {k: v * 0.5 if v.is_floating_point() else v for k, v in run.model.state_dict().items()}
    return state, {"protocol": "backdoor", "request": request}
