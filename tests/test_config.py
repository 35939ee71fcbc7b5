"""Config loader: Table I defaults, YAML/TOML files, overrides, clear errors."""

import pytest

from scaleflu.config import ConfigError, load_config, parse_override, save_config


def test_defaults_are_table_one():
    cfg = load_config()
    assert cfg["data"]["num_clients"] == 100
    assert cfg["fl"]["local_epochs"] == 10
    assert cfg["fl"]["rounds"] == 100
    assert cfg["fl"]["lr"] == pytest.approx(0.001)
    assert cfg["data"]["alpha"] == pytest.approx(1.0)
    assert cfg["scale"]["groups_per_layer"] == 8
    assert cfg["scale"]["lambda"] == pytest.approx(0.5)
    ppo = cfg["scale"]["ppo"]
    assert (ppo["episodes"], ppo["epochs"]) == (800, 10)
    assert ppo["clip_range"] == pytest.approx(0.2)
    assert ppo["gamma"] == pytest.approx(0.99)
    assert ppo["gae_lambda"] == pytest.approx(0.95)
    assert ppo["learning_rate"] == pytest.approx(3e-4)


def test_file_then_overrides(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("fl:\n  rounds: 5\n  lr: 0.05\nmodel:\n  name: resnet18\n")
    cfg = load_config(f, ["fl.lr=0.01", "data.poison.backdoor_clients=[3, 4]"])
    assert cfg["fl"]["rounds"] == 5
    assert cfg["fl"]["lr"] == pytest.approx(0.01)
    assert cfg["model"]["name"] == "resnet18"
    assert cfg["data"]["poison"]["backdoor_clients"] == [3, 4]
    # untouched defaults survive the merge
    assert cfg["fl"]["local_epochs"] == 10


def test_toml_file(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("[fl]\nrounds = 7\n")
    assert load_config(f)["fl"]["rounds"] == 7


def test_round_trip_through_saved_config(tmp_path):
    cfg = load_config(overrides=["seed=42"])
    path = save_config(cfg, tmp_path / "out" / "config.yaml")
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("fl:\n  rounds: 5\n  lrr: 1\n", "unknown config key: fl.lrr"),
        ("fl: 3\n", "must be a mapping"),
        ("- a\n- b\n", "mapping at top level"),
        ("fl: [unclosed\n", "cannot parse"),
    ],
)
def test_bad_files(tmp_path, text, match):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(f)


def test_bad_overrides_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_override("fl.lr")
    with pytest.raises(ConfigError, match="empty key"):
        parse_override("=3")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e-3", 1e-3), ("1.0e12", 1e12), ("3.0e-4", 3e-4), ("-2E5", -2e5), ("0.5", 0.5)],
)
def test_exponent_floats_are_numbers(text, value):
    cfg = load_config(overrides=[f"scale.w_f={text}"])  # a float key without a range
    assert isinstance(cfg["scale"]["w_f"], float)
    assert cfg["scale"]["w_f"] == pytest.approx(value)


def test_ints_and_strings_stay_what_they_are():
    cfg = load_config(overrides=["fl.rounds=7", "model.name=lenet", "data.root=/tmp/1e5"])
    assert cfg["fl"]["rounds"] == 7 and isinstance(cfg["fl"]["rounds"], int)
    assert cfg["model"]["name"] == "lenet"
    assert cfg["data"]["root"] == "/tmp/1e5"
