"""The scaleflu command: help lists sub-commands, config resolves, errors exit cleanly."""

import subprocess
import sys

import yaml

from scaleflu.cli import main


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "scaleflu.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_subcommands():
    out = run("--help")
    assert out.returncode == 0
    for cmd in ("config", "info", "train", "unlearn", "experiment"):
        assert cmd in out.stdout


def test_config_prints_resolved_yaml():
    out = run("config", "--set", "fl.rounds=3", "--set", "model.name=resnet18")
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["fl"]["rounds"] == 3
    assert cfg["model"]["name"] == "resnet18"


def test_config_error_is_one_line_not_a_traceback(capsys):
    assert main(["config", "--set", "fl.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key: fl.no_such_key" in err
    assert "Traceback" not in err


def test_no_command_prints_help():
    out = run()
    assert out.returncode == 2
    assert "usage: scaleflu" in out.stdout
