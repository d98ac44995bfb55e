PY ?= .venv/bin/python
# The interpreter .venv is built with: PYTHON when given, else the first Python 3.12+ that runs
# (scripts/find-python.sh says where it looks, and what to install when there is none).
PYTHON ?=

.PHONY: test test-here test-sqlite check fmt system-deps run tour bench venv FORCE

# The marker holds the version of the Python .venv was built with. A .venv whose Python is older than 3.12, or
# does not run (a symlink to a venv that has gone), is built again from scratch.
VENV_OK := $(shell $(PY) -c 'import sys; print(sys.version_info >= (3, 12))' 2>/dev/null)
ifneq ($(VENV_OK),True)
.venv/.installed: FORCE
endif

.venv/.installed: requirements.txt
	@if [ "$(VENV_OK)" != True ] && [ -e .venv -o -L .venv ]; then \
	  echo "make: .venv's Python is missing or older than 3.12: building .venv again"; rm -rf .venv; fi
	@test -x $(PY) || { python="$$(PYTHON='$(PYTHON)' bash scripts/find-python.sh)" && \
	  echo "make: building .venv with $$python ($$("$$python" --version 2>&1))" && "$$python" -m venv .venv; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -c 'import sys; print(sys.version)' > $@

# The test requirements on top (pytest and friends, which production does not run).
.venv/.installed-dev: .venv/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	touch $@

venv: .venv/.installed

# The embedded default: SQLite under var/, a broker with no server, web + worker + beat in one terminal.
# Recovery is quicker than production's 30 + 30 seconds so the README's tour takes seconds, not a minute.
run: .venv/.installed
	DJANGO_DEBUG=$${DJANGO_DEBUG:-1} \
	PAL_RECOVERY_INTERVAL=$${PAL_RECOVERY_INTERVAL:-5} PAL_LEASE_TTL=$${PAL_LEASE_TTL:-10} \
	$(PY) -m pal.devrun

# The README's kill -9 tour on cue, with `make run` going in another terminal: starts a run of support-triage, kills
# the worker's process group with SIGKILL while it is inside the 20-second `lookup` step, and follows the recovery.
tour: .venv/.installed
	PAL_RECOVERY_INTERVAL=$${PAL_RECOVERY_INTERVAL:-5} PAL_LEASE_TTL=$${PAL_LEASE_TTL:-10} $(PY) -m pal.devtour

# The whole suite, exactly what .ci/run runs, from a fresh clone with nothing configured: builds .venv with the
# test requirements, installs what is missing (scripts/system-deps.sh), and runs the passes below against a
# throwaway PostgreSQL and Redis on free loopback ports (tests/support/servers.py), stopped at the end whatever
# happened. With DATABASE_URL and CELERY_BROKER_URL set it uses those and starts nothing.
# `make test PYTEST_ARGS="tests/runs -x"` runs only those tests (and skips the SQLite pass).
# The suite in PAL_TEST_SHARDS (2) shards at once, each on throwaway servers of its own (tests/support/shards.py);
# with PYTEST_ARGS, those tests in one pass.
test: system-deps .venv/.installed-dev
	$(MAKE) --no-print-directory check
ifeq ($(strip $(PYTEST_ARGS)),)
	$(PY) -m tests.support.shards
else
	$(PY) -m tests.support.servers run -- $(MAKE) --no-print-directory test-here
endif

# Lint, format, types, import layers (pyproject.toml holds every tool's settings) and no missing migration.
# Needs no database: settings fall back to SQLite under a temp folder.
check: .venv/.installed-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	DJANGO_SECRET_KEY=check $(PY) -m mypy
	$(dir $(PY))lint-imports
	env -u DATABASE_URL PAL_VAR_DIR="$$(mktemp -d)" DJANGO_SECRET_KEY=check $(PY) manage.py makemigrations --check --dry-run

# Format and fix what ruff can fix by itself (what .pre-commit-config.yaml runs on a commit's files).
fmt: .venv/.installed-dev
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

system-deps:
	@PYTHON="$$(PYTHON='$(PYTHON)' bash scripts/find-python.sh)" && PYTHON="$$PYTHON" bash scripts/system-deps.sh

# The passes themselves, on whatever DATABASE_URL and CELERY_BROKER_URL say.
# With no PYTEST_ARGS it first runs the engine's unit tests on SQLite, the embedded default of `make run`, then
# everything on DATABASE_URL.
test-here:
ifeq ($(strip $(PYTEST_ARGS)),)
	@$(MAKE) --no-print-directory test-sqlite
	@echo "== the whole suite on DATABASE_URL =="
endif
	DJANGO_SECRET_KEY="$${DJANGO_SECRET_KEY:-test-only-insecure-key}" $(PY) -m pytest $(PYTEST_ARGS)

# The engine's unit tests on SQLite, the embedded default of `make run` (the broker stays: some send to Redis).
test-sqlite:
	@echo "== the engine's tests on SQLite (make run's embedded database) =="
	env -u DATABASE_URL PAL_VAR_DIR="$$(mktemp -d)" DJANGO_SECRET_KEY="$${DJANGO_SECRET_KEY:-test-only-insecure-key}" \
	  $(PY) -m pytest -q -p no:cacheprovider -m "not integration" tests/runs tests/walk tests/services tests/journal tests/pal

# The benchmarks against DBOS Transact and bare Celery (see docs/PERFORMANCE.md): on BENCH_PG_URL / BENCH_REDIS_URL
# when set, else on a throwaway Postgres (fsync and synchronous commits on, as in production) and Redis of its own.
# Scenario E drives the API with wrk (Debian package): installed here if missing and we are root; otherwise
# E is reported as skipped, and everything else still runs.
bench: .venv/.installed
	$(PY) -m pip install --quiet -r requirements-bench.txt
	@command -v wrk >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "bench: installing wrk (apt-get)"; \
	    apt-get install -y -qq wrk >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq wrk >/dev/null 2>&1; } \
	      || echo "bench: could not install wrk: scenario E will be skipped"; \
	  else \
	    echo "bench: wrk not installed and not root: scenario E will be skipped (apt-get install wrk)"; \
	  fi; \
	}
	@if [ -n "$$BENCH_PG_URL" ]; then $(PY) -m bench $(BENCH_ARGS); else \
	  PAL_SERVERS_DURABLE=1 $(PY) -m tests.support.servers run -- sh -c \
	    'BENCH_PG_URL="$$DATABASE_URL" BENCH_REDIS_URL="$${CELERY_BROKER_URL%/*}" exec $(PY) -m bench $(BENCH_ARGS)'; fi
