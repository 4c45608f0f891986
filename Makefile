# Developer and CI entry points. Tools live in $(HRL_CACHE) (outside the checkout), prepared by .ci/setup.sh.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
export HRL_CACHE ?= $(HOME)/.cache/hrl

ENV := . "$(HRL_CACHE)/env.sh"
LINT := ruff check . && ruff format --check .
PYTEST_ARGS ?=

.PHONY: setup venv lint test demo clean

setup: ## main venv, vLLM venv, Docker daemon and base image (cached)
	.ci/setup.sh

venv: ## only the main venv: enough for lint and the tests without markers
	.ci/setup.sh venv

lint: venv
	$(ENV); $(LINT)

test: setup
	$(ENV); $(LINT)
	$(ENV); python -m pytest -v $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || exit $$rc; \
	  echo "WARNING: pytest collected no tests (exit 5); treating that as success" >&2; }

demo: setup
	$(ENV); hrl train --recipe demo

clean: ## build artefacts in the checkout only (the cache in $(HRL_CACHE) stays)
	rm -rf build dist .pytest_cache .ruff_cache .mypy_cache
	find . -path ./.git -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -prune -exec rm -rf {} +
