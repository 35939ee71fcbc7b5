"""The GPU Table II config and the CPU config's MobileNetV3 part: planned and run at toy size."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaleflu.config import ConfigError, load_config, resolve_config_path
from scaleflu.experiments.cells import RunKey, plan_cells
from scaleflu.experiments.harness import model_config, run_config
from scaleflu.experiments.table2 import run_table2
from scaleflu.fl.run import validate_config
from scaleflu.unlearn.registry import method_names
from tiny_run_helpers import needs_fmnist


def test_gpu_config_plans_three_models_eight_methods() -> None:
    """table2_gpu: 3 models x 3 seeds x 3 scenarios x (6 methods + 2 controls) on the GPU."""
    cfg = load_config(resolve_config_path("table2_gpu"))
    cpu = load_config(resolve_config_path("table2_cpu"))
    exp = cfg["experiment"]
    assert exp["models"] == ["lenet", "mobilenetv3", "resnet18"] and exp["seeds"] == [0, 1, 2]
    assert exp["methods"] == cpu["experiment"]["methods"]
    assert exp["scenarios"] == cpu["experiment"]["scenarios"]
    # in step with table2_cpu: the same protocol with power and MIA settings
    assert cfg["data"] == cpu["data"]
    assert cfg["scale"]["eval"] == cpu["scale"]["eval"]
    assert {k: v for k, v in cfg["fl"].items() if k not in GPU_FL} == {
        k: v for k, v in cpu["fl"].items() if k not in GPU_FL
    }
    main, sweep = plan_cells(cfg)
    assert len(main) == 3 * 3 * 3 * 8 and not sweep
    assert cfg["fl"]["device"] == "cuda" and cfg["fl"]["batch_size"] == 64
    mnv3 = run_config(cfg, RunKey("fashion_mnist", "mobilenetv3", 0.3, 1))
    assert mnv3["fl"]["local_epochs"] == 1 and mnv3["model"]["name"] == "mobilenetv3"
    assert run_config(cfg, RunKey("fashion_mnist", "lenet", 0.3, 1))["fl"]["local_epochs"] == 2
    validate_config(load_config(resolve_config_path("table2_gpu"), ["fl.device=cpu"]))


def test_cpu_config_adds_a_reduced_mobilenetv3() -> None:
    """table2_cpu: LeNet; MobileNetV3 at a reduced size on request; the sweep stays LeNet."""
    assert load_config(resolve_config_path("table2_cpu"))["experiment"]["models"] == ["lenet"]
    cfg = load_config(resolve_config_path("table2_cpu"), ["experiment.models=[lenet,mobilenetv3]"])
    lenet = run_config(cfg, RunKey("fashion_mnist", "lenet", 0.3, 0))
    mnv3 = run_config(cfg, RunKey("fashion_mnist", "mobilenetv3", 0.3, 0))
    assert lenet["fl"] == {**lenet["fl"], "rounds": 20, "local_epochs": 2}
    # LeNet's data (3000 images did not train: 4 SGD steps per client and round), a quarter of
    # its SGD steps, FedAvg's averaged BatchNorm statistics (chosen on validation)
    assert mnv3["data"] == lenet["data"]
    assert mnv3["fl"] == {**lenet["fl"], "rounds": 10, "local_epochs": 1}
    # its forgetting step's own settings (chosen on a tuning run), LeNet's the defaults
    step = ("forget_anchor_weight", "forget_lr")
    assert [model_config(cfg, "mobilenetv3")["scale"][k] for k in step] == [1.0, 0.006]
    assert [model_config(cfg, "lenet")["scale"][k] for k in step] == [2.0, None]
    _, sweep = plan_cells(cfg)
    assert {c.run.model for c in sweep} == {"lenet"}


def test_model_settings_are_checked() -> None:
    """Per-model settings may touch data/fl/model (the runs) and scale (the cells, saved with
    the runs) only, and unknown keys are refused."""
    cfg = load_config(None, ['experiment.model_settings.resnet18=["baselines.pga.lr=2"]'])
    with pytest.raises(ConfigError, match="may set data"):
        run_config(cfg, RunKey("fashion_mnist", "resnet18", 0.3, 0))
    cfg = load_config(None, ['experiment.model_settings.resnet18=["scale.top_m=2"]'])
    assert run_config(cfg, RunKey("fashion_mnist", "resnet18", 0.3, 0))["scale"]["top_m"] == 2
    assert model_config(cfg, "resnet18")["scale"]["top_m"] == 2
    assert model_config(cfg, "lenet")["scale"]["top_m"] == cfg["scale"]["top_m"] != 2
    cfg = load_config(None, ['experiment.model_settings.resnet18=["fl.roundz=2"]'])
    with pytest.raises(ConfigError, match="unknown config key"):
        run_config(cfg, RunKey("fashion_mnist", "resnet18", 0.3, 0))


def test_full_config_is_table2_cpu_at_full_size() -> None:
    """table2_full: table2_cpu's protocol, methods and scenarios on all 60 000 images, 30 rounds."""
    full = load_config(resolve_config_path("table2_full"))
    cpu = load_config(resolve_config_path("table2_cpu"))
    size = ("train_subset", "test_subset")
    assert {k: v for k, v in full["data"].items() if k not in size} == {
        k: v for k, v in cpu["data"].items() if k not in size
    }
    assert full["data"]["train_subset"] is None and full["data"]["test_subset"] is None
    for key in ("methods", "scenarios", "seeds", "scale_mode"):
        assert full["experiment"][key] == cpu["experiment"][key]
    assert full["experiment"]["models"] == ["lenet"]
    assert full["scale"]["ppo"] == cpu["scale"]["ppo"]
    assert full["scale"]["eval"] == {**cpu["scale"]["eval"], "mia_shadow_rounds": 15}
    assert full["fl"] == {**cpu["fl"], "rounds": 30, "lr_schedule": "cosine"}
    assert full["baselines"]["pga"]["post_rounds"] == 3  # 10 % of the rounds, as table2_cpu
    main, sweep = plan_cells(full)
    assert len(main) == 3 * 3 * 8 and not sweep
    validate_config(full)


GPU_FL = ("batch_size", "device", "trainer", "threads", "eval_batch_size")  # may differ


@needs_fmnist
@pytest.mark.slow
# 75 s alone on one core (111 s with 200 training / 90 test images); more on 2 shared cores
# beside other workers
@pytest.mark.timeout(1500)
def test_gpu_config_runs_at_toy_size(tmp_path: Path) -> None:
    """The GPU config end to end at toy size on the CPU: all three models, every cell done."""
    methods = [m for m in ("retrain", "finetune") if m in method_names()]  # the config's plumbing
    cfg = load_config(
        resolve_config_path("table2_gpu"),
        [
            "fl.device=cpu",
            "fl.threads=1",
            "data.num_clients=3",
            "data.train_subset=120",
            "data.test_subset=60",
            "data.poison.canaries=1",
            "data.poison.canary_copies=2",
            "scale.eval.mia_shadow_rounds=1",
            "fl.rounds=1",
            "fl.clients_per_round=3",
            "scale.val_size=20",
            "scale.eval.max_samples=30",
            "scale.eval.mia_samples=20",
            "scale.eval.relearn_max_rounds=0",
            "scale.eval.mia_shadows=0",  # the calibrated MIA's references: test_protocol_power
            "scale.eval.audit.shadows=4",  # the audit's mechanism at its smallest
            "scale.eval.audit.bootstrap=50",
            "baselines.fused.rank=2",
            "experiment.seeds=[0]",
            f"experiment.methods={methods}",
            # the config's per-model settings (10 rounds for MobileNetV3 and ResNet18) apply
            # after the overrides above: keep their mechanism, at one round
            "experiment.model_settings.mobilenetv3=[fl.local_epochs=1, fl.rounds=1]",
            "experiment.model_settings.resnet18=[fl.local_epochs=1, fl.rounds=1]",
        ],
    )
    summary = run_table2(cfg, tmp_path / "out", progress=False)
    assert summary["failed"] == [] and summary["done"] == 3 * 3 * len(methods)
    assert (tmp_path / "out" / "table2.md").is_file()
    for model in ("lenet", "mobilenetv3", "resnet18"):
        assert (tmp_path / "out" / "runs" / f"fashion_mnist-{model}-a0.3-s0").is_dir()
