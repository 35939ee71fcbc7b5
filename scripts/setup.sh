#!/usr/bin/env bash
# Set up gr-scaleflu on Debian 12: apt packages, the virtual environment, the Python
# package and the C++ module, built once: installed the GNU Radio way under /usr/local (for
# GNU Radio Companion's /usr/bin/python3 and the venv alike) when set-up can write there,
# else into the virtual environment.
# Idempotent: a second run checks, finds everything in place, and changes nothing.
#
#   scripts/setup.sh              set up (apt packages and /usr/local: as root or with sudo)
#   SCALEFLU_VENV=/path ...       use another virtual environment location
#   SCALEFLU_BUILD=/path ...      use another build folder
#   SCALEFLU_SYSTEM_INSTALL=no    install the module into the venv only, leave /usr/local alone
#                                 (GRC's Run button then needs the venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCALEFLU_VENV:-$ROOT/.venv}"
BUILD="${SCALEFLU_BUILD:-$ROOT/build}"
SYS_PREFIX=/usr/local   # where GNU Radio Companion's interpreter finds the module (see below)
STAMPS="$VENV/.scaleflu-stamps"
JOBS="$(nproc 2>/dev/null || echo 2)"

say() { printf '[setup] %s\n' "$*"; }

# ---------------------------------------------------------------------------- apt
# python3-numpy, -zmq, -yaml: what our Python blocks import when GNU Radio Companion runs a
# flowgraph with the system interpreter (GNU Radio depends on them; listed because we rely on them).
APT_PACKAGES=(
  gnuradio gnuradio-dev python3-uhd uhd-host libuhd-dev pybind11-dev
  cmake g++ make pkg-config git libboost-test-dev libzmq3-dev
  python3-venv python3-dev dataset-fashion-mnist
  python3-numpy python3-zmq python3-yaml
  iproute2
)
# GNU Radio Companion's window: GTK 3's introspection data (with Pango, PangoCairo, GdkPixbuf).
# Debian's gnuradio does not depend on it; without it gnuradio-companion stops at start with
# "Failed to initialize GTK ... (Namespace Gtk not available)". Not needed to build or test.
APT_GUI_PACKAGES=(gir1.2-gtk-3.0)

not_installed() {
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      printf '%s\n' "$p"
    fi
  done
}
# SUDO: how this user runs a command as root ("" for root, "sudo -n" with password-less sudo);
# unset when it cannot.
if [[ $EUID -eq 0 ]]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else unset SUDO; fi

mapfile -t missing < <(not_installed "${APT_PACKAGES[@]}")
mapfile -t missing_gui < <(not_installed "${APT_GUI_PACKAGES[@]}")
if ((${#missing[@]})) && [[ -z "${SUDO+set}" ]]; then
  echo "[setup] missing Debian packages: ${missing[*]}" >&2
  echo "[setup] install them with:" >&2
  all=("${missing[@]}" "${missing_gui[@]}")
  echo "    sudo apt-get update && sudo apt-get install -y ${all[*]}" >&2
  echo "[setup] then run this again." >&2
  exit 1
fi
if ((${#missing_gui[@]})) && [[ -z "${SUDO+set}" ]]; then
  echo "[setup] gnuradio-companion's window needs: sudo apt-get install -y ${missing_gui[*]}" >&2
  missing_gui=()
fi
if ((${#missing[@]} + ${#missing_gui[@]})); then
  all=("${missing[@]}" "${missing_gui[@]}")
  say "installing Debian packages: ${all[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" "${missing_gui[@]}" >/dev/null
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
# Built once. GRC's Run button runs a flowgraph with GNU Radio's own interpreter,
# /usr/bin/python3, which does not see the venv; nor does grcc see the venv's block YAML unless
# the venv is activated. So when set-up can write /usr/local (root, or password-less sudo) the
# module is installed the GNU Radio way there: libgnuradio-scaleflu in /usr/local/lib/<arch>,
# `gnuradio.scaleflu` and gr-scaleflu.pth (this checkout's python/, for the Python blocks) in
# /usr/local/lib/python3.X/dist-packages, the block YAML in /usr/local/share/gnuradio/grc/blocks
# (on Debian's GRC block path). The venv (made with --system-site-packages) uses that install;
# a copy of the module installed into the venv earlier is removed, so it cannot shadow it.
# Otherwise the module is installed into the venv and set-up says how GRC gets it.
# What happened is recorded in $STAMPS/system-install for the tests.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
record_system() {
  [[ "$(cat "$STAMPS/system-install" 2>/dev/null)" == "$1" ]] ||
    printf '%s\n' "$1" >"$STAMPS/system-install"
}
# /usr/local's dist-packages as /usr/bin/python3 names it (GNU Radio's GrPython does the same)
SYS_SITE="$(/usr/bin/python3 - "$SYS_PREFIX" <<'PYSITE'
import site, sys
hits = [p for p in site.getsitepackages() if p.startswith(sys.argv[1] + "/")]
print(hits[0] if len(hits) == 1 else "")
PYSITE
)"
venv_sees() { "$PY" -c 'import sys; sys.exit(sys.argv[1] not in sys.path)' "$1"; }
system_why=""
if [[ "${SCALEFLU_SYSTEM_INSTALL:-yes}" == no ]]; then
  system_why="SCALEFLU_SYSTEM_INSTALL=no"
elif [[ -z "${SUDO+set}" ]]; then
  system_why="$(id -un) cannot write $SYS_PREFIX (no root, no password-less sudo)"
elif [[ -z "$SYS_SITE" ]] || ! venv_sees "$SYS_SITE"; then
  system_why="the venv does not see ${SYS_SITE:-the dist-packages of $SYS_PREFIX} (not made with --system-site-packages)"
fi
if [[ -z "$system_why" ]]; then
  PREFIX="$SYS_PREFIX" PYDIR="$SYS_SITE" PTH=ON INSTALL=($SUDO cmake --install)
else
  PREFIX="$VENV" PYDIR="$SITE" PTH=OFF INSTALL=(cmake --install)  # the editable install has python/
fi

# An install made before with the other prefix: removed (a venv copy would shadow /usr/local's;
# /usr/local's own stays for GRC: `sudo make uninstall` removes it).
if [[ -f "$BUILD/CMakeCache.txt" ]] && ! grep -q "^CMAKE_INSTALL_PREFIX:PATH=$PREFIX\$" "$BUILD/CMakeCache.txt"; then
  if [[ "$PREFIX" != "$VENV" && -f "$BUILD/install_manifest.txt" ]]; then
    say "removing the module's earlier install from $VENV (it would shadow $PREFIX's)"
    grep "^$VENV/" "$BUILD/install_manifest.txt" | while IFS= read -r f; do rm -f -- "$f"; done
  fi
  rm -rf "$BUILD"
fi
if [[ "$PREFIX" != "$VENV" && -e "$SITE/gnuradio/scaleflu" ]]; then
  rm -rf "$SITE/gnuradio/scaleflu" "$VENV"/lib/*/libgnuradio-scaleflu.so* \
    "$VENV"/share/gnuradio/grc/blocks/scaleflu_*.block.yml
fi
if [[ ! -f "$BUILD/CMakeCache.txt" ]] || ! grep -q "^GR_PYTHON_DIR:[A-Z]*=$PYDIR\$" "$BUILD/CMakeCache.txt" ||
  ! grep -q "^SCALEFLU_INSTALL_PTH:BOOL=$PTH\$" "$BUILD/CMakeCache.txt"; then
  say "configuring the C++ module (install prefix $PREFIX)"
  rm -rf "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSCALEFLU_INSTALL_PTH="$PTH" \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DPYTHON_EXECUTABLE="$PY" -DGR_PYTHON_DIR="$PYDIR" >/dev/null
fi
if ! cmake --build "$BUILD" -j "$JOBS" >"$BUILD/build.log" 2>&1; then
  tail -n 40 "$BUILD/build.log" >&2
  echo "[setup] C++ build failed (full log: $BUILD/build.log)" >&2
  exit 1
fi
if ! "${INSTALL[@]}" "$BUILD" >"$BUILD/install.log" 2>&1; then
  tail -n 20 "$BUILD/install.log" >&2
  echo "[setup] C++ install into $PREFIX failed (full log: $BUILD/install.log)" >&2
  exit 1
fi
if grep "Installing:" "$BUILD/install.log" | sed 's/^-- /[setup] /' && [[ "$PREFIX" != "$VENV" ]]; then
  $SUDO /sbin/ldconfig
fi

# ---------------------------------------------- environment for GRC and the apps
# Sourcing .venv/bin/activate also tells GRC where the venv's block YAML lives, unless the
# blocks are installed for GRC under /usr/local (below): GRC lets that copy replace the venv's
# and warns about every block. An earlier version of this snippet is replaced.
"$PY" - "$VENV" "$SYS_PREFIX" <<'PYACT'
import re, sys
venv, sys_prefix = sys.argv[1:]
path = f"{venv}/bin/activate"
snippet = f"""# scaleflu-env begin: GRC finds the gr-scaleflu blocks, the loader finds libgnuradio-scaleflu
if [ ! -e {sys_prefix}/share/gnuradio/grc/blocks/scaleflu_link_arq.block.yml ]; then
  export GRC_BLOCKS_PATH="{venv}/share/gnuradio/grc/blocks${{GRC_BLOCKS_PATH:+:$GRC_BLOCKS_PATH}}"
fi
export LD_LIBRARY_PATH="{venv}/lib/x86_64-linux-gnu${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
# scaleflu-env end
"""
with open(path, encoding="utf-8") as f:
    text = f.read()
new = re.sub(r"# scaleflu-env begin.*?# scaleflu-env end\n", "", text, flags=re.S)
new = re.sub(r"# scaleflu-env:.*\n(export .*\n){2}", "", new) + snippet
if new != text:
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
PYACT

"$PY" - <<'PYCHECK'
import os
import numpy, torch
from gnuradio import gr, scaleflu  # noqa: F401
assert numpy.__version__.startswith("1."), numpy.__version__
print(f"[setup] ok: GNU Radio {gr.version()}, numpy {numpy.__version__}, torch {torch.__version__}, "
      f"gnuradio.scaleflu from {os.path.dirname(scaleflu.__file__)}")
PYCHECK

# ------------------------------------------------ GNU Radio Companion's interpreter
install_cmd="sudo make install"
[[ "$BUILD" == "$ROOT/build" ]] || install_cmd="sudo make -C $ROOT install BUILD=$BUILD"
if [[ -n "$system_why" ]]; then
  record_system "skipped: $system_why"
  echo "[setup] GNU Radio Companion runs flowgraphs with /usr/bin/python3, which cannot see $VENV ($system_why);" >&2
  echo "[setup]   install gr-scaleflu for it under $SYS_PREFIX (the GNU Radio way):  $install_cmd" >&2
  echo "[setup]   or start GRC from the venv:  source $VENV/bin/activate && python -m gnuradio.grc" >&2
else
  # What GRC sees: the system interpreter with nothing of the venv, GNU Radio's preferences.
  if ! env -i PATH=/usr/bin:/bin HOME="${HOME:-/}" /usr/bin/python3 - "$SYS_PREFIX" <<'SYSCHECK'
import os, sys
from gnuradio import gr, scaleflu
from gnuradio.grc.core.Config import Config
from gnuradio.scaleflu import frame_builder, link_arq  # a C++ and a Python block
import scaleflu as pkg
yaml_dir = os.path.join(sys.argv[1], "share", "gnuradio", "grc", "blocks")
print(f"[setup] ok: /usr/bin/python3 imports gnuradio.scaleflu ({os.path.dirname(scaleflu.__file__)})"
      f" and scaleflu ({os.path.dirname(pkg.__file__)})")
if yaml_dir in Config(gr.version(), prefs=gr.prefs()).block_paths:
    print(f"[setup] ok: GNU Radio Companion loads our blocks from {yaml_dir}")
else:
    print(f"[setup] GNU Radio Companion's block path lacks {yaml_dir}: add it to "
          "local_blocks_path in the [grc] section of ~/.gnuradio/config.conf", file=sys.stderr)
SYSCHECK
  then
    echo "[setup] /usr/bin/python3 cannot import what was installed into $SYS_PREFIX (above)" >&2
    exit 1
  fi
  record_system "installed: $SYS_PREFIX"
fi
