"""Every flowgraph in grc/ compiles with grcc; UHD without a device fails with one clear line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
GRC_DIR = ROOT / "grc"
FLOWGRAPHS = sorted(GRC_DIR.glob("*.grc"))


def _env() -> dict[str, str]:
    # the source grc/ directory (block YAML as in the tree) plus GNU Radio's own blocks
    env = dict(os.environ, GRC_BLOCKS_PATH=str(GRC_DIR), PYTHONUNBUFFERED="1")
    env.setdefault("GR_DONT_LOAD_PREFS", "1")
    return env


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    if shutil.which("grcc") is None:
        pytest.skip("grcc not installed")
    out = tmp_path_factory.mktemp("grc")
    for fg in FLOWGRAPHS:
        r = subprocess.run(
            ["grcc", "-o", str(out), str(fg)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=60,
        )
        assert r.returncode == 0, f"{fg.name}: {r.stdout[-1500:]}{r.stderr[-1500:]}"
    return out


def test_expected_flowgraphs_present():
    names = {p.name for p in FLOWGRAPHS}
    assert {"loopback.grc", "loopback_null.grc", "edge_server_uhd.grc", "robot_uhd.grc"} <= names


def test_every_flowgraph_compiles(compiled):
    for fg in FLOWGRAPHS:
        assert (compiled / (fg.stem + ".py")).is_file(), fg.name


@pytest.mark.parametrize(
    "script,args,needle",
    [
        ("robot_uhd.py", [], 'device args "type=b200,master_clock_rate=20e6" (TX)'),
        ("robot_uhd.py", ["--tx-args", "type=b200"], 'device args "type=b200" (TX)'),
        (
            "edge_server_uhd.py",
            ["--tx-args", "type=b200,serial=NOPE"],
            'device args "type=b200,serial=NOPE" (TX)',
        ),
    ],
)
def test_uhd_flowgraph_without_radio_one_line(compiled, script, args, needle):
    r = subprocess.run(
        [sys.executable, str(compiled / script), *args],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in r.stderr
    assert lines[-1] == f"RadioNotFound: no USRP found for {needle}"


def test_loopback_flowgraph_runs_and_delivers(compiled):
    code = (
        f"import sys, time; sys.path.insert(0, {str(compiled)!r})\n"
        "from loopback import loopback\n"
        "tb = loopback(); tb.start(); end = time.time() + 20\n"
        "while tb.delivered.num_messages() < 1 and time.time() < end: time.sleep(0.05)\n"
        "n = tb.delivered.num_messages(); tb.stop(); tb.wait(); print('DELIVERED', n)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60
    )
    assert "DELIVERED 1" in r.stdout, r.stderr[-2000:]


def test_uhd_link_and_wrappers_without_radio():
    from scaleflu.linkkinds import open_link
    from scaleflu.radio.uhd import RadioNotFound, open_usrp_sink, open_usrp_source

    with pytest.raises(RadioNotFound, match=r'no USRP found for device args "type=b200" \(TX\)'):
        open_usrp_sink("type=b200")
    with pytest.raises(RadioNotFound, match=r'"type=x300,addr=10.9.9.9" \(RX\)'):
        open_usrp_source("type=x300,addr=10.9.9.9")
    with pytest.raises(RadioNotFound) as exc:
        open_link("uhd", 0, tx_args="type=b200,master_clock_rate=20e6", rx_args="type=x300")
    assert exc.value.direction == "TX" and exc.value.args[0].startswith("no USRP found")
    with pytest.raises(SystemExit) as sysexit:
        open_usrp_sink("type=b200", exit_on_missing=True)
    assert (
        str(sysexit.value.code) == 'RadioNotFound: no USRP found for device args "type=b200" (TX)'
    )


def test_linktest_launcher_uhd_one_line():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "scaleflu.linktest_cli",
            "--kind",
            "uhd",
            "--node",
            "1",
            "--tx-args",
            "type=b200",
            "--recv",
            "1",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        'RadioNotFound: no USRP found for device args "type=b200" (TX)'
    )
    assert "Traceback" not in r.stderr
