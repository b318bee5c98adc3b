# memdiag — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The DuckDB CLIs the file must open in (the oldest supported, the newest 1.x): the client
# test runs each (tests/unit/test_duckdb_clients.py).
DUCKDB_CLIENTS := 1.4.4 1.5.6

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  \033[1m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[embedded,report,serve,semantic,test,bench,dev]'
	touch $(STAMP)

CLIENTS := $(foreach v,$(DUCKDB_CLIENTS),$(VENV)/clients/duckdb-$(v)/duckdb)

# the wheel's own binary: under duckdb_cli/ from 1.5 (bin/duckdb is then a Python wrapper),
# bin/duckdb before
$(VENV)/clients/duckdb-%/duckdb: | $(STAMP)
	rm -rf $(VENV)/clients/duckdb-$*
	$(BIN)/pip install -q --target $(VENV)/clients/duckdb-$* duckdb-cli==$*
	cd $(VENV)/clients/duckdb-$* && b=duckdb_cli/duckdb && { [ -f $$b ] || b=bin/duckdb; } && \
		chmod +x $$b && ln -sf $$b duckdb

install: $(STAMP) $(CLIENTS) ## Create .venv and install memdiag with everything it needs.

demo: $(STAMP) ## The whole pipeline on the bundled sample (embedded broker): status screen and HTML report.
	$(BIN)/memdiag demo

# The unit tests (no broker, CPU-bound) on every core; then the ones with a broker, in one
# process more than the cores, at most 4: they mostly wait for brokers, workers and their
# commits (two processes kept two cores 54% busy; three took 8:17 down to about 6).
# `make test BROKER_PROCS=2` for fewer.
BROKER_PROCS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n + 1 < 4 ? n + 1 : 4 )))
test: $(STAMP) $(CLIENTS) browser ## Run the whole suite: unit, integration (embedded broker), end to end.
	$(BIN)/pytest -n auto --durations=12 tests/unit tests/spec
	$(BIN)/pytest -n $(BROKER_PROCS) --durations=12 tests/e2e tests/integration tests/chaos

browser: ## Debian's headless Chromium, for the tests that look at the report and memdiag serve (root: installed if missing).
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed (needs root): the browser tests will be skipped"

chaos: $(STAMP) ## The reliability suite at full size: 20 kill -9s, 5,000 hostile inputs, a broker restart, two workers under 10 restarts, the slowest property tests at 4x their examples (report: .build/chaos.json).
	mkdir -p .build && rm -f .build/chaos.json
	MEMDIAG_CHAOS=full MEMDIAG_FUZZ_INPUTS=5000 MEMDIAG_CHAOS_REPORT=.build/chaos.json \
		$(BIN)/pytest -m chaos tests/chaos tests/unit/test_hostile.py \
		tests/integration/test_event_time.py tests/unit/test_sessions.py \
		tests/unit/test_recall.py tests/unit/test_breaks.py tests/unit/test_analytics.py \
		tests/unit/test_miss_reason.py
	@cat .build/chaos.json

unit: $(STAMP) $(CLIENTS) ## Run the unit tests only (no broker).
	$(BIN)/pytest -n auto tests/unit

# mypy and import-linter read a regular install: the editable one maps memdiag.streams and
# its siblings with an import hook, which neither follows. Their paths are the installed ones
# (memdiag/streams/x.py is streams/x.py here).
lint: $(STAMP) ## ruff, then mypy and the import layers on a regular install (.build/lint).
	$(BIN)/ruff check .
	$(BIN)/ruff format --check memdiag streams schemas analytics
	rm -rf .build/lint build  # build/: setuptools' leftovers would be installed as they are
	$(BIN)/pip install -q --no-deps --target .build/lint .
	cd .build/lint && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p memdiag
	cd .build/lint && ../../$(BIN)/lint-imports --config ../../pyproject.toml

bench: $(STAMP) ## Pipeline benchmark: single events and batches, memdiag against Quix Streams and a bare loop, and the latency.
	$(BIN)/python benchmarks/pipeline.py

profile: $(STAMP) ## py-spy profile of the real worker on single-event traffic (profile-worker.txt).
	$(BIN)/python benchmarks/profile_worker.py

docs: $(STAMP) ## Regenerate the reference pages that follow from the code (docs/events.md, commands.md, configuration.md).
	$(BIN)/python scripts/make_docs.py

screenshot: $(STAMP) browser ## The README's picture of memdiag serve on the demo (docs/img/overview.png).
	$(BIN)/python scripts/screenshot.py --db .build/screenshot-demo.duckdb

serve-bench: $(STAMP) ## memdiag serve on a 20,000-session file: page times, and the sink with the view open.
	$(BIN)/python benchmarks/serve.py

sample: $(STAMP) ## Regenerate the bundled demo sample (deterministic).
	$(BIN)/python scripts/make_sample.py memdiag/data/sample.jsonl

CAPTURE_VENV := .build/capture-venv

$(CAPTURE_VENV)/.installed: tests/real_libraries/requirements.txt
	rm -rf $(CAPTURE_VENV)
	$(PYTHON) -m venv $(CAPTURE_VENV)
	$(CAPTURE_VENV)/bin/pip install -q --upgrade pip
	$(CAPTURE_VENV)/bin/pip install -q -r tests/real_libraries/requirements.txt
	touch $@

capture-spans: $(CAPTURE_VENV)/.installed ## Re-capture tests/data/real_spans/ from real instrumentation libraries (own venv: .build/capture-venv).
	$(CAPTURE_VENV)/bin/python tests/real_libraries/capture.py

clean: ## Remove the virtual environment and caches.
	rm -rf $(VENV) .build .pytest_cache .mypy_cache .ruff_cache *.egg-info

.PHONY: help install demo test chaos browser unit lint docs bench profile sample clean capture-spans \
	screenshot serve-bench
