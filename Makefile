# memdiag — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## List the targets.
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  \033[1m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[embedded,test,bench,dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install memdiag with everything it needs.

demo: $(STAMP) ## The whole pipeline on the bundled sample (embedded broker): status screen and HTML report.
	$(BIN)/memdiag demo

test: $(STAMP) browser ## Run the whole suite: unit, integration (embedded broker), end to end.
	$(BIN)/pytest

browser: ## Debian's headless Chromium, for the test that looks at the HTML report (root: installed if missing).
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed (needs root): the report rendering test will be skipped"

unit: $(STAMP) ## Run the unit tests only (no broker).
	$(BIN)/pytest tests/unit

lint: $(STAMP) ## ruff and mypy.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check memdiag streams schemas analytics
	$(BIN)/mypy

bench: $(STAMP) ## Pipeline benchmark: single events and batches, memdiag against Quix Streams and a bare loop, and the latency.
	$(BIN)/python benchmarks/pipeline.py

profile: $(STAMP) ## py-spy profile of the real worker on single-event traffic (profile-worker.txt).
	$(BIN)/python benchmarks/profile_worker.py

sample: $(STAMP) ## Regenerate the bundled demo sample (deterministic).
	$(BIN)/python scripts/make_sample.py memdiag/data/sample.jsonl

clean: ## Remove the virtual environment and caches.
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

.PHONY: help install demo test browser unit lint bench profile sample clean
