"""``scaleflu unlearn`` as a new user meets it: requests that touch nothing, summaries, plots,
progress, re-runs, damaged run folders, method aliases.

One small run (5 clients, 2 of them per round, 2 rounds: some client takes part in no round),
trained once for the session; every test works on its own copy when it changes anything.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from scaleflu.cli import build_parser
from scaleflu.cli import main as scaleflu_main
from scaleflu.config import load_config
from scaleflu.fl.history import HistoryStore
from scaleflu.fl.run import train
from scaleflu.unlearn.registry import method_aliases, method_names
from tiny_run_helpers import needs_fmnist

pytestmark = needs_fmnist

RUN = [
    "data.num_clients=5",
    "data.partition=iid",
    "data.train_subset=1000",
    "data.test_subset=600",
    "data.poison.backdoor_clients=[0]",
    "data.poison.backdoor_fraction=0.5",
    "fl.rounds=2",
    "fl.local_epochs=1",
    "fl.lr=0.05",
    "fl.clients_per_round=2",
    "fl.threads=1",
    "fl.trainer=sequential",
    "scale.val_size=100",
    "scale.eval.max_samples=300",
    "scale.eval.mia_samples=100",
]
FAST = ["--no-progress", "--log-level", "INFO", "--set", "scale.eval.relearn_max_rounds=1"]


@pytest.fixture(scope="module")
def small_run(build_once: Callable[..., Path]) -> Path:
    def build(out: Path) -> None:
        torch.set_num_threads(1)
        train(load_config(None, RUN), out / "run", progress=False)

    return build_once("first-hour-run", build) / "run"


@pytest.fixture
def run_copy(small_run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(small_run, dst)
    return dst


def _clients(run: Path) -> tuple[list[int], list[int]]:
    """(clients that took part in some round, clients that took part in none)."""
    with HistoryStore(run) as h:
        took = sorted({n for t in h.rounds() for n in h.participants(t)})
    return took, [n for n in range(5) if n not in took]


def _unlearn(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = scaleflu_main(["unlearn", *argv])
    return rc, capsys.readouterr().err


def test_a_client_of_no_round_is_refused_unless_allowed(run_copy: Path, capsys) -> None:
    _, absent = _clients(run_copy)
    assert absent, "the run must leave some client out of every round"
    n = absent[0]
    rc, err = _unlearn(capsys, "--run", str(run_copy), "--request", f"client:{n}", *FAST)
    assert rc == 3
    assert f"client(s) {n} took part in no round" in err and "--allow-empty" in err
    assert not (run_copy / "unlearn").exists()  # nothing written
    rc, err = _unlearn(
        capsys, "--run", str(run_copy), "--request", f"client:{n}", "--allow-empty", *FAST
    )
    assert rc == 0 and "took part in no round" in err and "running scale anyway" in err
    assert (run_copy / "unlearn" / f"client-{n}-default" / "result.json").is_file()


def test_an_erased_client_is_refused_with_the_reason(run_copy: Path, capsys) -> None:
    took, _ = _clients(run_copy)
    with HistoryStore(run_copy) as h:
        h.erase_clients([took[0]], reason="test")
    rc, err = _unlearn(capsys, "--run", str(run_copy), "--request", f"client:{took[0]}", *FAST)
    assert rc == 3 and "erased from the history" in err


def test_summary_progress_plots_and_no_overwrite(run_copy: Path, capsys) -> None:
    took, _ = _clients(run_copy)
    req = f"client:{took[0]}"
    # --audit: the metrics before -> after with the relearn time; --plots: SCALE's figures
    argv = ["--run", str(run_copy), "--request", req]
    rc, err = _unlearn(capsys, *argv, "--audit", "--plots", *FAST)
    assert rc == 0, err
    first = run_copy / "unlearn" / f"client-{took[0]}-default"
    res = json.loads((first / "result.json").read_text())
    # the summary: before -> after for every metric it shows, the method's and the command's time
    line = next(x for x in err.splitlines() if "scale-default" in x and " -> " in x)
    for label, key in (("test", "test_acc"), ("RA", "ra"), ("FA", "fa")):
        assert re.search(rf"\b{label} [0-9.]+ -> [0-9.]+", line), (label, line)
        assert res["original"][key] is not None and res["metrics"][key] is not None
    m = re.search(r"method ([0-9.]+) s, command ([0-9.]+) s", line)
    assert m and float(m.group(2)) > float(m.group(1)), line
    assert "MIA AUC" in line and "0.5: no trace" in line
    # progress while measuring: a line per stage, before and after
    assert "measuring the model before unlearning" in err
    assert "measuring the model after scale-default" in err
    assert "rounds to relearn" in err
    # figures only where they carry information: the default search runs no PPO episode
    assert res["details"]["episode_returns"] == []
    assert not (first / "ppo_reward.png").exists()
    trace = res["aoi"]["sum_s_trace"]
    assert (first / "sum_aoi.png").exists() == (len(trace) > 1)
    assert (first / "sensitivity.png").is_file()
    # the same request again: a new folder, the first result untouched; without --evaluate the
    # summary says the metrics were not measured (no empty numbers) and how to measure them
    before = (first / "result.json").read_bytes()
    rc, err = _unlearn(capsys, "--run", str(run_copy), "--request", req, *FAST)
    assert rc == 0
    assert (first / "result.json").read_bytes() == before
    second = first.with_name(first.name + "-2")
    assert json.loads((second / "result.json").read_text())["metrics"] == {}
    line = next(x for x in err.splitlines() if "scale-default" in x and "method " in x)
    assert "metrics not measured" in line and "--evaluate" in line and "before -> after" in line
    assert "None" not in line and not re.search(r"\b(test|RA|FA) ", line), line
    assert "measuring the model" not in err and not (second / "sensitivity.png").exists()
    # an explicit folder holding a result: refused (one line), then overwritten with --force
    argv = ["--run", str(run_copy), "--request", req, "--out", str(first), *FAST]
    rc, err = _unlearn(capsys, *argv)
    assert rc == 2 and "holds an earlier result" in err and "--force" in err
    assert (first / "result.json").read_bytes() == before
    rc, err = _unlearn(capsys, *argv, "--force")
    assert rc == 0 and (first / "result.json").read_bytes() != before


def test_the_record_of_an_erasure_is_never_overwritten(run_copy: Path, capsys) -> None:
    took, _ = _clients(run_copy)
    out = run_copy.parent / "erased"
    argv = ["--run", str(run_copy), "--request", f"client:{took[-1]}", "--out", str(out)]
    rc, err = _unlearn(capsys, *argv, "--erase", *FAST)
    assert rc == 0, err
    record = (out / "result.json").read_bytes()
    assert json.loads(record)["erasure"]["clients"] == [took[-1]]
    rc, err = _unlearn(capsys, *argv, "--force", "--allow-empty", *FAST)
    assert rc == 2 and "records an erasure" in err
    assert (out / "result.json").read_bytes() == record


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("model.safetensors", "model.safetensors"),
        ("history/global_00002.safetensors", "global_00002.safetensors"),
        ("history/history.sqlite", "history.sqlite"),
        ("config.yaml", "config.yaml"),
    ],
)
def test_a_damaged_run_file_is_named(run_copy: Path, capsys, damage: str, named: str) -> None:
    path = run_copy / damage
    if damage == "config.yaml":
        path.write_text("fl: [\n")
    elif damage.endswith(".sqlite"):
        path.write_bytes(b"not a database" * 100)
    else:
        path.write_bytes(path.read_bytes()[:1000])  # truncated
    took, _ = _clients(run_copy) if damage != "history/history.sqlite" else ([0], [])
    rc, err = _unlearn(capsys, "--run", str(run_copy), "--request", f"client:{took[0]}", *FAST)
    assert rc == 2
    lines = [x for x in err.splitlines() if "ERROR" in x]
    assert len(lines) == 1 and named in lines[0] and str(run_copy) in lines[0], err
    assert "Traceback" not in err


def test_methods_and_aliases_come_from_the_registry() -> None:
    parser = build_parser()
    base = ["unlearn", "--run", "r", "--request", "client:0"]
    for name, aliases in method_aliases().items():
        for spelling in (name, *aliases):
            assert parser.parse_args([*base, "--method", spelling]).method == name
    assert parser.parse_args([*base, "--method", "FedEraser"]).method == "fedraser"
    assert set(method_aliases()) == set(method_names())
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--method", "fedrazer"])
    help_text = " ".join(
        parser._subparsers._group_actions[0].choices["unlearn"].format_help().split()
    )
    assert "fedraser (also federaser" in help_text
