"""``scaleflu train`` writes metrics.csv and training.png beside metrics.jsonl."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fl_helpers import needs_fmnist

from scaleflu.cli import main
from scaleflu.fl.run import write_metrics_csv
from scaleflu.plots import plot_training

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(n: int, asr: bool) -> list[dict]:
    rows = []
    for t in range(1, n + 1):
        r = {"round": t, "test_acc": 0.1 * t, "test_loss": 2.0 / t, "participants": [0, 2]}
        r.update(wall_s=0.5, link_s=0.1, cum_link_s=0.1 * t, bytes=1000 * t)
        if asr:
            r["asr"] = 0.9 / t
        rows.append(r)
    return rows


def test_metrics_csv_is_the_jsonl_as_a_table(tmp_path: Path) -> None:
    rows = _rows(3, asr=True)
    rows[1]["test_acc"] = rows[1]["test_loss"] = rows[1]["asr"] = None  # round not evaluated
    path = write_metrics_csv(rows, tmp_path / "m.csv")
    got = list(csv.DictReader(path.open()))
    assert [int(r["round"]) for r in got] == [1, 2, 3]
    assert float(got[2]["test_acc"]) == rows[2]["test_acc"]  # repr round-trips exactly
    assert float(got[0]["asr"]) == rows[0]["asr"]
    assert got[1]["test_acc"] == "" and got[1]["asr"] == ""
    assert got[0]["participants"] == "0 2"
    no_asr = write_metrics_csv(_rows(2, asr=False), tmp_path / "n.csv")
    assert "asr" not in no_asr.read_text().splitlines()[0].split(",")


def test_training_png_is_written_even_with_unevaluated_rounds(tmp_path: Path) -> None:
    rows = _rows(4, asr=False)
    rows[0]["test_acc"] = None
    p = plot_training(rows, tmp_path / "sub" / "t.png")
    assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 5000


@needs_fmnist
def test_train_cli_writes_csv_and_png(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", "--out", str(out), "--no-progress", "--set", "data.num_clients=3"]
    argv += ["--set", "data.train_subset=300", "--set", "data.test_subset=100"]
    argv += ["--set", "fl.rounds=2", "--set", "fl.clients_per_round=2", "--set", "fl.lr=0.05"]
    argv += ["--set", "fl.local_epochs=1"]
    assert main(argv) == 0
    jsonl = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    table = list(csv.DictReader((out / "metrics.csv").open()))
    assert [int(r["round"]) for r in table] == [r["round"] for r in jsonl] == [1, 2]
    for row, ref in zip(table, jsonl, strict=True):
        assert float(row["test_acc"]) == ref["test_acc"]
        assert float(row["test_loss"]) == ref["test_loss"]
        assert int(row["bytes"]) == ref["bytes"]
    assert (out / "training.png").read_bytes()[:8] == PNG_MAGIC


@needs_fmnist
def test_every_train_call_writes_csv_and_png(tmp_path: Path) -> None:
    """train() itself writes them (the Table II runs call it, not the CLI); outputs=False not."""
    from scaleflu.config import load_config
    from scaleflu.fl.run import train

    sets = ["data.num_clients=3", "data.train_subset=300", "data.test_subset=100"]
    sets += ["fl.rounds=2", "fl.clients_per_round=2", "fl.local_epochs=1", "fl.eval_every=2"]
    cfg = load_config(None, sets)
    res = train(cfg, tmp_path / "a", progress=False)
    table = list(csv.DictReader((tmp_path / "a" / "metrics.csv").open()))
    assert [r["test_acc"] for r in table] == ["", str(res.metrics[1]["test_acc"])]
    assert (tmp_path / "a" / "training.png").read_bytes()[:8] == PNG_MAGIC
    from scaleflu.config import Config
    from scaleflu.fl.run import load_run

    loaded = load_run(tmp_path / "a")  # the saved plain YAML comes back as the typed object
    assert isinstance(res.cfg, Config) and isinstance(loaded.cfg, Config)
    assert loaded.cfg.fl.eval_every == 2 and loaded.cfg == res.cfg
    train(cfg, tmp_path / "b", progress=False, outputs=False)
    assert not (tmp_path / "b" / "metrics.csv").exists()
    assert not (tmp_path / "b" / "training.png").exists()


def test_local_config_from_the_fl_section() -> None:
    """The typed fl section, or a partial mapping completed from default.yaml and checked."""
    import dataclasses

    import pytest

    from scaleflu.config import ConfigError, load_config
    from scaleflu.fl.fedavg import LocalConfig

    fl = {"local_epochs": 3, "lr": 0.01, "batch_size": None, "momentum": 0.5}
    d = load_config().fl  # the keys not given: default.yaml's, never a second default in code
    want = LocalConfig(3, 0.01, None, 0.5, d.lr_schedule, d.lr_decay, d.lr_min_ratio, d.rounds)
    assert LocalConfig.from_config(fl) == want  # null: full batch
    assert LocalConfig.from_config({**fl, "batch_size": 64}, epochs=1) == dataclasses.replace(
        want, epochs=1, batch_size=64
    )
    typed = load_config(None, ["fl.local_epochs=3", "fl.lr=0.01", "fl.batch_size=null"]).fl
    typed.momentum = 0.5
    assert LocalConfig.from_config(typed) == want
    with pytest.raises(ConfigError, match="fl.lr must be an integer or a number"):
        LocalConfig.from_config({**fl, "lr": "fast"})
