"""The scaleflu command: help lists sub-commands, config resolves, errors exit cleanly."""

import subprocess
import sys

import yaml

from scaleflu.cli import main


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "scaleflu", *args], capture_output=True, text=True, timeout=120
    )


def run_code(code):
    """A fresh interpreter on the program ``code`` (what a process's start and end do)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


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


# --- lazy imports, packaged configs, global options, one-line errors -------------------------


def test_help_imports_neither_torch_nor_numpy():
    code = (
        "import sys\nfrom scaleflu.cli import build_parser\nbuild_parser().format_help()\n"
        "print(sorted(m for m in ('torch', 'numpy', 'yaml', 'gnuradio') if m in sys.modules))"
    )
    out = run_code(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_subcommand_imports_scaleflu_cli_back():
    import scaleflu.cli.experiment
    import scaleflu.cli.keys
    import scaleflu.cli.testbed
    import scaleflu.cli.train
    import scaleflu.cli.unlearn

    for mod in (
        scaleflu.cli.train,
        scaleflu.cli.unlearn,
        scaleflu.cli.experiment,
        scaleflu.cli.testbed,
        scaleflu.cli.keys,
    ):
        src = open(mod.__file__).read()
        assert "from scaleflu.cli import" not in src, mod.__name__
        assert "scaleflu.cli.main" not in src, mod.__name__


def test_help_lists_testbed():
    out = run("--help")
    assert "testbed" in out.stdout
    out = run("testbed", "--help")
    assert out.returncode == 0, out.stderr
    assert "usage: scaleflu testbed" in out.stdout
    assert "--robots" in out.stdout and "--link" in out.stdout


def test_packaged_config_name_in_every_subcommand(capsys):
    assert main(["config", "--config", "table2_cpu"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    packaged = yaml.safe_load(
        open(
            __import__("scaleflu.config", fromlist=["PACKAGED_DIR"]).PACKAGED_DIR
            / "table2_cpu.yaml"
        )
    )
    for section, values in packaged.items():
        if isinstance(values, dict):
            for k, v in values.items():
                if not isinstance(v, dict):
                    assert cfg[section][k] == v, f"{section}.{k}"
    from scaleflu.cli import build_parser

    parser = build_parser()
    for argv in (
        ["train", "--config", "table2_cpu"],
        ["unlearn", "--run", "x", "--request", "client:0", "--config", "table2_cpu"],
        ["experiment", "table2", "--config", "table2_cpu"],
    ):
        assert parser.parse_args(argv).config == "table2_cpu"


def test_unknown_config_name_is_one_line(capsys):
    assert main(["train", "--config", "no_such_config", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "config file not found: no_such_config" in err
    assert "table2_cpu" in err  # names what exists
    assert "Traceback" not in err


def test_log_level_before_and_after_subcommand():
    from scaleflu.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["--log-level", "debug", "config"]).log_level == "DEBUG"
    assert parser.parse_args(["config", "--log-level", "warning"]).log_level == "WARNING"
    args = parser.parse_args(["--log-level", "ERROR", "experiment", "table2"])
    assert args.log_level == "ERROR"  # not overwritten by the sub-parser's default
    args = parser.parse_args(["experiment", "table2", "--log-level", "INFO"])
    assert args.log_level == "INFO"
    assert parser.parse_args(["config"]).log_level is None


def test_set_help_example_is_accepted_by_each_subcommand():
    import re

    from scaleflu.cli import build_parser
    from scaleflu.config import load_config
    from scaleflu.unlearn.base import resolve_unlearn_config  # noqa: F401 - unlearn's checker

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    seen = 0
    for name, p in sub.choices.items():
        help_text = p.format_help()
        m = re.search(r"e\.g\. --set (\S+)", help_text.replace("\n", " "))
        if m is None:
            continue
        seen += 1
        load_config(None, [m.group(1)])  # a real key with a valid value
        if name == "unlearn":
            key = m.group(1).split("=")[0]
            assert key.split(".")[0] in ("scale", "baselines"), key
    assert seen >= 3


def test_train_help_names_the_real_default_folder():
    out = run("train", "--help")
    assert "runs/fl-" in out.stdout


def test_missing_file_errors_are_one_line_with_nonzero_exit(tmp_path, capsys):
    rc = main(["unlearn", "--run", str(tmp_path / "nope"), "--request", "client:0"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if "ERROR" in line]) == 1


def test_unexpected_exception_is_one_line(caplog):
    from scaleflu.cli.args import run_one_line

    def boom() -> int:
        raise RuntimeError("kaput")

    with caplog.at_level("INFO"):
        assert run_one_line(boom) == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == ["failed: RuntimeError: kaput"]
    assert not any("Traceback" in r.getMessage() for r in caplog.records)


def test_log_values_are_formatted():
    from scaleflu.log import fmt

    assert fmt({"ra": 0.912345678, "fa": None, "n": 3}) == "ra=0.9123 fa=n/a n=3"
    assert fmt(0.1 + 0.2) == "0.3"
    assert fmt([1.23456789, "x"]) == "[1.235, x]"
    assert fmt(True) == "True"


def test_demo_echoes_each_robot_evaluation_once():
    from scaleflu.testbed.launcher import _ECHO, _ROBOT_EVAL

    robot = "06:00:01 INFO    scaleflu.testbed.robot: robot 2: unlearned model: ra=0.9 fa=0.1"
    server = (
        "06:00:01 INFO    scaleflu.testbed.server: robot 2 evaluated the unlearned model: ra=0.9"
    )
    assert _ECHO.search(robot) and _ROBOT_EVAL.search(robot)  # would be echoed: filtered
    assert _ECHO.search(server) and not _ROBOT_EVAL.search(server)


def test_testbed_subcommand_hands_every_option_to_the_launcher(monkeypatch):
    import scaleflu.cli.testbed as testbed_cli

    seen = {}

    def fake_main(argv, prog="testbed.py"):
        seen["argv"], seen["prog"] = list(argv), prog
        return 7

    monkeypatch.setattr(testbed_cli, "launcher_main", fake_main)
    argv = ["--log-level", "info", "testbed", "--robots", "2", "--link", "frames", "--set", "a=1"]
    assert main(argv) == 7
    assert seen["prog"] == "scaleflu testbed"
    assert seen["argv"] == ["--log-level", "INFO", "--robots", "2", "--link", "frames"] + [
        "--set",
        "a=1",
    ]


def test_the_process_entry_sets_the_collector_and_main_in_process_does_not():
    import gc

    before = gc.get_threshold()
    assert main(["config", "--set", "fl.rounds=3"]) == 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    code = (
        "import atexit, gc, sys\n"
        "from scaleflu.cli.main import GC_THRESHOLD, entry\n"
        "atexit.register(lambda: print(gc.get_threshold() == GC_THRESHOLD,"
        " gc.get_freeze_count() > 0))\n"
        "sys.argv = ['scaleflu', 'config', '--set', 'fl.rounds=3']\n"
        "sys.exit(entry())\n"
    )
    out = run_code(code)
    assert out.returncode == 0, out.stderr
    # the command's output, then what the interpreter's end saw: threshold set, objects frozen
    assert out.stdout.strip().splitlines()[-1] == "True True"


def test_an_unlearn_process_ends_without_the_teardown_but_with_its_exit_handlers():
    from scaleflu.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["unlearn", "--run", "R", "--request", "client:0"]).end_at_once
    assert not getattr(parser.parse_args(["config"]), "end_at_once", False)
    code = (
        "import atexit, sys\n"
        "from scaleflu.cli.main import end_process\n"
        "class Kept:\n"
        "    def __del__(self):\n"
        "        print('teardown', flush=True)\n"
        "kept = Kept()\n"
        "atexit.register(lambda: print('handler', flush=True))\n"
        "sys.stdout.write('buffered ')\n"
        "end_process(5)\n"
        "print('still running')\n"
    )
    out = run_code(code)
    # the exit code given, the buffered output and the handler kept, the module teardown skipped
    assert out.returncode == 5, out.stderr
    assert out.stdout.split() == ["buffered", "handler"]
    # without end_process the same program's teardown runs (what the check above relies on)
    out = run_code(code.replace("end_process(5)", "pass"))
    assert out.stdout.split() == ["buffered", "still", "running", "handler", "teardown"]


def test_the_process_is_not_ended_at_once_while_another_thread_works():
    code = (
        "import sys, threading, time\n"
        "from scaleflu.cli.main import end_process\n"
        "def work():\n"
        "    time.sleep(0.5)\n"
        "    print('thread done', flush=True)\n"
        "threading.Thread(target=work).start()\n"
        "end_process(5)\n"
        "print('went on', flush=True)\n"
    )
    out = run_code(code)
    # a normal end: it waited for the thread, and the exit status is the program's own
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["went", "on", "thread", "done"]
