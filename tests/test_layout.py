"""Package layout rules: ML code imports without GNU Radio; GRC accepts our block YAML."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK_GNURADIO = """
import importlib.abc, sys
class NoGnuRadio(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "gnuradio" or name.startswith("gnuradio.") or name in ("pmt", "uhd"):
            raise ImportError("GNU Radio is blocked in this test")
sys.meta_path.insert(0, NoGnuRadio())
"""


@pytest.mark.parametrize(
    "module",
    [
        "scaleflu",
        "scaleflu.config",
        "scaleflu.cli",
        "scaleflu.fl",
        "scaleflu.unlearn",
        "scaleflu.link",
    ],
)
def test_ml_and_link_code_imports_without_gnuradio(module):
    code = BLOCK_GNURADIO + f"import {module}\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_cli_help_works_without_gnuradio():
    code = BLOCK_GNURADIO + "from scaleflu.cli import main\nraise SystemExit(main(['--help']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "COMMAND" in out.stdout


def test_grc_loads_our_block_definitions():
    pytest.importorskip("gnuradio.grc")
    from gnuradio.grc.core.platform import Platform

    blocks_dir = ROOT / "grc"
    from gnuradio import gr

    platform = Platform(
        name="test",
        prefs=gr.prefs(),
        version=gr.version(),
        version_parts=(gr.major_version(), gr.api_version(), gr.minor_version()),
    )
    platform.build_library([*platform.config.block_paths, str(blocks_dir)])
    ids = {k for k in platform.blocks if k.startswith("scaleflu_")}
    expected = {p.name.removesuffix(".block.yml") for p in blocks_dir.glob("*.block.yml")}
    assert expected <= ids, f"GRC rejected: {sorted(expected - ids)}"
    for key in expected:
        cat = platform.blocks[key].category
        assert cat[0] == "scaleflu" and cat[1:] in (["Framing"], ["Link"], ["Radio"]), key


def test_grc_yaml_is_installed_where_grc_looks():
    """Set-up installed the module once: under /usr/local (GRC's own block path) when it could
    write there, else into the venv (GRC_BLOCKS_PATH, set by `make` and the venv's activate)."""
    env_path = os.environ.get("GRC_BLOCKS_PATH", "")
    stamp = Path(sys.prefix) / ".scaleflu-stamps" / "system-install"
    how = stamp.read_text().strip() if stamp.is_file() else ""
    prefix = Path(how.removeprefix("installed: ")) if how.startswith("installed: ") else None
    installed = Path(prefix or sys.prefix) / "share" / "gnuradio" / "grc" / "blocks"
    assert (installed / "scaleflu_frame_builder.block.yml").is_file(), (how, installed)
    if prefix is None:
        assert str(installed) in env_path.split(":") or not env_path, env_path
    else:  # one copy of our YAML on GRC's path: the venv's, if any, is not added to it
        venv_yaml = Path(sys.prefix) / "share" / "gnuradio" / "grc" / "blocks"
        assert not (venv_yaml / "scaleflu_frame_builder.block.yml").is_file()
        assert str(venv_yaml) not in env_path.split(":"), env_path
