# make run  — the demo on the embedded SQLite database (web server + django-q2 cluster)
# make test — checks, lint, the docs site, and the whole suite on SQLite and on PostgreSQL
# make docs — the docs site (docs/, mkdocs.yml) built into site/: open site/index.html

VENV      ?= .venv
PY        := $(VENV)/bin/python
HOST      ?= 127.0.0.1
PORT      ?= 8000
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/agenttasks
BENCH_URL   ?= postgres://postgres@127.0.0.1:5432/agenttasks_bench
# setuptools warns about every editable install in ten lines nobody needs to act on.
QUIET_BUILD := PYTHONWARNINGS=ignore::UserWarning

.PHONY: install install-demo run test test-sqlite test-postgres lint typecheck docs fuzz bench clean

# What the demo needs (the app, psycopg for DATABASE_URL=postgres://…, a2a-sdk for its A2A servers,
# mcp-types for its MCP endpoint).
$(VENV)/.demo: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(QUIET_BUILD) $(PY) -m pip install -q -e ".[postgres,a2a,mcp]"
	touch $@

# The development tools too (pytest, ruff, playwright, schemathesis, uvicorn, mkdocs).
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(QUIET_BUILD) $(PY) -m pip install -q -e ".[postgres,redis,a2a,mcp,otel]" --group dev
	touch $@ $(VENV)/.demo

install-demo: $(VENV)/.demo

install: $(VENV)/.installed

# One process runs both servers and stops both on Ctrl-C (project/management/commands/demo_run.py);
# a busy port is one line of output.
run: install-demo
	@$(PY) manage.py demo_run --host $(HOST) --port $(PORT)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Types (django-stubs): strict on the store, the lifecycle and their vocabulary (pyproject.toml).
typecheck: install
	$(VENV)/bin/mypy agenttasks

# The docs site: offline (the built-in theme without its CDN, search that works from disk);
# --strict fails on a link between pages that does not resolve.
# Only MkDocs (the docs dependency group): the package is not reinstalled, which would reload a
# running demo.
$(VENV)/.docs: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --group docs
	touch $@

docs: $(VENV)/.docs
	$(VENV)/bin/mkdocs build --strict

test: install lint typecheck
	$(PY) manage.py check
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) manage.py spectacular --generator-class agenttasks.api.schema.Generator --validate --fail-on-warn --file /dev/null
	$(VENV)/bin/mkdocs build --strict
	$(MAKE) test-sqlite
	$(MAKE) test-postgres

# Each database's run: the independent tests in parallel (pytest-xdist, a file per worker at a
# time), then the tests marked `serial` (real clusters, browsers, the demo) one at a time. Every
# test runs on SQLite unless it needs PostgreSQL; on PostgreSQL run those and the tests of what
# behaves otherwise there (tests/conftest.py says which). AGENTTASKS_EVERY_TEST=1 runs all on both.
PYTEST_WORKERS ?= 3

test-sqlite: install
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial"
	$(VENV)/bin/pytest -p no:xdist -m serial

test-postgres: install
	DATABASE_URL=$(PG_TEST_URL) AGENTTASKS_CHAOS=1 $(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not serial"
	DATABASE_URL=$(PG_TEST_URL) AGENTTASKS_CHAOS=1 $(VENV)/bin/pytest -p no:xdist -m serial

# Longer fuzzing than make test's (not part of it): schemathesis over the served OpenAPI document
# and hypothesis over every write endpoint, FUZZ_SCALE times the cases make test runs; then the
# soaks at full size (a stalled cluster's 5,000 queued runs, ten times make test's).
FUZZ_SCALE ?= 3
fuzz: install
	AGENTTASKS_FUZZ_SCALE=$(FUZZ_SCALE) $(VENV)/bin/pytest --timeout=3600 -s \
		tests/api/test_api_schemathesis.py tests/api/test_api_fuzz.py
	AGENTTASKS_SOAK=1 $(VENV)/bin/pytest --timeout=3600 -s \
		tests/execution/test_requeue.py -k stalled_cluster
	DATABASE_URL=$(PG_TEST_URL) AGENTTASKS_CHAOS=1 AGENTTASKS_SOAK=1 $(VENV)/bin/pytest -p no:xdist \
		--timeout=3600 -s tests/chaos/test_starvation.py tests/chaos/test_fault_runs.py

# Benchmarks against baselines measured in the same run, on PostgreSQL (not part of make test).
bench: install
	cd bench && DATABASE_URL=$(BENCH_URL) ../$(PY) run.py

clean:
	rm -rf $(VENV) db.sqlite3* db-test.sqlite3* .pytest_cache
