"""The one unlearning-method registry: names, typed hyper-parameters, one Retrain everywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from scaleflu.config import ConfigError
from scaleflu.unlearn import registry
from scaleflu.unlearn.registry import (
    canonical_name,
    hyper_parameters,
    make_method,
    method_class,
    method_names,
    register,
)
from scaleflu.unlearn.run import run_unlearning
from tiny_run_helpers import needs_fmnist, tiny_config


def test_names_aliases_and_unknown_method() -> None:
    """Five methods registered; aliases resolve; a typo is refused with a suggestion."""
    assert method_names()[:5] == ("retrain", "scale", "fedraser", "pga", "fused")
    assert canonical_name("FedEraser") == "fedraser" and canonical_name("f-e") == "fedraser"
    with pytest.raises(ValueError, match="did you mean 'fused'"):
        canonical_name("fusd")
    with pytest.raises(ValueError, match="unknown unlearning method"):
        make_method("nope")


def test_every_caller_uses_the_registry() -> None:
    """The CLI's choices, table2's factory and baselines.get_method are the registry's."""
    from scaleflu.cli.unlearn import METHODS
    from scaleflu.experiments.harness import default_factory
    from scaleflu.unlearn.baselines import get_method
    from scaleflu.unlearn.retrain import RetrainUnlearner

    assert METHODS == method_names()
    cfg = tiny_config("baselines.retrain.rounds=3")
    for m in (default_factory("retrain", cfg), get_method("retrain", cfg)):
        assert type(m) is RetrainUnlearner and m.rounds == 3
    assert method_class("retrain") is RetrainUnlearner
    assert default_factory("scale", cfg).mode == "default"


def test_hyper_parameters_are_merged_once_and_typed() -> None:
    """Defaults < config section < overrides; ints widen to floats; wrong types are refused."""
    hp = hyper_parameters("pga")
    assert hp["stop_rule"] == "reference" and hp["lr"] == 0.01
    cfg = {"baselines": {"pga": {"lr": 1, "epochs": 3.0}}}
    hp = hyper_parameters("pga", cfg, {"epochs": 7})
    assert hp["lr"] == 1.0 and isinstance(hp["lr"], float) and hp["epochs"] == 7
    assert make_method("pga", cfg).overrides["lr"] == 1.0
    with pytest.raises(ConfigError, match="did you mean 'epochs'"):
        hyper_parameters("pga", None, {"epoch": 2})
    with pytest.raises(ConfigError, match="baselines.pga.epochs must be int"):
        hyper_parameters("pga", None, {"epochs": "abc"})
    with pytest.raises(ConfigError, match="must be int"):
        hyper_parameters("fused", None, {"rank": True})
    with pytest.raises(ConfigError, match="stop_rule"):
        hyper_parameters("pga", None, {"stop_rule": "never"})
    with pytest.raises(ConfigError, match="mode must be paper or default"):
        make_method("scale", None, mode="fast")
    assert hyper_parameters("retrain", None, {"rounds": None})["rounds"] is None


class _Echo:
    name = "echo"

    def __init__(self, **hp: Any) -> None:
        self.hp = hp


def test_registering_a_method_is_one_line() -> None:
    """A new method is one register() call; without a schema it takes no unknown keys."""
    register("echo-test", f"{__name__}:_Echo")
    try:
        assert "echo-test" in method_names()
        assert make_method("echo-test").hp == {}
        with pytest.raises(ConfigError, match="unknown key baselines.echo-test.x"):
            make_method("echo-test", None, x=1)
        with pytest.raises(ValueError, match="registered twice"):
            register("echo-test", f"{__name__}:_Echo")
    finally:
        registry._METHODS.pop("echo-test")


@needs_fmnist
def test_retrain_is_one_class_in_cli_table2_and_testbed(tiny_run: Any, tmp_path: Path) -> None:
    """`unlearn --method retrain`, table2 and the testbed run one Retrain (bit-exact)."""
    from scaleflu.cli.unlearn import run_unlearn
    from scaleflu.experiments.harness import default_factory, make_context
    from scaleflu.testbed.unlearn_service import compare_unlearn, default_unlearn
    from scaleflu.unlearn.request import parse_request

    run_dir = Path(tiny_run.run_dir)
    req = "client:0"
    over = ["baselines.retrain.rounds=2"]
    out = run_unlearn(run_dir, req, method="retrain", out=tmp_path / "cli", overrides=over)
    from safetensors.torch import load_file

    cli_state = load_file(str(out / "model.safetensors"))
    import json

    cli_details = json.loads((out / "result.json").read_text())["details"]
    cfg = tiny_config(*over)
    ctx = make_context(tiny_run, req, cfg, progress=False)
    unl = default_factory("retrain", cfg)
    t2_details = unl.run(ctx).to_dict()["details"]
    assert set(cli_details) == set(t2_details)
    assert cli_details["aoi_time_avg_s"] == pytest.approx(t2_details["aoi_time_avg_s"])
    for k, v in unl.state.items():
        assert torch.equal(v, cli_state[k]), k
    before = sorted(p.name for p in run_dir.iterdir())
    # the testbed: the typed request on the run the server holds in memory
    typed = parse_request(req)
    state, result = default_unlearn(tiny_run, typed, "retrain", "default", over, False)
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing read back from disk
    assert result["method"] == "retrain" and result["details"]["rounds"] == 2
    for k, v in unl.state.items():
        assert torch.equal(v, state[k]), k
    done = run_unlearning(run_dir, req, "retrain", overrides=over, progress=False, run=tiny_run)
    assert done.result.method == "retrain" and torch.equal(
        done.state["fc3.weight"], unl.state["fc3.weight"]
    )
    # the testbed's comparison: the same in-memory run, its outputs written beside the run
    row = compare_unlearn(tiny_run, typed, "retrain", over, False)
    on_disk = json.loads((run_dir / "unlearn_compare" / "retrain" / "result.json").read_text())
    assert row["method"] == "retrain" and row["details"]["rounds"] == 2
    assert row["metrics"] == on_disk["metrics"] and row["cost"]["fl_rounds"] == 2
    bad = compare_unlearn(tiny_run, typed, "retrian", over, False)
    assert bad["method"] == "retrian" and "did you mean 'retrain'" in bad["error"]
