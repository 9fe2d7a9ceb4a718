# `make demo` and `make test` work on a fresh machine with RabbitMQ and
# PostgreSQL on 127.0.0.1 (or after `docker compose up -d`).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Every package the linters read (add a new top-level package here).
SOURCES := console consumers dedupe ingress providers proving tests

.PHONY: install demo test test-busy check ci lint typecheck imports docs deploy-check bench bench-steady chaos chaos-cluster chaos-pg clean services wheel fuzz-http

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[demo,bench,console,tracing]' --group dev --group docs
	touch $(STAMP)

install: $(STAMP)

services:
	@bash .ci/services

demo: install services
	$(PY) -m consumers demo $(DEMO_ARGS)

# The README's test command; CI runs it too. Coverage is measured on every run
# and fails below the floor in pyproject.toml ([tool.coverage.report]).
# Two pytest-xdist workers: most tests wait on the broker, the database or a
# child process, not on a core; the `slow` tests (services of their own) take
# turns on one of them (tests/conftest.py).
test: install services
	rm -f .coverage .coverage.*
	$(VENV)/bin/coverage run -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)
	$(VENV)/bin/coverage combine --quiet
	$(VENV)/bin/coverage report

# `make test` beside a CPU hog on every core for the whole run (Debian's
# stress-ng), standing in for a busy CI machine: the suite's time bounds follow
# from what the code promises, not from a quiet machine.
test-busy: install services
	@command -v stress-ng >/dev/null || { echo "test-busy needs stress-ng: apt-get install -y stress-ng" >&2; exit 2; }
	stress-ng --cpu $$(nproc) --timeout 2h --quiet & hog=$$!; \
	$(MAKE) test; status=$$?; kill $$hog; wait $$hog; exit $$status

lint: install
	$(VENV)/bin/ruff format --check $(SOURCES)
	$(VENV)/bin/ruff check $(SOURCES)

typecheck: install
	$(VENV)/bin/mypy

imports: install
	$(VENV)/bin/lint-imports

# The docs site (mkdocs.yml, docs/) into site/: strict, so a broken link, a
# missing anchor or an API reference that names nothing fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# deploy/ against the real schemas, offline: the Kubernetes manifests for every
# Kubernetes version deploy/README.md claims, the compose files against the
# Compose specification (no cluster and no Docker daemon are needed).
K8S_VERSIONS := 1.30.0 1.31.0 1.32.0 1.33.0 1.34.0 1.35.0 1.36.0 1.37.0
deploy-check: install
	for v in $(K8S_VERSIONS); do \
		$(VENV)/bin/kubernetes-validate --strict --quiet --kubernetes-version $$v deploy/k8s/*.yaml || exit 1; \
	done
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker-compose.yml deploy/compose.yaml

# About 5 minutes on 2 cores; `make bench BENCH_ARGS=--long` for the long form.
bench: install services
	$(PY) -m consumers bench $(BENCH_ARGS)

# Empty against a week of prefilled generations, on a PostgreSQL of its own:
# `make bench-steady BENCH_ARGS="--rows 50000000 --repeats 5"` for the goal's size.
bench-steady: install services
	$(PY) -m proving.bench.steady $(BENCH_ARGS)

# The send API: new keys and replays as ratios to the same server's trivial endpoint.
bench-ingress: install services
	$(PY) -m proving.bench.ingress $(BENCH_ARGS)

# POST /v1/messages with 10,000 raw generated requests: no answer of 500 or more.
fuzz-http: install services
	$(PY) -m proving.fuzz.http --inputs 10000

chaos: install services
	$(PY) -m consumers chaos

# A 3-node RabbitMQ cluster of its own, its queue leader killed under load:
# needs neither shared service.
chaos-cluster: install
	$(PY) -m consumers chaos --profile cluster

# A Patroni cluster of 3 PostgreSQL nodes (Debian's patroni and etcd-server),
# its primary killed under load; then the control without synchronous replication.
chaos-pg: install services
	$(PY) -m consumers chaos --profile pg-failover
	$(PY) -m consumers chaos --profile pg-failover --control async

check: lint typecheck imports test

# What .ci/run runs, in its order.
ci: lint typecheck imports docs deploy-check wheel test

# The wheel as users get it, installed into a fresh venv, runs the demo:
# a module missing from the wheel fails here, not on a user's machine.
wheel: install services
	rm -rf dist .wheel-venv
	$(PY) -m build --wheel --outdir dist .
	python3 -m venv .wheel-venv
	.wheel-venv/bin/python -m pip install --quiet --upgrade pip
	.wheel-venv/bin/python -m pip install --quiet "$$(ls dist/*.whl)[demo,console]"
	cd /tmp && $(CURDIR)/.wheel-venv/bin/idempotent-workers demo --jobs 1000 --pushes 100

clean:
	rm -rf $(VENV) .wheel-venv dist site .pytest_cache .mypy_cache .ruff_cache
