# Runledger: `make run` sets up a fresh machine and serves the console with demo data;
# `make test` runs the tests. Both use the embedded defaults (SQLite, in-memory channel layer)
# unless DATABASE_URL / REDIS_URL are set.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup run run-port serve test screenshots lint check migrate demo bench crash crash-short soak clean

# DEBUG is off unless turned on (console/settings.py). The development targets turn it on, for the
# embedded setup (development SECRET_KEY, debug pages), unless the environment sets DEBUG itself;
# `make serve` (production) does not.
run demo migrate check lint: export DEBUG ?= 1

# Daphne processes on the one port (bin/serve): make run 1, make serve one per core
# (`auto`); PROCESSES=N on the command line or RUNLEDGER_PROCESSES in the environment choose another.
run: PROCESSES ?= $(or $(RUNLEDGER_PROCESSES),1)
serve: PROCESSES ?= $(or $(RUNLEDGER_PROCESSES),auto)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

setup: $(VENV)/.installed

migrate: setup
	$(PY) manage.py migrate --noinput -v 0

demo: migrate
	$(PY) manage.py ledger demo

# A taken port is named first, before anything is set up, with the way to pick another.
run-port:
	@$(PYTHON) bin/port-free $(HOST) $(PORT)

run: run-port demo
	@echo "DEBUG=$(DEBUG): development settings (debug pages, a development SECRET_KEY); for production see docs/operations.md § Production"
	@echo "Runledger console: http://$(HOST):$(PORT)/ and the re-execution worker  (Ctrl-C stops both)"
	@echo "Port $(PORT); another with make run PORT=8001, then export PORT=8001 where you run the README's examples"
	$(PY) bin/serve --processes $(PROCESSES) $(HOST) $(PORT)

# Production (docs/operations.md § Production): the environment there (DEBUG off, SECRET_KEY, ...),
# then migrate, collect the static files (hashed, compressed) and serve N Daphne processes (one per
# core unless PROCESSES / RUNLEDGER_PROCESSES say otherwise) with the worker; deploy/ for several hosts.
serve: setup
	@test -n "$$SECRET_KEY" || { echo "make serve is production: set SECRET_KEY and the rest of docs/operations.md § Production (make run is for development)" >&2; exit 2; }
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py collectstatic --noinput -v 0
	@echo "Runledger (production, DEBUG=$${DEBUG:-0}): http://$(HOST):$(PORT)/ and the re-execution worker, Daphne processes: $(PROCESSES) (auto: one per core; Ctrl-C stops them all)"
	$(PY) bin/serve --processes $(PROCESSES) $(HOST) $(PORT)

# The suite on TEST_WORKERS processes (pytest-xdist; each has its own test database; 0: this one),
# a module's tests on one of them (with its module's or test process's servers), handed out in the
# order of tests/conftest.py (those that start processes first), the 25 slowest tests listed.
TEST_WORKERS ?= auto
# The project's modules byte-compiled first, and PYTHONDONTWRITEBYTECODE (set on CI's machines) off
# for the suite: else each of its hundred-odd Python processes compiles them again from source, and
# each test process rewrites every test module's asserts again (pytest caches the rewritten modules
# only where bytecode may be written; README § Tests).
test: setup
	$(PY) -m compileall -q -j 0 ledger console client/runledger >/dev/null
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# The README's pictures of the console (docs/img/), taken by a browser test from the demo data
# (tests/browser/test_readme_screenshots.py; Debian's /usr/bin/chromium, as the browser tests use).
screenshots: setup
	RUNLEDGER_DOCS_IMG=$(CURDIR)/docs/img $(PY) -m pytest -p no:cacheprovider tests/browser/test_readme_screenshots.py

# Static checks, no database needed: lint and format (ruff), types (mypy) and the import contracts
# (lint-imports); all configured in pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# lint, plus: every model change has its migration, and `check --deploy` has no warning under the
# production environment of docs/operations.md § Production.
check: lint
	$(PY) manage.py makemigrations --check --dry-run
	$(PY) bin/check-deploy

# Every benchmark against PostgreSQL and Redis (DATABASE_URL, REDIS_URL: a scratch database; exit 2
# when either is not set or does not answer), one table to stdout and bench/results.md.
bench: setup
	$(PY) bench/all.py

# The crash test (reliability/crash.py, docs/reliability.md): a private PostgreSQL cluster (initdb,
# its own port), two Daphne processes on Redis (REDIS_URL's server, database 13), clients and
# executors, Daphne SIGKILLed >= 100 times and PostgreSQL crashed >= 10 times; crash-short is the
# few-minute form .ci/run runs. Needs PostgreSQL's server binaries and a Redis; nothing else is touched.
crash: setup
	$(PY) reliability/crash.py

crash-short: setup
	$(PY) reliability/crash.py --short

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
