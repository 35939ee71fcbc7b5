"""The edge server and its robots in one process, as the tests and benchmarks run a federation.

``run_federation`` runs each robot's ``run`` in a thread and the server's ``run`` in the caller,
then closes the links; ``TESTBED_OVERRIDES`` is the small federation they share (three robots
on three FL clients, client 0 backdoored, a small data set, two rounds, a short wait for the
unlearning request); each caller adds its deadlines and link.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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


def run_federation(
    server: Any, robots: list[Any], robot_s: float, close: Callable[[], None]
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
