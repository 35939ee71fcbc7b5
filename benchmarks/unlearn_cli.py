"""`scaleflu unlearn --method scale` against `--method retrain`, as whole processes.

What a user waits for: each command is started as its own process on a trained run (imports,
loading the run, the method, writing the outputs), the two methods in turn (scale, retrain,
scale, retrain, ...) so that a change in the machine's speed hits both, ``--runs`` times each.
Measured per process: wall seconds (a monotonic clock around the child) and user + system CPU
seconds (the operating system's accounting of the reaped child, ``os.wait4``); the ratio
scale / retrain is taken pair by pair. Reported as min, median and max.

Train a run first (``scaleflu train --config table2_cpu --out runs/t2``), then
``PYTHONPATH=python .venv/bin/python benchmarks/unlearn_cli.py --run runs/t2
[--request client:0] [--runs 3]``; writes ``benchmarks/results/unlearn_cli-<request>.json``.
Outputs of the commands go to a temporary folder; the run is only read (and its
``cache/`` folder left alone: neither command measures without ``--evaluate``). The package is
byte-compiled first, as an installed one is (where ``PYTHONDONTWRITEBYTECODE`` is set, as on
the project's sandboxes, every process would otherwise compile each of its modules again).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def one_process(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` to its end; its wall seconds and its own user/system CPU seconds."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip()[-500:]
            raise SystemExit(f"{' '.join(argv)} failed ({code}): {tail}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "user_s": usage.ru_utime}


def spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="a trained run (scaleflu train)")
    ap.add_argument("--request", default="client:0")
    ap.add_argument("--runs", type=int, default=3, help="processes per method")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    package = subprocess.run(
        [sys.executable, "-c", "import scaleflu; print(scaleflu.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    compileall.compile_dir(Path(package).parent, quiet=1)  # the package the commands import
    rows: dict[str, list[dict[str, float]]] = {"scale": [], "retrain": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for method in ("scale", "retrain"):
                argv = [sys.executable, "-m", "scaleflu", "unlearn", "--run", args.run]
                argv += ["--request", args.request, "--method", method, "--no-progress"]
                argv += ["--out", str(Path(tmp) / f"{method}-{i}"), "--log-level", "WARNING"]
                rows[method].append(one_process(argv))
                print(method, i, {k: round(v, 2) for k, v in rows[method][-1].items()})
    summary: dict[str, Any] = {
        "request": args.request,
        "run": str(args.run),
        "runs": args.runs,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "processes": rows,
    }
    for key in ("wall_s", "cpu_s"):
        for method in rows:
            summary[f"{method}_{key}"] = spread([r[key] for r in rows[method]])
        summary[f"ratio_{key}"] = spread(
            [s[key] / r[key] for s, r in zip(rows["scale"], rows["retrain"], strict=True)]
        )
    out = Path(args.out) / f"unlearn_cli-{args.request.replace(':', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k.startswith("ratio")}), "->", out)


if __name__ == "__main__":
    main()
