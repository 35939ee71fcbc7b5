"""Run API: learning on real FashionMNIST, resume after a crash, config validation, CLI."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fl_helpers import needs_fmnist
from safetensors.torch import load_file

from scaleflu.cli.train import add_train_parser
from scaleflu.config import ConfigError, load_config
from scaleflu.fl.run import load_run, train, validate_config

CfgFactory = Callable[..., dict[str, Any]]

# Fast-learning test settings: the paper's eta=0.001 assumes E=10 local epochs over 100
# rounds; three rounds of one epoch need a larger step (eta=0.05 with momentum 0.9, B=32) to
# leave chance level (0.1) far behind on 2000 samples.
LEARN = ["fl.lr=0.05", "fl.momentum=0.9", "fl.local_epochs=2", "data.partition=iid"]


@needs_fmnist
def test_fedavg_learns_fashion_mnist(tmp_path: Path, small_cfg: CfgFactory) -> None:
    result = train(small_cfg(*LEARN), tmp_path / "run", progress=False)
    accs = [m["test_acc"] for m in result.metrics]
    assert len(accs) == 3 and accs[-1] > 0.5, accs
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert set(r) >= {"test_acc", "test_loss", "participants", "wall_s", "link_s", "bytes"}
        assert r["participants"] == [0, 1, 2, 3, 4]
    saved = load_file(tmp_path / "run" / "model.safetensors")
    assert all(torch.equal(saved[k], v) for k, v in result.model.state_dict().items())
    assert load_config(tmp_path / "run" / "config.yaml") == result.cfg

    loaded = load_run(tmp_path / "run")
    assert loaded.history.last_completed_round() == 3
    assert all(torch.equal(loaded.model.state_dict()[k], saved[k]) for k in saved)
    assert sum(len(p) for p in loaded.parts) == 2000
    assert loaded.history.data_sizes(1) == {n: len(loaded.parts[n]) for n in range(5)}
    upd = loaded.history.client_update(2, 3)
    assert set(upd) == set(saved)
    with pytest.raises(ConfigError, match="already holds a run"):
        train(small_cfg(*LEARN), tmp_path / "run", progress=False)


class _CrashError(RuntimeError):
    pass


@needs_fmnist
@pytest.mark.parametrize("trainer", ["vmap", "sequential"])
def test_resume_after_crash_equals_uninterrupted(
    tmp_path: Path, small_cfg: CfgFactory, trainer: str
) -> None:
    cfg = small_cfg(
        "fl.rounds=4",
        "fl.clients_per_round=3",
        f"fl.trainer={trainer}",
        "history.keep_rounds=2",
        "data.train_subset=600",
        "data.test_subset=200",
    )
    full = train(cfg, tmp_path / "full", progress=False)

    def crash(t: int, _row: dict[str, Any]) -> None:
        if t == 2:
            raise _CrashError("simulated crash")

    with pytest.raises(_CrashError):
        train(cfg, tmp_path / "crash", progress=False, callbacks=[crash])
    assert load_run(tmp_path / "crash").history.last_completed_round() == 2
    resumed = train(cfg, tmp_path / "crash", resume=True, progress=False)
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k
    assert [m["round"] for m in resumed.metrics] == [1, 2, 3, 4]
    assert [m["test_acc"] for m in resumed.metrics] == [m["test_acc"] for m in full.metrics]
    assert resumed.history.participants(3) == full.history.participants(3)
    lines = (tmp_path / "crash" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="fl.lr"):
        train({**cfg, "fl": {**cfg["fl"], "lr": 0.5}}, tmp_path / "crash", resume=True)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fl.lr=-0.1", "fl.lr .*must be > 0"),
        ("fl.lr=0", "fl.lr .*must be > 0"),
        ("data.alpha=0", "data.alpha .*must be > 0"),
        ("data.alpha=-1", "data.alpha"),
        ("model.name=vgg16", "model.name must be one of lenet"),
        ("data.dataset=mnist", "data.dataset must be one of fashion_mnist"),
        ("fl.clients_per_round=200", r"fl.clients_per_round \(200\) exceeds data.num_clients"),
        ("fl.rounds=0", "fl.rounds must be >= 1"),
        ("fl.batch_size=1.5", "fl.batch_size must be an integer"),
        ("fl.backend=spark", "fl.backend must be one of local, ray"),
        ("fl.momentum=1.0", "fl.momentum"),
        ("data.poison.backdoor_fraction=2", "backdoor_fraction must be in"),
        ("data.poison.backdoor_clients=[100]", "backdoor_clients must be a list of client ids"),
        ("history.keep_rounds=0", "history.keep_rounds must be >= 1"),
        ("history.link_goodput=0", "link_goodput"),
        ("data.partition=shards", "data.partition must be one of iid, dirichlet"),
    ],
)
def test_bad_config_is_clear(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(None, [override]))


def test_missing_data_files_is_config_error(tmp_path: Path, small_cfg: CfgFactory) -> None:
    cfg = small_cfg(f"data.root={tmp_path}")
    with pytest.raises(ConfigError, match="FashionMNIST files missing.*dataset-fashion-mnist"):
        train(cfg, tmp_path / "run", progress=False)


def test_too_many_clients_for_data(tmp_path: Path, small_cfg: CfgFactory) -> None:
    cfg = small_cfg("data.train_subset=3")
    with pytest.raises(ConfigError, match="at least one sample"):
        train(cfg, tmp_path / "run", progress=False)


@needs_fmnist
def test_cli_train_and_resume(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "data: {num_clients: 4, train_subset: 400, test_subset: 100, "
        "poison: {backdoor_clients: [1], backdoor_fraction: 0.5}}\n"
        "fl: {rounds: 1, local_epochs: 1, lr: 0.05, clients_per_round: 2}\n"
    )
    out = tmp_path / "run"
    args = parser.parse_args(
        [
            "train",
            "--config",
            str(conf),
            "--set",
            "fl.batch_size=50",
            "--out",
            str(out),
            "--backend",
            "local",
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert 0.0 <= row["asr"] <= 1.0  # backdoor configured: attack success rate reported
    poison = json.loads((out / "poison.json").read_text())
    assert len(poison["backdoor_indices"]) > 0
    more = parser.parse_args(
        [
            "train",
            "--config",
            str(conf),
            "--set",
            "fl.batch_size=50",
            "--set",
            "fl.rounds=2",
            "--out",
            str(out),
            "--resume",
            "--no-progress",
        ]
    )
    assert more.func(more) == 0
    assert load_run(out).history.last_completed_round() == 2
    bad = parser.parse_args(["train", "--set", "fl.lr=-1", "--out", str(tmp_path / "bad")])
    assert bad.func(bad) == 2


def test_cifar100_binary_run_end_to_end(tmp_path: Path, small_cfg: CfgFactory) -> None:
    """A tiny synthetic CIFAR-100 binary folder through train() and load_run()."""
    import numpy as np

    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    for name, n in (("train.bin", 60), ("test.bin", 20)):
        rec = np.concatenate(
            [
                rng.integers(0, 20, (n, 1)),
                rng.integers(0, 100, (n, 1)),
                rng.integers(0, 256, (n, 3072)),
            ],
            axis=1,
        ).astype(np.uint8)
        (folder / name).write_bytes(rec.tobytes())
    cfg = small_cfg(
        "data.dataset=cifar100",
        f"data.root={folder}",
        "data.train_subset=null",
        "data.test_subset=null",
        "fl.rounds=1",
        "data.num_clients=3",
        "fl.clients_per_round=2",
    )
    result = train(cfg, tmp_path / "run", progress=False)
    assert result.model.fc3.out_features == 100
    loaded = load_run(tmp_path / "run")
    assert loaded.train.in_channels == 3 and loaded.train.image_size == 32
    assert len(loaded.history.participants(1)) == 2


@needs_fmnist
def test_resume_after_crash_inside_a_round(
    tmp_path: Path, small_cfg: CfgFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between local training and the history write: the round is redone on resume."""
    import scaleflu.fl.aggregation as agg_mod

    cfg = small_cfg(
        "fl.rounds=3", "fl.clients_per_round=2", "data.train_subset=400", "data.test_subset=100"
    )
    full = train(cfg, tmp_path / "full", progress=False)
    real = agg_mod.aggregate
    calls = {"n": 0}

    def flaky(states: Any, sizes: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise _CrashError("killed during round 2")
        return real(states, sizes)

    monkeypatch.setattr(agg_mod, "aggregate", flaky)
    with pytest.raises(_CrashError):
        train(cfg, tmp_path / "crash", progress=False)
    monkeypatch.setattr(agg_mod, "aggregate", real)
    assert load_run(tmp_path / "crash").history.last_completed_round() == 1
    resumed = train(cfg, tmp_path / "crash", resume=True, progress=False)
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k


@needs_fmnist
def test_divergence_is_reported_and_nothing_non_finite_is_recorded(
    tmp_path: Path, small_cfg: CfgFactory
) -> None:
    from scaleflu.fl.history import DivergedError

    cfg = small_cfg("fl.lr=1.0e12", "fl.momentum=0.9", "data.partition=iid")
    with pytest.raises(DivergedError, match=r"round \d+: training diverged.*fl\.lr"):
        train(cfg, tmp_path / "run", progress=False)
    # every recorded round holds a finite global model
    loaded = load_run(tmp_path / "run")
    for t in range(1, loaded.history.last_completed_round() + 2):
        assert all(v.isfinite().all() for v in loaded.history.global_model(t).values())
