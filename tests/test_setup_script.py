"""scripts/setup.sh run by a user who cannot install packages names them and stops."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root")
def test_unprivileged_user_is_told_what_to_install():
    # pytest's tmp_path is private to root; the unprivileged user needs to read this one.
    tmp_path = Path(tempfile.mkdtemp(prefix="scaleflu-setup-"))
    fake = tmp_path / "bin"
    fake.mkdir()
    # A dpkg-query that reports two packages missing and the rest installed.
    (fake / "dpkg-query").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do last="$a"; done\n'
        'case "$last" in dataset-fashion-mnist|uhd-host) echo "unknown ok not-installed";;\n'
        '  *) echo "install ok installed";; esac\n'
    )
    (fake / "dpkg-query").chmod(0o755)
    tmp_path.chmod(0o755)
    venv = tmp_path / "venv-that-must-not-appear"
    env = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "SCALEFLU_VENV": str(venv),
        "HOME": str(tmp_path),
    }
    out = subprocess.run(
        [shutil.which("runuser"), "-u", "nobody", "--", "bash", str(ROOT / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "missing Debian packages: uhd-host dataset-fashion-mnist" in out.stderr
    assert "apt-get install -y uhd-host dataset-fashion-mnist" in out.stderr
    assert not venv.exists()
    shutil.rmtree(tmp_path)
