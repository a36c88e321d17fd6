# The two commands of the README: `make run` and `make test`.
# Everything is installed into .venv from the lock file (requirements/lock.txt); system
# packages come from scripts/system-packages.sh. `make lock` regenerates the lock;
# `make test-latest` and `make test-lowest` run the suite at both ends of the allowed ranges.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?=
STAMP := $(VENV)/.installed
LOCK := requirements/lock.txt
EXTRAS := test,bench,spark,lint,db
# amqtt (the tests' interop client, the benchmarks' reference broker) has a venv of its
# own: it pins websockets==15.0.1, which must not hold back Nautilus's own dependencies.
AMQTT_VENV := .venv-amqtt
AMQTT_STAMP := $(AMQTT_VENV)/.installed
export NAUTILUS_AMQTT_PYTHON ?= $(CURDIR)/$(AMQTT_VENV)/bin/python

.PHONY: run test test-no-system lint typecheck format bench clean lock smoke test-latest test-lowest system-packages

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python setup.cfg setup.py pyproject.toml event_relay/_recorder.c broker/protocol/_speedups.c $(LOCK)
	$(BIN)/pip install -q -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $(STAMP)

$(AMQTT_STAMP): requirements/amqtt.txt
	$(PYTHON) -m venv $(AMQTT_VENV)
	$(AMQTT_VENV)/bin/pip install -q -r requirements/amqtt.txt
	touch $(AMQTT_STAMP)

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

# Java for Spark's tests, Chromium for the status page's and CORS's, Redis for the
# cluster's and auth_db's, PostgreSQL and MariaDB for auth_db's, Mosquitto for the
# bridge's, graphite-carbon (carbon-cache) for Graphite's (the tests start servers of
# their own), iproute2 (ip, tc) for the cluster's network partitions (namespaces, as
# root). scripts/system-packages.sh names the missing ones before installing them.
SYSTEM_PACKAGES := openjdk-17-jre-headless chromium redis-server postgresql mariadb-server \
	mosquitto graphite-carbon iproute2

system-packages:
	bash scripts/system-packages.sh $(SYSTEM_PACKAGES)

test: system-packages test-no-system

# The same tests without installing system packages: a test whose package is missing is
# skipped, with the reason (-rs lists them at the end).
test-no-system: $(STAMP) $(AMQTT_STAMP) lint typecheck smoke
	$(BIN)/python -m pytest -q -rs
	# the hot path's pure-Python twins, as without a C compiler (tests/protocol runs both)
	NAUTILUS_NO_SPEEDUPS=1 $(BIN)/python -m pytest -q tests/unit tests/broker/test_flow_control.py \
		tests/broker/test_publish.py tests/broker/test_backpressure.py tests/broker/test_hostile_input.py

# The package as a user gets it: wheel and sdist built, the wheel installed (not
# editable) into a clean venv from the lock file, then served and used over TCP,
# WebSocket and TLS (scripts/smoke.sh).
smoke: $(STAMP)
	bash scripts/smoke.sh $(BIN)/python -c $(LOCK)

# The newest versions the ranges in setup.cfg allow, and the lowest: each in a venv of
# its own, the whole suite. Run both before a release (README, "Development").
test-latest: $(AMQTT_STAMP) system-packages
	bash scripts/test-range.sh .venv-latest --upgrade
	bash scripts/smoke.sh .venv-latest/bin/python --upgrade

test-lowest: $(AMQTT_STAMP) system-packages
	bash scripts/test-range.sh .venv-lowest -c requirements/lowest.txt
	bash scripts/smoke.sh .venv-lowest/bin/python -c requirements/lowest.txt

# The lock (exact versions of everything make run / make test install) and the lowest
# versions the ranges allow, both from setup.cfg's ranges.
lock: $(BIN)/python
	bash scripts/lock.sh $(BIN)/python

bench: $(STAMP) $(AMQTT_STAMP) bench/bin/mqttgen
	bash scripts/system-packages.sh mosquitto
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

# The compiled load generator (bench/README.md, "mqttgen"); not needed by `make test`,
# whose test of it builds it when a C compiler is there and is skipped otherwise.
bench/bin/mqttgen: bench/mqttgen.c
	@mkdir -p $(@D)
	cc -O2 -Wall -Wextra -o $@ $< -lpthread

clean:
	rm -rf $(VENV) $(AMQTT_VENV) .venv-latest .venv-lowest build dist *.egg-info \
		.hypothesis .mypy_cache event_relay/*.so bench/bin
