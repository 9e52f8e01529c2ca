# One-command set-up: every target creates .venv and installs what it needs (and rebuilds
# the C record decoder when its source changes).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all venv install test lint demo bench clean kafka-jars fuzz

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setuptools>=77 (PEP 639 license fields) and wheel in the venv itself, so builds need no
# network: pip install --no-build-isolation -e . and python -m build --no-isolation.
$(STAMP): pyproject.toml setup.py consumer/_crecords.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade 'setuptools>=77' wheel
	$(BIN)/python -m pip install --quiet --no-build-isolation -e '.[dev]'
	touch $(STAMP)

venv install: $(STAMP)

# Real Apache Kafka jars (Maven Central) for tests/apache_kafka; cached outside the tree.
kafka-jars: $(STAMP)
	$(BIN)/python -m epochguard.testing.apache_kafka

test: $(STAMP) kafka-jars
	$(BIN)/python -P -m pytest $(PYTEST_ARGS)

# Long fuzzing runs (docs/consumer.md, "Bad input"): FUZZ_EXAMPLES hypothesis examples per
# property instead of make test's small defaults.
FUZZ_EXAMPLES ?= 100000
fuzz: $(STAMP)
	EPOCHGUARD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -P -m pytest tests/fuzz -x -q -o timeout=0 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p epochguard

demo: $(STAMP)
	$(BIN)/python -m epochguard demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
