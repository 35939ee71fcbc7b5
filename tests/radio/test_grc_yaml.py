"""GRC block definitions: sub-categories, the right namespace, USRP throttle flag and callbacks,
no reference to blocks that do not exist, no swallowed import error, quiet start-up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRC_DIR = ROOT / "grc"
BLOCKS = sorted(GRC_DIR.glob("*.block.yml"))
SUBCATEGORIES = {"[scaleflu]/Framing", "[scaleflu]/Link", "[scaleflu]/Radio"}


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_block_sits_in_a_subcategory():
    cats = {p.name: _load(p)["category"] for p in BLOCKS}
    assert len(cats) >= 9
    assert set(cats.values()) == SUBCATEGORIES, cats


def test_blocks_import_from_the_gnuradio_namespace():
    for p in BLOCKS:
        imports = _load(p)["templates"]["imports"]
        lines = [ln.strip() for ln in imports.splitlines() if ln.strip()]
        assert "from gnuradio import scaleflu" in lines, p.name
        assert not any("scaleflu.radio" in ln for ln in lines), p.name
        assert _load(p)["templates"]["make"].startswith("scaleflu."), p.name


def test_documentation_names_only_blocks_that_exist():
    labels = {_load(p)["label"] for p in BLOCKS}
    for p in BLOCKS:
        doc = _load(p).get("documentation", "")
        assert "Fragmenter" not in doc, p.name
    builder = _load(GRC_DIR / "scaleflu_frame_builder.block.yml")["documentation"]
    assert "Link ARQ block" in builder and "Link ARQ" in labels


@pytest.mark.parametrize("name,port", [("usrp_rx", "source"), ("usrp_tx", "sink")])
def test_usrp_blocks_throttle_and_runtime_callbacks(name, port):
    d = _load(GRC_DIR / f"scaleflu_{name}.block.yml")
    assert "throttle" in d["flags"]
    cbs = d["templates"]["callbacks"]
    assert f"{port}.set_gain(${{gain}}, 0)" in cbs
    assert any(cb.startswith(f"{port}.set_center_freq(") and "${freq}" in cb for cb in cbs)


def _gr_env() -> dict[str, str]:
    env = dict(os.environ, GRC_BLOCKS_PATH=str(GRC_DIR), PYTHONUNBUFFERED="1")
    env.setdefault("GR_DONT_LOAD_PREFS", "1")
    return env


@pytest.fixture(scope="module")
def grcc(tmp_path_factory):
    pytest.importorskip("gnuradio.scaleflu")
    if shutil.which("grcc") is None:
        pytest.skip("grcc not installed")
    out = tmp_path_factory.mktemp("grc14")

    def compile_(name: str) -> Path:
        r = subprocess.run(
            ["grcc", "-o", str(out), str(GRC_DIR / name)],
            capture_output=True,
            text=True,
            env=_gr_env(),
            timeout=120,
        )
        assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
        return out / (Path(name).stem + ".py")

    return compile_


@pytest.mark.gnuradio
def test_usrp_callbacks_reach_the_device_in_generated_code(grcc):
    code = grcc("robot_uhd.grc").read_text()
    assert "from gnuradio import scaleflu" in code
    assert "scaleflu.usrp_tx(" in code and "scaleflu_uhd" not in code
    assert ".sink.set_gain(self.tx_gain, 0)" in code
    assert ".source.set_gain(self.rx_gain, 0)" in code
    assert ".set_center_freq(uhd.tune_request(self.freq" in code


@pytest.mark.gnuradio
@pytest.mark.timeout(180)
def test_loopback_starts_quietly(grcc):
    script = grcc("loopback.grc")
    r = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=_gr_env(),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "set_min_output_buffer" not in out
    assert "Traceback" not in out


def test_gr_namespace_fails_loudly_without_the_python_package(tmp_path):
    """Load bindings/gr_namespace/__init__.py as a package whose pure-Python half is missing."""
    pkg = tmp_path / "fakegr"
    pkg.mkdir()
    src = ROOT / "python" / "scaleflu" / "bindings" / "gr_namespace" / "__init__.py"
    (pkg / "__init__.py").write_text(src.read_text())
    (pkg / "scaleflu_python.py").write_text("frame_builder = object\n")
    code = textwrap.dedent(
        """
        import sys
        sys.modules["scaleflu.radio.blocks"] = None  # the pure package is not importable
        try:
            import fakegr
        except ImportError as exc:
            print("IMPORTERROR", exc)
        else:
            print("IMPORTED", sorted(n for n in dir(fakegr) if not n.startswith("_")))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("IMPORTERROR"), r.stdout
    assert "pure-Python scaleflu package" in r.stdout


@pytest.mark.gnuradio
def test_qt_loopback_compiles_with_constellation_spectrum_and_counters(grcc):
    code = grcc("loopback_qt.grc").read_text()
    assert "qtgui.const_sink_c(" in code
    assert "qtgui.freq_sink_c(" in code
    assert "symbols_out=True" in code
    for probe in ("rx_1.frames_ok()", "rx_1.crc_errors()", "arq_0.stats()", "arq_1.stats()"):
        assert probe in code, probe
    for label in ("rx1_ok", "rx1_crc", "rx1_hdr", "rx0_ok", "arq0", "arq1"):
        assert f"self._lbl_{label}_label = Qt.QLabel" in code, label


@pytest.mark.gnuradio
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_qt_loopback_runs_offscreen_and_counts_frames(grcc, tmp_path):
    pytest.importorskip("PyQt5")
    script = grcc("loopback_qt.grc")
    shot = tmp_path / "shot.png"
    env = dict(_gr_env(), QT_QPA_PLATFORM="offscreen")
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "grc_screenshot.py"), str(script), str(shot), "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=200,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ok = [ln for ln in r.stdout.splitlines() if ln.startswith("rx_1.frames_ok()")]
    assert ok and int(ok[0].rsplit("=", 1)[1]) > 0, r.stdout
    assert "flowgraph stopped" in r.stdout, r.stdout
