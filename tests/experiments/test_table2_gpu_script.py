"""scripts/table2_gpu.sh, the GPU table's one prepared script: its usage and its syntax.

The config it runs is tested end to end at toy size in test_table2_configs.py; the script
itself ran on an H200 (docs/results/table2.md, "Table II on one GPU").
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "table2_gpu.sh"


def test_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_no_arguments_prints_usage_and_exits_2() -> None:
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 2
    assert "Usage:" in p.stdout and "LIMIT_S" in p.stdout and "--set" in p.stdout


def test_every_process_gets_its_seed_model_and_the_callers_settings(tmp_path: Path) -> None:
    # a stand-in interpreter records each call's arguments: 9 processes, then one report
    fake = tmp_path / "py"
    log = tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    p = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "0", "--set", "data.root=/x"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    calls = log.read_text().splitlines()
    runs = [c for c in calls if "--no-report" in c]
    assert len(runs) == 9 and all("data.root=/x" in c for c in runs)

    def between(c: str, key: str) -> str:
        return c.split(key + "=[")[1].split("]")[0]

    pairs = {(between(c, "experiment.models"), between(c, "experiment.seeds")) for c in runs}
    assert pairs == {(m, s) for m in ("lenet", "mobilenetv3", "resnet18") for s in "012"}
    assert calls[-1].endswith("--report-only --set data.root=/x")
    assert "exit 0 after" in p.stdout
