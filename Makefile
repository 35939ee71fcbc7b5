# gr-scaleflu: the two front-door commands are `make demo` and `make test`.
# Both run scripts/setup.sh first (idempotent: quick when everything is in place).
VENV   ?= .venv
PY     := $(VENV)/bin/python
export GRC_BLOCKS_PATH := $(CURDIR)/$(VENV)/share/gnuradio/grc/blocks
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-cpp test-py lint format bench clean install uninstall

setup:
	@bash scripts/setup.sh

## demo: the main job (see README)
demo: setup
	$(PY) apps/testbed.py $(ARGS)

## test: C++ and gr_unittest QA (ctest), pytest, ruff
test: setup lint test-cpp test-py

test-cpp:
	cd build && ctest --output-on-failure -j $$(nproc)

# both cores (one worker per core); tests sharing a module's fixture stay on one worker
test-py:
	$(PY) -m pytest -q -n auto --dist loadgroup $(PYTEST_ARGS)

lint:
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/ruff format --no-cache --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) benchmarks/link_bench.py
	$(PY) benchmarks/fl_bench.py
	$(PY) benchmarks/unlearn_bench.py

## install: the module for GNU Radio Companion's /usr/bin/python3, under /usr/local (run as root,
## e.g. `sudo make install`, after `make setup`; set-up does it itself when it has root or sudo)
install:
	@test -f build/system/cmake_install.cmake || { echo "no build/system: run 'make setup' first" >&2; exit 1; }
	cmake --install build/system
	/sbin/ldconfig

# (Python leaves __pycache__ in gnuradio/scaleflu, which would import as an empty namespace package)
uninstall:
	cmake --build build/system --target uninstall
	grep '/gnuradio/scaleflu/__init__.py$$' build/system/install_manifest.txt | xargs -r dirname | xargs -r rm -rf

clean:
	rm -rf build
