"""Shared pytest set-up: quiet GNU Radio preferences, logging that cannot leak between tests."""

import atexit
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("GR_DONT_LOAD_PREFS", "1")
# GRC in the tests loads GNU Radio's own blocks plus the block YAML a test names (GRC_BLOCKS_PATH,
# mostly the tree's grc/), never a copy of ours installed under /usr/local for GNU Radio
# Companion: GRC lets a later block path replace an earlier one's blocks.
os.environ.setdefault("GR_CONF_GRC_GLOBAL_BLOCKS_PATH", "/usr/share/gnuradio/grc/blocks")
os.environ.setdefault("SCALEFLU_LOG", "WARNING")


def _posix_shm_buffers() -> None:
    """GNU Radio's stream buffers in POSIX shared memory for this run (and its subprocesses).

    Its default on Linux, System V shared memory, is limited to ``kernel.shmmni`` segments for
    the whole machine (4096 on Debian); a pytest worker that builds hundreds of flowgraphs holds
    thousands of segments until it exits, and a second worker then fails in ``shmget: No space
    left on device``. The factory is a preference file under GR_PREFS_PATH (gr.userconf_path)."""
    if os.environ.get("GR_PREFS_PATH"):
        return
    conf = tempfile.mkdtemp(prefix="scaleflu-grprefs-")
    atexit.register(shutil.rmtree, conf, True)
    os.makedirs(os.path.join(conf, "prefs"))
    with open(os.path.join(conf, "prefs", "vmcircbuf_default_factory"), "w") as f:
        f.write("gr::vmcircbuf_mmap_shm_open_factory")
    os.environ["GR_PREFS_PATH"] = conf


_posix_shm_buffers()


def _writable_home() -> None:
    """Whoever runs the suite: a user without a writable home (``nobody``: HOME=/nonexistent)
    gets a private temporary one for this run, inherited by the subprocesses. GNU Radio's GRC
    (the Platform and grcc) writes its block cache to ~/.cache and fails without it."""
    home = os.path.expanduser("~")
    if os.path.isdir(home) and os.access(home, os.W_OK):
        return
    tmp = tempfile.mkdtemp(prefix="scaleflu-home-")
    atexit.register(shutil.rmtree, tmp, True)
    os.environ["HOME"] = tmp


_writable_home()


def _forced_torch_threads() -> None:
    """``SCALEFLU_TEST_TORCH_THREADS=N``: run the suite with torch at N intra-op threads.

    Learning outcomes must hold whatever thread count a machine gives torch (the reductions'
    order, hence the floats, follow it). The code sets torch's threads from ``fl.threads`` (the
    tests mostly 1); with this variable every ``torch.set_num_threads`` in the test processes
    sets N instead, and subprocesses start with ``OMP_NUM_THREADS=N`` (torch's default count).
    Used with ``ATEN_CPU_CAPABILITY`` to check the suite on other kernels (README, "Tests")."""
    n = os.environ.get("SCALEFLU_TEST_TORCH_THREADS")
    if not n:
        return
    if not n.isdigit() or int(n) < 1:
        raise pytest.UsageError(f"SCALEFLU_TEST_TORCH_THREADS={n!r}: a thread count >= 1")
    import torch

    os.environ["OMP_NUM_THREADS"] = n
    set_threads = torch.set_num_threads
    set_threads(int(n))
    torch.set_num_threads = lambda _count: set_threads(int(n))


_forced_torch_threads()


@pytest.fixture(autouse=True)
def _restore_root_logging():
    """Put the root logger back after each test.

    Commands under test call ``setup_logging`` (``basicConfig(force=True)``), which binds a
    handler to that test's captured stderr; left in place, later tests would log into a
    closed stream.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``build_once(name, build)``: a folder filled by ``build(folder)`` once for the whole run.

    Under pytest-xdist every worker asks for the same folder in the run's common base temp; the
    first builds it while the others wait on a lock (a trained run is then trained once, not
    once per worker). A build that fails leaves no folder behind: the next ask builds again.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent

    def get(name: str, build: Callable[[Path], object]) -> Path:
        target = root / name
        with open(root / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / ".built").is_file():
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True)
                try:
                    build(target)
                except BaseException:
                    shutil.rmtree(target, ignore_errors=True)
                    raise
                (target / ".built").touch()
        return target

    return get


def _timeout_scale() -> float:
    """``SCALEFLU_TEST_TIMEOUT_SCALE=F`` multiplies every test's timeout (pytest-timeout's).

    Default: 4 when torch's kernels are forced to ``ATEN_CPU_CAPABILITY=default`` (no SIMD:
    the convolutional models' training fixtures take several times longer; one took over 600 s
    there, 2 threads on 2 busy cores), else 1."""
    raw = os.environ.get("SCALEFLU_TEST_TIMEOUT_SCALE")
    if raw is None:
        return 4.0 if os.environ.get("ATEN_CPU_CAPABILITY") == "default" else 1.0
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value >= 1.0:
        raise pytest.UsageError(f"SCALEFLU_TEST_TIMEOUT_SCALE={raw!r}: a factor >= 1")
    return value


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Two cores, one suite: what pytest-xdist (``-n auto --dist loadgroup``) needs to know.

    ``tryfirst``: pytest-xdist's worker turns the ``xdist_group`` marks into node-id suffixes in
    its own hook of this name, which must see the marks added here. The suffix is written where
    pytest 8 reads the node id, not pytest 9.2 (pyproject pins pytest below 9): there every test
    was scheduled alone and a module's fixture built again on each worker that ran one of its
    tests (tests/test_suite_grouping.py checks the suffix).

    A test that uses a module- or class-scoped fixture runs on the same worker as the other
    tests of its module (``xdist_group``), so that fixture (a trained run, a testbed run) is
    built once, not once per worker. The ``slow`` tests start first, so the workers do not end
    with one of them alone.
    """
    scale = _timeout_scale()
    default_timeout = float(config.getini("timeout") or 0)
    for item in items:
        if scale != 1.0:
            mark = item.get_closest_marker("timeout")
            base = float(mark.args[0] if mark and mark.args else default_timeout)
            if base > 0:
                item.add_marker(pytest.mark.timeout(base * scale), append=False)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs if info is not None else {}
        if any(d and d[-1].scope in ("module", "class") for d in defs.values()):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda it: it.get_closest_marker("slow") is None)
