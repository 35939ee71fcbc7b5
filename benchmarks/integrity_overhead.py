"""Cost of the history store's authenticated digests (integrity at rest, docs/testbed.md).

A :class:`scaleflu.fl.history.HistoryStore` is filled with ``--rounds`` rounds of
``--clients`` participants of a LeNet-5-sized state (61706 float32 parameters, 5 layers x
``--groups`` parameter groups, as ``scale.groups_per_layer``), once without a key and once with
one. Timed (process CPU time and wall): every ``record_round``, opening the store (the SQLite
digest check), loading every round's updates (the tensor files' digest checks) and erasing one
client from every round (one transaction per round, each rewriting the digest over the whole
metadata, so this one grows with rounds x groups).

Run by hand: ``PYTHONPATH=python .venv/bin/python benchmarks/integrity_overhead.py
[--rounds 100]``; writes ``benchmarks/results/integrity_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scaleflu.fl.history import HistoryStore

SHAPES = {  # LeNet-5 (scaleflu.fl.models) on 28x28 inputs
    "conv1.weight": (6, 1, 5, 5),
    "conv2.weight": (16, 6, 5, 5),
    "fc1.weight": (120, 256),
    "fc2.weight": (84, 120),
    "fc3.weight": (10, 84),
}


class Clock:
    """Process CPU seconds and wall seconds of a block."""

    def __enter__(self) -> Clock:
        self.c0, self.w0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = time.process_time() - self.c0
        self.wall = time.perf_counter() - self.w0


def _state(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {k: torch.randn(*s, generator=g) * 0.1 for k, s in SHAPES.items()}


def run(rounds: int, clients: int, groups: int, key: bytes | None, folder: Path) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    grp = {}
    for k, s in SHAPES.items():
        n = int(torch.tensor(s).prod())
        step = -(-n // groups)
        grp[k] = [(a, min(a + step, n)) for a in range(0, n, step)]
    out: dict[str, Any] = {"key": key is not None}
    h = HistoryStore(folder, groups=grp, integrity_key=key)
    h.record_initial(_state(g))
    with Clock() as rec:
        for t in range(1, rounds + 1):
            locals_ = {n: _state(g) for n in range(clients)}
            h.record_round(
                t, range(clients), dict.fromkeys(range(clients), 100), locals_, _state(g)
            )
    h.close()
    out["record_round_s"] = {"cpu": rec.cpu / rounds, "wall": rec.wall / rounds}
    with Clock() as op:
        h = HistoryStore(folder, integrity_key=key)
    out["open_s"] = {"cpu": op.cpu, "wall": op.wall}
    with Clock() as ld:
        for t in range(1, rounds + 1):
            h.client_updates(t)
    out["load_updates_s"] = {"cpu": ld.cpu / rounds, "wall": ld.wall / rounds}
    with Clock() as er:
        h.erase_clients([0], reason="bench")
    out["erase_one_client_s"] = {"cpu": er.cpu, "wall": er.wall}
    out["sqlite_bytes"] = h.storage_bytes()["sqlite"]
    h.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--groups", type=int, default=32)
    p.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "integrity_overhead.json")
    )
    a = p.parse_args()
    torch.set_num_threads(1)
    res: dict[str, Any] = {
        "rounds": a.rounds,
        "clients": a.clients,
        "groups_per_layer": a.groups,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load": os.getloadavg()},
    }  # fmt: skip
    for name, key in (("no_key", None), ("key", bytes(range(32)))):
        with tempfile.TemporaryDirectory() as d:
            res[name] = run(a.rounds, a.clients, a.groups, key, Path(d))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))  # noqa: T201


if __name__ == "__main__":
    main()
