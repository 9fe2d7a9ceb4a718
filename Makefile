# `make demo` and `make test` work on a fresh machine with RabbitMQ and
# PostgreSQL on 127.0.0.1 (or after `docker compose up -d`).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test check lint typecheck imports bench chaos clean services wheel

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[push,bench]' --group dev
	touch $(STAMP)

install: $(STAMP)

services:
	@bash .ci/services

demo: install services
	$(PY) -m consumers demo $(DEMO_ARGS)

test: install services
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff format --check consumers dedupe providers proving tests
	$(VENV)/bin/ruff check consumers dedupe providers proving tests

typecheck: install
	$(VENV)/bin/mypy

imports: install
	$(VENV)/bin/lint-imports

bench: install services
	$(PY) -m consumers bench

chaos: install services
	$(PY) -m consumers chaos

check: lint typecheck imports test

# The wheel as users get it, installed into a fresh venv, runs the demo:
# a module missing from the wheel fails here, not on a user's machine.
wheel: install services
	rm -rf dist .wheel-venv
	$(PY) -m build --wheel --outdir dist .
	python3 -m venv .wheel-venv
	.wheel-venv/bin/python -m pip install --quiet --upgrade pip
	.wheel-venv/bin/python -m pip install --quiet "$$(ls dist/*.whl)[push]"
	cd /tmp && $(CURDIR)/.wheel-venv/bin/idempotent-workers demo --jobs 1000 --pushes 100

clean:
	rm -rf $(VENV) .wheel-venv dist .pytest_cache .mypy_cache .ruff_cache
