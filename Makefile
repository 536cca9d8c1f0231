# Two commands on a fresh machine: `make run` (set up, then train on the default) and
# `make test` (set up, then run the whole test suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test setup clean

setup: $(STAMP)

# torch is pinned before the project so pip never reaches for a newer (CUDA) build.
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,hf]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/trirace train

# --durations: the output ends with the slowest tests. `pytest -m "not integration"` runs
# the pure tier (tests/unit/) alone.
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

clean:
	rm -rf $(VENV) .pytest_cache
