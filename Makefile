# Runledger: `make run` sets up a fresh machine and serves the console with demo data;
# `make test` runs the tests. Both use the embedded defaults (SQLite, in-memory channel layer)
# unless DATABASE_URL / REDIS_URL are set.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup run test lint check migrate demo bench clean

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

run: demo
	@echo "Runledger console: http://$(HOST):$(PORT)/ and the re-execution worker  (Ctrl-C stops both)"
	$(PY) bin/serve $(HOST) $(PORT)

test: setup
	$(PY) -m pytest

# Static checks, no database needed: types (mypy) and the import contracts (lint-imports);
# both are configured in pyproject.toml.
lint: setup
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# lint, plus: every model change has its migration.
check: lint
	$(PY) manage.py makemigrations --check --dry-run

# Every benchmark against PostgreSQL and Redis (DATABASE_URL, REDIS_URL: a scratch database; exit 2
# when either is not set or does not answer), one table to stdout and bench/results.md.
bench: setup
	$(PY) bench/all.py

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
