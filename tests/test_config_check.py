"""load_config checks every key against default.yaml: types, nullability, ranges, choices."""

from __future__ import annotations

import pytest

from scaleflu.cli import main
from scaleflu.config import (
    ConfigError,
    check_config,
    default_config,
    load_config,
    merge,
    nullable_keys,
)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fl.rounds=abc", r"fl.rounds must be an integer, got 'abc' \(str\)"),
        ("fl.rounds=2.5", "fl.rounds must be an integer"),
        ("fl.rounds=true", "fl.rounds must be an integer, got True"),
        ("fl.rounds=null", "fl.rounds may not be null"),
        ("fl.rounds=0", "fl.rounds must be >= 1"),
        ("fl.lr=fast", "fl.lr must be an integer or a number"),
        ("fl.lr=0", "fl.lr must be > 0"),
        ("fl.momentum=1", r"fl.momentum must be in \[0, 1\)"),
        ("history.fp16=1", "history.fp16 must be true or false"),
        ("model.name=3", "model.name must be a string"),
        ("experiment.seeds=0", "experiment.seeds must be a list"),
        ("scale.mode=fast", "scale.mode must be one of default, paper"),
        ("data.train_subset=lots", "data.train_subset must be an integer"),
        ("fl.lr=.nan", "fl.lr must be a number, got nan"),
        ("data", "override must look like key.path=value"),
    ],
)
def test_bad_values_fail_with_one_clear_line(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("fl.lr=1", 1),  # an int where the default is a float
        ("fl.batch_size=null", None),  # null allowed: its comment says what null means
        ("scale.utility_samples=null", None),  # said on the comment's continuation line
        ("data.train_subset=500", 500),  # null default, typed by the table
        ("scale.top_m_client=null", None),
        ("experiment.alpha_sweep.models=[lenet]", ["lenet"]),
        ("testbed.arq.initial_rto=2", 2),
    ],
)
def test_good_values_pass_unchanged(override, expected):
    key = override.split("=", 1)[0]
    got = load_config(None, [override])
    for part in key.split("."):
        got = got[part]
    assert got == expected and type(got) is type(expected)


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown config key: fl.lrr \(did you mean fl.lr\?\)"):
        load_config(None, ["fl.lrr=0.1"])
    with pytest.raises(ConfigError, match=r"scale.ppo.episodez \(did you mean scale.ppo.episodes"):
        load_config(None, ["scale.ppo.episodez=3"])
    with pytest.raises(ConfigError, match=r"unknown config key: zzz$"):
        load_config(None, ["zzz=1"])


def test_every_packaged_config_passes():
    for name in ("table2_cpu", "table2_paper"):
        load_config(name)


def test_defaults_pass_and_nullable_keys_come_from_default_yaml():
    check_config(default_config())
    nk = nullable_keys()
    assert {"fl.batch_size", "data.root", "scale.utility_samples", "scale.top_m_client"} <= nk
    assert "fl.rounds" not in nk and "fl.lr" not in nk


def test_a_key_added_to_the_defaults_is_typed_without_code_changes():
    defaults = merge(default_config(), {})
    defaults["fl"]["new_count"] = 4  # as if another branch had added it to default.yaml
    cfg = merge(defaults, {"fl": {"new_count": "four"}})
    with pytest.raises(ConfigError, match="fl.new_count must be an integer"):
        check_config(cfg, defaults)
    check_config(merge(defaults, {"fl": {"new_count": 7}}), defaults)


def test_scaleflu_config_rejects_bad_values_with_status_2(capsys):
    assert main(["config", "--set", "fl.rounds=abc"]) == 2
    err = capsys.readouterr().err
    assert "fl.rounds must be an integer" in err and "Traceback" not in err
