# gr-scaleflu: the two front-door commands are `make demo` and `make test`.
# Both run scripts/setup.sh first (idempotent: quick when everything is in place).
VENV   ?= .venv
BUILD  ?= build
PY     := $(VENV)/bin/python
# GRC finds our block YAML in the venv when set-up installed the module there (without root);
# an install under /usr/local is on GRC's own path. Looked up when a recipe runs (after setup).
export GRC_BLOCKS_PATH = $(shell test -e $(VENV)/share/gnuradio/grc/blocks/scaleflu_link_arq.block.yml && echo $(CURDIR)/$(VENV)/share/gnuradio/grc/blocks)
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
	cd $(BUILD) && ctest --output-on-failure -j $$(nproc)

# two workers per core: many tests wait on robot processes, sockets and the link's clock
# (on 2 cores the same suite took 13.5 min with 4 workers, 15.6 min with 2); tests sharing a
# module's fixture stay on one worker
test-py:
	$(PY) -m pytest -q -n $$(( 2 * $$(nproc) )) --dist loadgroup $(PYTEST_ARGS)

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
## e.g. `sudo make install`, after `make setup`). Set-up installs it there itself when it has root
## or sudo; otherwise its build went into the venv, and this builds the /usr/local one.
SYS_CMAKE := -DCMAKE_BUILD_TYPE=Release -DSCALEFLU_INSTALL_PTH=ON -DCMAKE_INSTALL_PREFIX=/usr/local \
	-DPYTHON_EXECUTABLE=/usr/bin/python3
install:
	@test -f $(BUILD)/CMakeCache.txt || { echo "no $(BUILD): run 'make setup' first" >&2; exit 1; }
	if grep -q '^CMAKE_INSTALL_PREFIX:PATH=/usr/local$$' $(BUILD)/CMakeCache.txt; then \
	  cmake --install $(BUILD); \
	else \
	  cmake -S . -B $(BUILD)/system $(SYS_CMAKE) >/dev/null && \
	  cmake --build $(BUILD)/system -j $$(nproc) && cmake --install $(BUILD)/system; \
	fi
	/sbin/ldconfig

# (Python leaves __pycache__ in gnuradio/scaleflu, which would import as an empty namespace package)
uninstall:
	for b in $(BUILD) $(BUILD)/system; do \
	  if grep -qs '^/usr/local/' $$b/install_manifest.txt; then \
	    cmake --build $$b --target uninstall; \
	    grep '/gnuradio/scaleflu/__init__.py$$' $$b/install_manifest.txt | xargs -r dirname | xargs -r rm -rf; \
	  fi; \
	done

clean:
	rm -rf build
