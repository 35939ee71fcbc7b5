"""A new user's first commands: ``python -m scaleflu``, ``scaleflu train --resume``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scaleflu import __version__
from scaleflu.cli import main as scaleflu_main
from tiny_run_helpers import needs_fmnist

SMALL = [
    "data.num_clients=3",
    "data.partition=iid",
    "data.train_subset=300",
    "data.test_subset=200",
    "fl.local_epochs=1",
    "fl.clients_per_round=2",
    "fl.threads=1",
    "fl.batch_size=50",
    "scale.val_size=50",
]


def test_python_m_scaleflu_is_the_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scaleflu", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"scaleflu {__version__}"


@needs_fmnist
def test_resume_reuses_the_runs_own_config(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    sets = [a for kv in [*SMALL, "fl.rounds=1", "fl.lr=0.07"] for a in ("--set", kv)]
    assert scaleflu_main(["train", "--out", str(out), "--no-progress", *sets]) == 0
    # the same folder again without --resume: the message says how to continue, in CLI terms
    capsys.readouterr()
    assert scaleflu_main(["train", "--out", str(out), "--no-progress", *sets]) == 2
    err = capsys.readouterr().err
    assert "--resume --out" in err and "resume=True" not in err
    # --resume with only the new round count: every other --set comes from the run's config
    argv = ["train", "--out", str(out), "--resume", "--no-progress", "--set", "fl.rounds=2"]
    assert scaleflu_main(argv) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["fl"]["lr"] == 0.07 and saved["data"]["num_clients"] == 3
    assert saved["fl"]["rounds"] == 2
    # a key that changes the model is still refused, naming it
    capsys.readouterr()
    argv = ["train", "--out", str(out), "--resume", "--no-progress", "--set", "fl.lr=0.5"]
    assert scaleflu_main(argv) == 2
    assert "fl.lr" in capsys.readouterr().err


def test_resume_of_a_folder_without_a_run_is_one_line(tmp_path: Path, capsys) -> None:
    rc = scaleflu_main(["train", "--out", str(tmp_path / "none"), "--resume"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "holds no run to continue" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--help"], ["unlearn", "--help"], ["train", "--help"]])
def test_help_exits_cleanly(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        scaleflu_main(argv)
    assert exc.value.code == 0
    assert "usage: scaleflu" in capsys.readouterr().out


def _section(text: str, title: str) -> str:
    start = text.index(title)
    return text[start : text.index("\n## ", start + len(title))]


def test_testbed_doc_apps_by_hand_uses_current_link_names_and_starts_the_broker() -> None:
    import re

    import yaml

    from scaleflu.linkkinds import ALIASES, KINDS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "testbed.md").read_text()
    sec = _section(doc, "## 2. The apps by hand")
    names = set(re.findall(r"--link[ =`]+([a-z_-]+)", sec)) | set(re.findall(r"`([a-z-]+)`", sec))
    assert {"ofdm-shared", "ofdm-pairs"} <= names
    assert not names & set(ALIASES), names & set(ALIASES)
    assert all(n in KINDS for n in re.findall(r"--link ([a-z_-]+)", sec))
    # the broker: how to start it, with a config the broker accepts
    assert "python -m scaleflu.cli.medium --config medium.yaml" in sec
    block = re.search(r"```yaml\n(.*?)```", sec, re.S)
    assert block is not None
    pytest.importorskip("gnuradio")  # the medium's package sits beside the GNU Radio side
    from scaleflu.radio.medium.config import MediumConfig

    cfg = MediumConfig.from_dict(yaml.safe_load(block.group(1)))
    assert cfg.hub == 0 and cfg.nodes == (0, 1, 2, 3)
