"""Real disk faults end the edge server app with one line and the documented status 3.

The faults are made by the operating system, not simulated: a file-size limit (the run folder
"full": ``RLIMIT_FSIZE``, writes beyond it fail with EFBIG) and a read-only history folder (as
root, the server runs as ``nobody`` so that the permissions hold). The history's tensor files
are written by safetensors, whose writer reports such a fault as its own exception type: before,
that ended the server with status 1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from scaleflu.testbed.keys import KeyStore

pytestmark = pytest.mark.timeout(300)

OVERRIDES = [
    "data.num_clients=2",
    "fl.clients_per_round=2",
    "data.train_subset=400",
    "data.test_subset=100",
    "testbed.register_timeout_s=5",
    "testbed.unlearn.wait_s=0",
]

# the edge server app on an in-process link, with the fault the first argument names
DRIVER = textwrap.dedent(
    """
    import os, resource, signal, sys
    from scaleflu.cli import testbed as cli
    from scaleflu.link import MemoryChannel

    fault, run, keys, *sets = sys.argv[1:]
    channel = MemoryChannel()
    cli.build_link = lambda *a, **k: channel.attach(0)
    if fault == "full":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
    elif fault == "nobody":
        os.setgid(65534)
        os.setuid(65534)
    argv = ["--keys", keys, "--run-dir", run, "--link", "frames", "--no-plots", "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    sys.exit(cli.server_main(argv))
    """
)


def _server(fault: str, run: Path, keys: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, fault, str(run), str(keys), *OVERRIDES],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _one_line_rc3(proc: subprocess.CompletedProcess[str]) -> str:
    out = proc.stdout + proc.stderr
    errors = [ln for ln in out.splitlines() if " ERROR " in ln]
    assert proc.returncode == 3, out[-3000:]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert "same --run-dir" in errors[0]
    return errors[0]


@pytest.fixture
def world_readable_dir():
    """A folder another user can reach (pytest's tmp_path lives under a 0700 folder)."""
    d = Path(tempfile.mkdtemp(prefix="scaleflu-disk-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_full_run_folder_ends_the_server_with_status_3(tmp_path):
    keys = KeyStore.create([1, 2]).save(tmp_path / "keys.json")
    line = _one_line_rc3(_server("full", tmp_path / "run", keys))
    assert "File too large" in line


def test_a_read_only_history_folder_ends_the_server_with_status_3(world_readable_dir):
    from scaleflu.config import load_config
    from scaleflu.link import MemoryChannel
    from scaleflu.testbed.server import EdgeServer

    base = world_readable_dir
    store = KeyStore.create([1, 2])
    keys = store.save(base / "keys.json")
    run = base / "run"
    with MemoryChannel() as ch:  # the run folder as a first start leaves it: Theta[1] stored
        server = EdgeServer(
            ch.attach(0), store.robots, load_config(None, OVERRIDES), run, False,
            signing_key=store.signing_key,
        )  # fmt: skip
        server.history.close()
    fault = "plain"
    if os.geteuid() == 0:  # root writes anywhere: the server runs as nobody instead
        fault = "nobody"
        for p in (keys, run, *run.rglob("*")):
            os.chown(p, 65534, 65534)
    (run / "history").chmod(0o555)
    try:
        line = _one_line_rc3(_server(fault, run, keys))
    finally:
        (run / "history").chmod(0o755)
    assert "Permission denied" in line
