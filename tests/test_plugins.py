"""Bring your own model and data set: the plugin hook and the worked example (examples/byo_model).

The example's plugin registers ``smallcnn`` and ``shapes`` (16x16 shapes in 6 classes, written
as .npz by its make_data.py). The saved config names the plugin, so a fresh process -- unlearn,
the Table II harness, the testbed's server and robots -- loads it by itself: those steps run as
subprocesses here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from scaleflu.cli import main as scaleflu_main
from scaleflu.config import ConfigError, load_config
from scaleflu.fl.data import DataError, load_datasets, load_npz
from scaleflu.fl.models import build_model
from scaleflu.plugins import PluginError, load_plugin

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "byo_model"
SMALL = ["fl.rounds=2", "data.num_clients=4", "fl.clients_per_round=4", "fl.threads=1"]


def _sets(*kv: str) -> list[str]:
    return [a for x in kv for a in ("--set", x)]


def _cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "scaleflu", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT.parent,  # not the checkout: the saved config must find the plugin on its own
    )


@pytest.fixture(scope="module")
def shapes(build_once: Callable[..., Path]) -> Path:
    """The example's data, written once by its own script (a small size)."""

    def build(out: Path) -> None:
        cmd = [sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(out)]
        subprocess.run([*cmd, "--train", "800", "--test", "300"], check=True, timeout=120)

    return build_once("byo-shapes", build)


@pytest.fixture(scope="module")
def byo_run(shapes: Path, build_once: Callable[..., Path]) -> Path:
    """A run of the example's model on its data set, trained by ``scaleflu train``."""

    def build(out: Path) -> None:
        torch.set_num_threads(1)
        argv = ["train", "--config", str(EXAMPLE / "config.yaml"), "--out", str(out / "run")]
        argv += ["--no-progress", *_sets(f"data.root={shapes}", *SMALL)]
        assert scaleflu_main(argv) == 0

    return build_once("byo-run", build) / "run"


def test_the_example_registers_its_model_and_data_set(shapes: Path) -> None:
    cfg = load_config(EXAMPLE / "config.yaml", [f"data.root={shapes}"])
    assert cfg.plugins == [str(EXAMPLE / "plugin.py")]  # made absolute, beside its config
    train, test = load_datasets(cfg.data, 0)
    assert (train.num_classes, train.in_channels, train.image_size) == (6, 1, 16)
    assert len(train) == 800 and len(test) == 300 and train.pixels.dtype == torch.uint8
    model = build_model("smallcnn", 6, 1, 16)
    assert type(model).__name__ == "SmallCNN" and model.input_shape == (1, 16, 16)
    with torch.no_grad():
        assert model(train.inputs(slice(0, 4))).shape == (4, 6)


def test_train_then_unlearn_in_a_fresh_process(byo_run: Path) -> None:
    rows = [json.loads(x) for x in (byo_run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["test_acc"] > 0.3  # 6 classes: chance is 0.17
    argv = ["--run", str(byo_run), "--request", "client:0", "--method", "finetune"]
    out = _cli("unlearn", *argv, "--evaluate")
    assert out.returncode == 0, out.stderr
    res = json.loads(next((byo_run / "unlearn").glob("client-0-finetune*/result.json")).read_text())
    assert res["metrics"]["test_acc"] is not None and res["protocol"] == "backdoor"


@pytest.mark.slow
def test_the_table2_harness_runs_the_plugin(byo_run: Path, shapes: Path, tmp_path: Path) -> None:
    argv = ["experiment", "table2", "--config", str(EXAMPLE / "config.yaml"), "--no-progress"]
    argv += ["--out", str(tmp_path / "t2")]
    argv += _sets(
        f"data.root={shapes}",
        *SMALL,
        "experiment.datasets=[shapes]",
        "experiment.models=[smallcnn]",
        "experiment.methods=[finetune]",
    )
    out = _cli(*argv)
    assert out.returncode == 0, out.stderr
    summary = json.loads((tmp_path / "t2" / "summary.json").read_text())
    assert not summary["failed"] and summary["done"] == summary["cells"] >= 1, summary
    assert (tmp_path / "t2" / "cells" / "shapes" / "smallcnn").is_dir()


@pytest.mark.slow
def test_the_testbed_server_and_robots_load_the_plugin(shapes: Path, tmp_path: Path) -> None:
    run = tmp_path / "tb"
    argv = ["testbed", "--link", "frames", "--robots", "2", "--rounds", "1", "--unlearn", "none"]
    argv += ["--config", str(EXAMPLE / "config.yaml"), "--out", str(run), "--quiet"]
    argv += _sets(f"data.root={shapes}", "testbed.unlearn.compare=[]")
    out = _cli(*argv)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert [r["round"] for r in report["rounds"]] == [1]
    assert len(report["rounds"][0]["participants"]) == 2, report["rounds"][0]
    saved = (run / "testbed.yaml").read_text()
    assert "smallcnn" in saved and str(EXAMPLE / "plugin.py") in saved


# -- a bad plugin is a clear error -------------------------------------------------------------


def _plugin(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text("from scaleflu.plugins import register_dataset, register_model\n" + body)
    return path


def test_a_missing_or_failing_plugin_is_one_line(tmp_path: Path, capsys) -> None:
    assert scaleflu_main(["config", "--plugin", "no_such_plugin_mod"]) == 2
    err = capsys.readouterr().err
    assert "plugin 'no_such_plugin_mod' not found" in err and "Traceback" not in err
    bad = _plugin(tmp_path, "boom_plugin", "raise RuntimeError('boom')\n")
    assert scaleflu_main(["config", "--plugin", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "boom_plugin.py" in err and "RuntimeError: boom" in err and len(err.splitlines()) == 1
    assert scaleflu_main(["config", "--plugin", str(tmp_path / "absent.py")]) == 2
    assert "plugin file not found" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"model.name must be one of .* or a plugin's"):
        load_config(None, ["model.name=no_such_net"])


def test_a_builder_or_loader_that_breaks_its_contract_is_named(tmp_path: Path) -> None:
    path = _plugin(
        tmp_path,
        "contract_plugin",
        "import numpy as np\nimport torch\n"
        "register_model('wrongnet', lambda k, c, s: torch.nn.Linear(3, k))\n"
        "register_model('notamodule', lambda k, c, s: 'hello')\n"
        "register_dataset('floats', lambda d, seed: ((np.zeros((4, 8, 8)), np.zeros(4, int)),"
        " (np.zeros((2, 8, 8), np.uint8), np.zeros(2, int))))\n"
        "register_dataset('oops', lambda d, seed: 1 / 0)\n",
    )
    load_plugin(str(path))
    with pytest.raises(PluginError, match=r"model 'wrongnet' \(.*\) cannot take a batch of 1x8x8"):
        build_model("wrongnet", 10, 1, 8)
    with pytest.raises(PluginError, match="returned str, not a torch.nn.Module"):
        build_model("notamodule", 10, 1, 8)
    base = load_config(None, [f"plugins=[{path}]"])
    with pytest.raises(DataError, match=r"data set 'floats' .* train: images must be uint8"):
        load_datasets({**base.data.to_dict(), "dataset": "floats"}, 0)
    with pytest.raises(PluginError, match=r"data set 'oops' .* ZeroDivisionError"):
        load_datasets({**base.data.to_dict(), "dataset": "oops"}, 0)
    with pytest.raises(PluginError, match="is built in"):
        load_plugin(str(_plugin(tmp_path, "clash", "register_model('lenet', lambda k, c, s: 0)\n")))


class _Payload:
    """Unpickling it would create a folder: the proof that loading ran nothing."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.mkdir, (str(self.marker),))


def test_loading_a_data_file_never_runs_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.npz"
    np.savez(evil, images=np.array([_Payload(marker)], dtype=object), labels=np.zeros(1, int))
    with pytest.raises(DataError, match="evil.npz"):
        load_npz(evil, "images", "labels")
    assert not marker.exists()
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"junk.npz: not a readable .npz file"):
        load_npz(tmp_path / "junk.npz", "images")
    good = tmp_path / "good.npz"
    np.savez(good, images=np.zeros((2, 4, 4), np.uint8))
    with pytest.raises(DataError, match=r"good.npz: no array 'labels' \(it holds images\)"):
        load_npz(good, "images", "labels")
