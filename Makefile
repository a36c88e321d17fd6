# The two commands of the README: `make run` and `make test`.
# Everything is installed into .venv; system packages come from scripts/system-packages.sh.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?=
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python setup.cfg setup.py pyproject.toml event_relay/_recorder.c
	$(BIN)/pip install -q -e '.[test,bench,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/nautilus $(if $(CONFIG),--config $(CONFIG),)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: $(STAMP) lint typecheck
	# Java for Spark's tests, Chromium for the status page's, Redis for the cluster's
	bash scripts/system-packages.sh openjdk-17-jre-headless chromium redis-server
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	bash scripts/system-packages.sh mosquitto
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .hypothesis .mypy_cache event_relay/*.so
