# One-command set-up: every target creates .venv and installs what it needs (and rebuilds
# the C record decoder when its source changes).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all venv install test test-fast lint docs demo bench clean kafka-jars spark-jars go-probe chaos chaos-apache chaos-legacy fuzz explore soak

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# setuptools>=77 (PEP 639 license fields) and wheel in the venv itself, so builds need no
# network: pip install --no-build-isolation -e . and python -m build --no-isolation.
# The editable install gets compiled modules as a wheel install does: under
# PYTHONDONTWRITEBYTECODE every process the tests start (Spark's, the chaos clients') would
# otherwise compile each module it imports.
$(STAMP): pyproject.toml setup.py src/epochguard/consumer/_crecords.c | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade 'setuptools>=77' wheel
	$(BIN)/python -m pip install --quiet --no-build-isolation -e '.[dev]'
	$(BIN)/python -m compileall -q src/epochguard
	touch $(STAMP)

venv install: $(STAMP)

# Real Apache Kafka jars (Maven Central) for tests/apache_kafka; cached outside the tree.
kafka-jars: $(STAMP)
	$(BIN)/python -m epochguard.testing.apache_kafka

# Spark's own Kafka source (Maven Central, same cache), for the side-by-side tests and bench.
spark-jars: $(STAMP)
	$(BIN)/python -m epochguard.testing.apache_kafka.spark_kafka

# The franz-go reference client (a small Go program, src/epochguard/testing/franzgo/probe/,
# franz-go pinned by its go.mod and go.sum) built from the Go module proxy into the same cache.
go-probe: $(STAMP)
	$(BIN)/python -m epochguard.testing.franzgo

# make test runs on TEST_WORKERS processes (3) in lanes (tests/work_groups.py): every Spark
# test and the builds from the source tree are one unit of work, the real-Kafka runs of the
# scenario suite another, the real-Kafka modules with brokers of their own a third, every
# other test that starts a JVM (real Kafka, the Java client) a fourth, and the rest module by
# module (or test by test, for modules marked independent).
# Tests that ran into each other there are fixed: the Spark Connect server binds a port the
# system picks, and a chaos run that failed only by finishing late on a loaded machine runs
# again on its own (tests/chaos/late.py). TEST_WORKERS=0 runs it in one process.
# make test-fast runs on FAST_WORKERS.
TEST_WORKERS ?= 3
FAST_WORKERS ?= 4
xdist = -n $(1) --dist loadgroup --no-loadscope-reorder

test: $(STAMP) kafka-jars spark-jars go-probe
	$(BIN)/python -P -m pytest $(call xdist,$(TEST_WORKERS)) $(PYTEST_ARGS)

# Unit, sans-IO and EmbeddedCluster tests for day-to-day work: no JVM (neither real Kafka
# nor the Java client nor Spark), no Maven, no Go (the franz-go client), not the install
# matrix (fresh venvs of every Python), not the tests marked slow (the chaos CI set, the load
# tests, the scenario suite), and a tenth of each hypothesis property's examples
# (tests/examples.py). make test runs all of it. Markers decide; tests/jvm_markers.py keeps
# the JVM and Go ones complete.
FAST_MARKERS := not real_kafka and not spark and not go and not install and not slow
test-fast: $(STAMP)
	EPOCHGUARD_EXAMPLES_SCALE=0.1 $(BIN)/python -P -m pytest $(call xdist,$(FAST_WORKERS)) \
		-m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# Chaos schedules at scale (docs/contributing.md, "Chaos runs"): `make chaos SEEDS=N` runs
# the generated schedules of seeds FIRST..FIRST+N-1 against EpochConsumer, CHAOS_WORKERS at a
# time (each on its own EmbeddedCluster), and prints the oracle's totals and every failure
# with its replay code; FIRST=K lets several processes split a large run. CI runs a fixed
# set of 300 (tests/chaos). CHAOS_ARGS="--client kafka-python --shrink" and the like pass on;
# CHAOS_ARGS="--json benchmarks/results/chaos_at_scale.json" records a run at scale;
# CHAOS_ARGS=--network mixes network faults in (every consumer behind the fault proxy);
# CHAOS_ARGS=--raft runs them on brokers with Raft-term epochs (Redpanda's rules);
# CHAOS_ARGS=--transactions makes the writes transactional under read_committed consumers.
SEEDS ?= 100
FIRST ?= 0
CHAOS_WORKERS ?= 6
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(BIN)/python -P -m epochguard.testing.chaos --seeds $(SEEDS) --first $(FIRST) \
		--workers $(CHAOS_WORKERS) $(CHAOS_ARGS)

# Chaos schedules on real Apache Kafka (docs/contributing.md, "Chaos runs"): `make chaos-apache
# SEEDS=30` (30 by default) runs the real-Kafka schedules of seeds
# FIRST..FIRST+SEEDS-1 with EpochConsumer and the Java reference consumer side by side, one at
# a time on one ApacheKafkaCluster (about 25 s each), and merges the figures into
# benchmarks/results/chaos_scoreboard.json (the EmbeddedCluster rows stay).
# CHAOS_ARGS=--network: the schedules with network faults, every client (EpochConsumer, Java,
# kafka-python, confluent-kafka, aiokafka) through the fault proxy, into its own section.
chaos-apache: $(STAMP) kafka-jars
	$(BIN)/python -m benchmarks.chaos_scoreboard --apache-only \
		--seeds $(if $(filter command line environment,$(origin SEEDS)),$(SEEDS),30) --first $(FIRST) \
		$(CHAOS_ARGS)

# The first seeded chaos test (tests/consumer/test_chaos.py, docs/contributing.md): SEEDS per
# mode from seed index FIRST, about 3.5 s each, plus the regression schedules. CI runs 3.
chaos-legacy: $(STAMP)
	EPOCHGUARD_CHAOS_SEEDS=$(SEEDS) EPOCHGUARD_CHAOS_FIRST=$(FIRST) \
		$(BIN)/python -P -m pytest tests/consumer/test_chaos.py \
		-p no:cacheprovider -q -rfE $(PYTEST_ARGS)

# Long fuzzing runs (docs/design.md, "Fuzzing"): FUZZ_EXAMPLES hypothesis examples per
# property instead of make test's small defaults.
FUZZ_EXAMPLES ?= 100000
fuzz: $(STAMP)
	EPOCHGUARD_HYPOTHESIS=explore EPOCHGUARD_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -P -m pytest tests/fuzz -x -q -o timeout=0 $(PYTEST_ARGS)

# New examples for the state machine's properties (docs/contributing.md, "Property tests"):
# make test replays fixed ones; this draws EXPLORE_EXAMPLES fresh ones per property.
EXPLORE_EXAMPLES ?= 20000
explore: $(STAMP)
	EPOCHGUARD_HYPOTHESIS=explore EPOCHGUARD_MODEL_EXAMPLES=$(EXPLORE_EXAMPLES) \
		EPOCHGUARD_FUZZ_EXAMPLES=$(EXPLORE_EXAMPLES) $(BIN)/python -P -m pytest \
		tests/offsets/test_model_properties.py tests/offsets/test_transition_table.py \
		-x -q -o timeout=0 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p epochguard
	$(BIN)/mypy tools/docs

# The documentation site (mkdocs.yml; pages in docs/, API pages from the docstrings) into
# build/site. --strict: a broken link, anchor or docstring cross-reference fails the build.
# Open build/site/index.html, or serve it with `$(BIN)/mkdocs serve`. griffe imports the
# package to inspect the C decoder, and kafka-python's deprecation warnings (as in pytest's
# filterwarnings) would fill the log.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 \
	PYTHONWARNINGS="ignore:read_text is deprecated:DeprecationWarning,ignore:open_text is deprecated:DeprecationWarning" \
		$(BIN)/mkdocs build --strict

demo: $(STAMP)
	$(BIN)/python -m epochguard demo

bench: $(STAMP) kafka-jars spark-jars
	$(BIN)/python -m benchmarks
	$(BIN)/python -m benchmarks._matrix_plot
	$(BIN)/python -m benchmarks._tables

# Soak (docs/contributing.md, "Load and soak"; not in CI): one consumer under produce load, periodic unclean
# elections and network faults for DURATION seconds (make soak DURATION=3600; SOAK_MINUTES=
# also works, default 10 minutes); fails if a truncation is missed or its RSS, open fds or
# threads grow after warm-up. Writes benchmarks/results/soak.json.
SOAK_MINUTES ?= 10
DURATION ?=
soak: $(STAMP)
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_DURATION_S=$(DURATION) $(BIN)/python -m benchmarks._soak
	$(BIN)/python -m benchmarks._tables

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
