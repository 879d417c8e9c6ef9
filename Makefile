# rankstream's front door. `make help` lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RANKSTREAM_BOARDS ?= deploy/boards.yaml
# parallel test runners, each with its own Kafka and Redis (tests/conftest.py)
TEST_JOBS ?= 2
# the chaos suite's soak, minutes (docs/chaos.md)
SOAK_MINUTES ?= 30
.PHONY: help setup run stop test test-fast lint bench chaos lock audit clean

help:  ## this list
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

# every version CI installs is locked, with its hashes: requirements.lock (`make lock` rewrites it)
$(STAMP): pyproject.toml requirements.lock
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rankstream needs Python >= 3.11 (found " + sys.version.split()[0] + ")")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP)  ## virtualenv, install, Redis binary, Kafka jars (idempotent, fast once cached)
	@$(BIN)/rankstream stack prepare

run: setup  ## Kafka, Redis, worker, API and a demo producer; prints a live top-10 URL; Ctrl-C stops all
	$(BIN)/rankstream dev

stop:  ## stop a local stack left running (`rankstream stack up`)
	$(BIN)/rankstream stack down

test: setup  ## the whole test suite on real Kafka and Redis (started by the fixtures), TEST_JOBS runners
	$(BIN)/pytest -n $(TEST_JOBS) --dist worksteal

test-fast: setup  ## the inner loop: unit tests and the quick integration tests (not marked slow)
	$(BIN)/pytest -n $(TEST_JOBS) --dist worksteal -m "not slow"

lint: setup  ## ruff and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: setup  ## benchmarks; JSON reports in bench/results/
	$(BIN)/python -m bench

chaos: setup  ## every fault scenario on real processes, compared exactly with the model (SOAK_MINUTES, default 30); writes docs/guarantees-table.md
	$(BIN)/python -m chaos --table --soak-minutes $(SOAK_MINUTES)

lock: setup  ## rewrite requirements.lock from pyproject.toml (every version, with hashes)
	$(BIN)/pip-compile -q --extra dev --generate-hashes --strip-extras --allow-unsafe \
		--no-emit-find-links --no-emit-index-url -o requirements.lock pyproject.toml

audit: setup  ## requirements.lock against the published advisories (ignored ones: .ci/audit-ignore)
	$(BIN)/python .ci/audit.py

clean:  ## remove the virtualenv and the local stack's data
	rm -rf $(VENV) .stack .pytest_cache .mypy_cache .ruff_cache
