# `make demo` and `make test` work on a fresh machine with RabbitMQ and
# PostgreSQL on 127.0.0.1 (or after `docker compose up -d`).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test check lint typecheck imports bench chaos clean services

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

services:
	@bash .ci/services

demo: install services
	$(PY) -m consumers demo

test: install services
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff format --check consumers dedupe providers tests
	$(VENV)/bin/ruff check consumers dedupe providers tests

typecheck: install
	$(VENV)/bin/mypy

imports: install
	$(VENV)/bin/lint-imports

bench: install services
	$(PY) -m consumers bench

chaos: install services
	$(PY) -m consumers chaos

check: lint typecheck imports test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
