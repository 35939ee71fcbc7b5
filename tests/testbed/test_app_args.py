"""The apps' command lines: GNU Radio conventions, hidden aliases, one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from scaleflu.cli.testbed import (
    COMMON_OPTIONS,
    ROBOT_OPTIONS,
    SERVER_OPTIONS,
    build_app_parser,
    eng_float,
)

APPS = Path(__file__).resolve().parents[2] / "apps"


def robot_parser():
    return build_app_parser("robot_client.py", "", COMMON_OPTIONS, ROBOT_OPTIONS)


def server_parser():
    return build_app_parser("edge_server.py", "", COMMON_OPTIONS, SERVER_OPTIONS)


def test_eng_notation_values():
    assert eng_float("5M") == 5e6
    assert eng_float("2.45G") == 2.45e9
    assert eng_float("-3k") == -3e3
    assert eng_float("1e6") == 1e6
    with pytest.raises(Exception):  # noqa: B017 - argparse turns it into a usage error
        eng_float("fast")


def test_gr_uhd_short_flags_and_eng_values():
    a = robot_parser().parse_args(
        ["--keys", "k", "--robot-id", "2", "-s", "5M", "-f", "2.4G", "-g", "20", "-A", "TX/RX"]
        + ["-a", "type=b200,serial=X", "--spec", "A:A", "--lo-offset", "1M"]
    )
    assert a.samp_rate == 5e6 and a.freq == 2.4e9 and a.gain == 20.0
    assert a.antenna == "TX/RX" and a.dev_args == "type=b200,serial=X" and a.spec == "A:A"
    assert a.lo_offset == 1e6


def test_old_spellings_still_work_but_are_hidden():
    p = robot_parser()
    a = p.parse_args(["--keys", "k", "--robot-id", "1", "--rate", "2M", "--subdev", "B:0"])
    assert a.samp_rate == 2e6 and a.spec == "B:0"
    a = p.parse_args(["--keys", "k", "--robot-id", "1", "--tx-subdev", "A:0", "--rx-subdev", "B:0"])
    assert a.tx_spec == "A:0" and a.rx_spec == "B:0"
    a = p.parse_args(["--keys", "k", "--robot-id", "1"])
    assert a.samp_rate == 5e6 and a.spec == ""  # the hidden aliases do not reset the defaults
    text = p.format_help()
    for hidden in ("--rate", "--subdev", "--tx-subdev", "--faults", "--fault-round"):
        assert hidden + " " not in text and hidden + "\n" not in text, hidden
    a = p.parse_args(["--keys", "k", "--robot-id", "1", "--faults", "nan", "--fault-round", "2"])
    assert a.faults == "nan" and a.fault_round == 2


def test_help_is_grouped_with_defaults_and_robot_id_right():
    text = robot_parser().format_help()
    for title in ("configuration:", "link:", "radio (--link uhd):", "logging:"):
        assert title in text
    assert "(default: 5000000.0)" in text
    assert "(default: None)" not in text
    assert "FL client id is robot id - 1" in " ".join(text.split())
    server = server_parser().format_help()
    assert "--tx-args" in server and "--rx-args" in server and "-a DEV_ARGS, --args" in server


def test_server_args_override_both_radios():
    a = server_parser().parse_args(["--keys", "k", "--run-dir", "r", "-a", "type=b200"])
    assert a.dev_args == "type=b200"


@pytest.mark.parametrize("app", ["edge_server.py", "robot_client.py"])
def test_apps_errors_are_one_line(tmp_path, app):
    extra = ["--run-dir", str(tmp_path)] if app == "edge_server.py" else ["--robot-id", "1"]
    for argv, needle in (
        (["--keys", str(tmp_path / "missing.json")], "file not found"),
        (["--keys", str(tmp_path / "k.json"), "--config", "nope"], "config file not found"),
    ):
        out = subprocess.run(
            [sys.executable, str(APPS / app), *argv, *extra, "--link", "frames"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2, out.stderr
        assert needle in out.stderr
        assert "Traceback" not in out.stderr


def test_testbed_launcher_checks_its_config_before_the_run_folder(tmp_path):
    """A bad --set or backdoor robot: one line, exit 2, no run folder, no process started."""
    out = tmp_path / "run"
    for argv, needle in (
        (["--set", "fl.rounds=abc"], "fl.rounds must be an integer"),
        (["--backdoor-robot", "9"], "data.poison.backdoor_clients must be a list of client ids"),
    ):
        r = subprocess.run(
            [sys.executable, str(APPS / "testbed.py"), "--out", str(out), *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr + r.stdout
        assert not out.exists()
