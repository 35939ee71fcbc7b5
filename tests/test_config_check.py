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


def test_load_config_returns_one_typed_object():
    from scaleflu.config import Config, Section

    cfg = load_config(None, ["fl.lr=0.05", "data.poison.target_label=3"])
    assert isinstance(cfg, Config) and isinstance(cfg.data.poison, Section)
    assert cfg.fl.lr == cfg["fl"]["lr"] == 0.05  # attributes, and the mapping during migration
    assert cfg.data.poison.target_label == 3 and cfg.scale["lambda"] == 0.5
    with pytest.raises(AttributeError, match=r"'lrr' \(did you mean lr\?\)"):
        _ = cfg.fl.lrr
    with pytest.raises(AttributeError, match="no key 'lrr'"):
        cfg.fl.lrr = 1.0
    cfg.fl.rounds = 7
    assert cfg["fl"]["rounds"] == 7


def test_saved_config_is_plain_yaml_that_loads_back(tmp_path):
    import yaml

    from scaleflu.config import as_config, save_config

    cfg = load_config(None, ["fl.rounds=4"])
    path = save_config(cfg, tmp_path / "config.yaml")
    back = yaml.safe_load(path.read_text())  # the safe loader: no Python objects in the file
    assert back == cfg.to_dict() and as_config(back) == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("fl.clients_per_round=200", r"fl.clients_per_round \(200\) exceeds data.num_clients"),
        ("data.poison.backdoor_clients=[100]", "backdoor_clients must be a list of client ids"),
        ("data.poison.label_flip_clients=[true]", "label_flip_clients must be a list"),
        ("model.name=vgg16", "model.name must be one of lenet, mobilenetv3, resnet18"),
        ("data.dataset=mnist", "data.dataset must be one of fashion_mnist, cifar100"),
    ],
)
def test_cross_key_rules_and_choices_fail_in_scaleflu_config(override, message, capsys):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
    assert main(["config", "--set", override]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_choices_are_the_registries_names():
    from scaleflu.config import CHOICES
    from scaleflu.fl.data import DATASET_NAMES
    from scaleflu.fl.models import MODEL_NAMES

    assert CHOICES["data.dataset"] == DATASET_NAMES and CHOICES["model.name"] == MODEL_NAMES
    from scaleflu.link.mcs import MCS_TABLE

    assert CHOICES["testbed.mcs"][4:] == tuple(m.name for m in MCS_TABLE)


def test_no_dead_link_section():
    assert "link" not in default_config()  # nothing read link.fft_len/cp_len/samp_rate/mtu
    with pytest.raises(ConfigError, match="unknown config key: link"):
        load_config(None, ["link.mtu=1500"])


def test_safe_dump_writes_a_config_as_plain_yaml():
    import yaml

    cfg = load_config(None, ["fl.rounds=5"])
    text = yaml.safe_dump(dict(cfg), sort_keys=False)  # a plain top level, Section children
    assert "!!python" not in text and yaml.safe_load(text) == cfg.to_dict()


def test_config_survives_pickle_and_deepcopy():
    """Ray workers and resumed runs get a pickled / copied config: still typed, still equal."""
    import copy
    import pickle

    from scaleflu.config import Config, Section

    cfg = load_config(None, ["fl.rounds=4"])
    for other in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg)):
        assert isinstance(other, Config) and isinstance(other.fl, Section)
        assert other == cfg and other.fl.rounds == 4
