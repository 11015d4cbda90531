# Receipt — `make up` runs the stack on embedded defaults; `make test` sets up and runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

LOCK := requirements.lock
DEV_LOCK := requirements-dev.lock
LOCK_TOOL := .venv-lock
UV_COMPILE = $(LOCK_TOOL)/bin/uv pip compile pyproject.toml --generate-hashes --universal \
	--python-version 3.11 --custom-compile-command "make lock"

.PHONY: up test lint typecheck unit install clean chaos bench bench-history lock client

# Every dependency (the dev and local extras included) at the version and hashes of
# requirements-dev.lock, then the project itself without resolving anything again, and the
# example agent of the handler SDK (examples/release-bot: its jobs run in `make up`'s stack,
# and the tests run it).
BUILD_PINS := $(CURDIR)/build-constraints.txt
$(STAMP): pyproject.toml $(DEV_LOCK) examples/release-bot/pyproject.toml build-constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --constraint $(BUILD_PINS) --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r $(DEV_LOCK)
	$(BIN)/python -m pip install --quiet --build-constraint $(BUILD_PINS) --no-deps -e .
	$(BIN)/python -m pip install --quiet --build-constraint $(BUILD_PINS) --no-deps \
	    -e examples/release-bot
	touch $(STAMP)

# Regenerate the locks from pyproject.toml's ranges (uv in a venv of its own): requirements.lock
# holds what the product runs on (the image installs it), requirements-dev.lock adds the dev
# and local (embedded PostgreSQL and Temporal) extras at the same versions.
lock:
	test -x $(LOCK_TOOL)/bin/uv || ($(PYTHON) -m venv $(LOCK_TOOL) && $(LOCK_TOOL)/bin/pip install --quiet 'uv>=0.5,<1')
	$(UV_COMPILE) -o $(LOCK)
	$(UV_COMPILE) --extra dev --extra local --constraint $(LOCK) -o $(DEV_LOCK)

install: $(STAMP)

# The Python client's generated parts (clients/python): the API's OpenAPI document, its models
# and the async client rewritten from the blocking one. A test fails while they are stale.
client: $(STAMP)
	$(BIN)/python -m tools.client_models

up: $(STAMP)
	$(BIN)/receipt up

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Four pytest workers (pytest-xdist): the suite waits on real processes, leases and Temporal more
# than it computes, so four share the 2 cores of a CI machine; the slowest tests are listed.
PYTEST_WORKERS ?= 4
test: lint typecheck
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal --durations=20

# Speed against raw baselines (10–17 minutes; BENCH_ARGS=--quick for 4–6): tools/bench/README.md.
bench: $(STAMP)
	$(BIN)/python -m tools.bench $(BENCH_ARGS)

# The history part: enqueue and every periodic query with 1 000 000 finished jobs against an empty
# database (about 15 minutes; BENCH_HISTORY_ARGS="--jobs 100000" for 2–3): docs/bench-history.md.
bench-history: $(STAMP)
	$(BIN)/python -m tools.bench.history $(BENCH_HISTORY_ARGS)

# A fault soak of the real role processes (default 10 minutes; CHAOS_ARGS="--duration 120" for less).
chaos: $(STAMP)
	$(BIN)/python -m tools.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) $(LOCK_TOOL) .receipt .pytest_cache .mypy_cache .ruff_cache .hypothesis
