"""scripts/setup.sh run by a user who cannot install packages names them and stops."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _world_enterable(path: Path) -> bool:
    """Whether every folder from / down to ``path`` lets other users through (o+x)."""
    path = path.resolve()
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def _shared_tmp() -> Path:
    """A temporary folder another user can enter, wherever the checkout or $TMPDIR lie."""
    for base in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        if Path(base).is_dir() and _world_enterable(Path(base)):
            return Path(tempfile.mkdtemp(prefix="scaleflu-setup-", dir=base))
    pytest.skip("no temporary folder that other users can enter")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root")
def test_unprivileged_user_is_told_what_to_install():
    # pytest's tmp_path, $TMPDIR and the checkout itself (a 0700 home, a mktemp -d folder) may
    # be private to root: the unprivileged user runs a copy of the script from a folder it can
    # enter. The script stops at the package check, before it looks at anything else in ROOT.
    tmp_path = _shared_tmp()
    script = tmp_path / "scripts" / "setup.sh"
    script.parent.mkdir()
    shutil.copy2(ROOT / "scripts" / "setup.sh", script)
    script.parent.chmod(0o755)
    script.chmod(0o755)
    fake = tmp_path / "bin"
    fake.mkdir()
    # A dpkg-query that reports two packages missing, GNU Radio Companion's GTK introspection
    # data too, and the rest installed.
    (fake / "dpkg-query").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do last="$a"; done\n'
        'case "$last" in dataset-fashion-mnist|uhd-host|gir1.2-gtk-3.0)\n'
        '  echo "unknown ok not-installed";;\n'
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
        [shutil.which("runuser"), "-u", "nobody", "--", "bash", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "missing Debian packages: uhd-host dataset-fashion-mnist\n" in out.stderr
    assert "apt-get install -y uhd-host dataset-fashion-mnist gir1.2-gtk-3.0\n" in out.stderr
    assert not venv.exists()
    assert not (tmp_path / "build").exists()
    shutil.rmtree(tmp_path)
