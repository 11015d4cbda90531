# Receipt — `make up` runs the stack on embedded defaults; `make test` sets up and runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint typecheck unit install clean chaos bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,local]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/receipt up

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

# Speed against raw baselines (6–12 minutes; BENCH_ARGS=--quick for 2–3): docs/bench.md.
bench: $(STAMP)
	$(BIN)/python -m tools.bench $(BENCH_ARGS)

# A fault soak of the real role processes (default 10 minutes; CHAOS_ARGS="--duration 120" for less).
chaos: $(STAMP)
	$(BIN)/python -m tools.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .receipt .pytest_cache .mypy_cache .ruff_cache .hypothesis
