"""The coded OFDM loopback flowgraphs: both compile with grcc; the headless one delivers and
adapts its MCS; the QT one has the constellation, the SNR readout and the frame error counter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gnuradio, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
GRC_DIR = ROOT / "grc"


def _env() -> dict[str, str]:
    env = dict(os.environ, GRC_BLOCKS_PATH=str(GRC_DIR), PYTHONUNBUFFERED="1")
    env.setdefault("GR_DONT_LOAD_PREFS", "1")
    return env


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    pytest.importorskip("gnuradio.scaleflu")
    if shutil.which("grcc") is None:
        pytest.skip("grcc not installed")
    out = tmp_path_factory.mktemp("grc_coded")
    for name in ("loopback_coded.grc", "loopback_coded_qt.grc"):
        r = subprocess.run(
            ["grcc", "-o", str(out), str(GRC_DIR / name)],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert r.returncode == 0, f"{name}: {r.stdout[-1500:]}{r.stderr[-1500:]}"
    return out


def test_headless_coded_loopback_delivers_and_adapts(compiled):
    code = (
        f"import sys, time; sys.path.insert(0, {str(compiled)!r})\n"
        "from loopback_coded import loopback_coded\n"
        "tb = loopback_coded(); tb.start(); end = time.time() + 40\n"
        "while tb.delivered.num_messages() < 2 and time.time() < end: time.sleep(0.05)\n"
        "n = tb.delivered.num_messages(); per = tb.tx_0.frames_per_mcs()\n"
        "snr = tb.rx_1.counters()['last_snr_db']; tb.stop(); tb.wait()\n"
        "print('DELIVERED', n); print('MCS', per); print('SNR', snr)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=90
    )
    assert "DELIVERED 2" in r.stdout, r.stdout[-1000:] + r.stderr[-2000:]
    per = eval(r.stdout.split("MCS ", 1)[1].splitlines()[0])  # noqa: S307 - our own output
    assert per["bpsk-1/2"] > 0  # it starts robust ...
    assert sum(v for k, v in per.items() if k != "bpsk-1/2") > per["bpsk-1/2"]  # ... and climbs
    snr = float(r.stdout.split("SNR ", 1)[1].splitlines()[0])
    assert 10 < snr < 14  # the flowgraph's 12 dB


def test_qt_coded_loopback_has_constellation_snr_and_error_counter(compiled):
    code = (compiled / "loopback_coded_qt.py").read_text()
    assert "qtgui.const_sink_c(" in code
    assert "scaleflu.coded_ofdm_rx(" in code and "symbols_out=480" in code
    assert "self.rx_1.counters()" in code and "self.tx_0.frames_per_mcs()" in code
    assert "last_snr_db" in code and "payload_crc" in code
    assert "msg_connect((self.rx_1, 'report'), (self.tx_0, 'feedback'))" in code
    for label in ("snr", "ok", "fer", "mcs"):
        assert f"self._lbl_{label}_label = Qt.QLabel" in code, label
