#!/usr/bin/env bash
# Set up gr-scaleflu on Debian 12: apt packages, the virtual environment, the Python
# package and the C++ module (built and installed into the virtual environment).
# Idempotent: a second run checks, finds everything in place, and changes nothing.
#
#   scripts/setup.sh            set up (installs apt packages when run as root or with sudo)
#   SCALEFLU_VENV=/path ...     use another virtual environment location
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCALEFLU_VENV:-$ROOT/.venv}"
BUILD="${SCALEFLU_BUILD:-$ROOT/build}"
STAMPS="$VENV/.scaleflu-stamps"
JOBS="$(nproc 2>/dev/null || echo 2)"

say() { printf '[setup] %s\n' "$*"; }

# ---------------------------------------------------------------------------- apt
APT_PACKAGES=(
  gnuradio gnuradio-dev python3-uhd uhd-host libuhd-dev pybind11-dev
  cmake g++ make pkg-config git libboost-test-dev libzmq3-dev
  python3-venv python3-dev dataset-fashion-mnist
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $EUID -eq 0 ]]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    echo "[setup] missing Debian packages: ${missing[*]}" >&2
    echo "[setup] install them with:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    echo "[setup] then run this again." >&2
    exit 1
  fi
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# --------------------------------------------------------------------- virtualenv
# GNU Radio's and UHD's Python bindings exist only for Debian's /usr/bin/python3,
# hence --system-site-packages; numpy stays below 2 for them (pyproject pins it).
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating virtual environment $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
mkdir -p "$STAMPS"
PY="$VENV/bin/python"

pip_hash="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
if [[ ! -f "$STAMPS/pip-$pip_hash" ]]; then
  say "installing Python dependencies (torch==2.13.0 CPU, numpy<2, ...)"
  "$PY" -m pip install -q --upgrade pip
  # The package is installed editable: python/scaleflu is what runs.
  "$PY" -m pip install -q -e "$ROOT[test]"
  rm -f "$STAMPS"/pip-*
  touch "$STAMPS/pip-$pip_hash"
fi

# ------------------------------------------------------------------ C++ module
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -f "$BUILD/CMakeCache.txt" ]] || ! grep -q "CMAKE_INSTALL_PREFIX:PATH=$VENV\$" "$BUILD/CMakeCache.txt"; then
  say "configuring the C++ module (install prefix $VENV)"
  rm -rf "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$VENV" -DPYTHON_EXECUTABLE="$PY" -DGR_PYTHON_DIR="$SITE" >/dev/null
fi
if ! cmake --build "$BUILD" -j "$JOBS" >"$BUILD/build.log" 2>&1; then
  tail -n 40 "$BUILD/build.log" >&2
  echo "[setup] C++ build failed (full log: $BUILD/build.log)" >&2
  exit 1
fi
if ! cmake --install "$BUILD" >"$BUILD/install.log" 2>&1; then
  tail -n 20 "$BUILD/install.log" >&2
  echo "[setup] C++ install failed (full log: $BUILD/install.log)" >&2
  exit 1
fi
grep "Installing:" "$BUILD/install.log" | sed 's/^-- /[setup] /' || true

# ---------------------------------------------- environment for GRC and the apps
# Sourcing .venv/bin/activate also tells GRC where our block YAML lives.
if ! grep -q "scaleflu-env" "$VENV/bin/activate"; then
  cat >>"$VENV/bin/activate" <<ACT
# scaleflu-env: GRC finds the gr-scaleflu blocks, the loader finds libgnuradio-scaleflu
export GRC_BLOCKS_PATH="$VENV/share/gnuradio/grc/blocks\${GRC_BLOCKS_PATH:+:\$GRC_BLOCKS_PATH}"
export LD_LIBRARY_PATH="$VENV/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
ACT
fi

"$PY" - <<'PYCHECK'
import numpy, torch
from gnuradio import gr, scaleflu  # noqa: F401
assert numpy.__version__.startswith("1."), numpy.__version__
print(f"[setup] ok: GNU Radio {gr.version()}, numpy {numpy.__version__}, torch {torch.__version__}")
PYCHECK
