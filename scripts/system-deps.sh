#!/usr/bin/env bash
# What `make test` needs from the system besides Python: PostgreSQL and Redis (the throwaway servers, and the private
# ones that the PgBouncer, failover and broker tests start even when DATABASE_URL / CELERY_BROKER_URL name shared
# servers), PgBouncer and RabbitMQ (tests that start their own), Chromium
# (tests/ui), and libfaketime with a C compiler (workers whose clocks disagree: tests/support/faketime.py). As root
# on Debian the missing ones are installed with apt-get (its package lists are refreshed only when something must be
# installed); otherwise this prints the one command to run and fails.
set -euo pipefail

missing=()
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  missing+=(postgresql)
fi
command -v redis-server >/dev/null || missing+=(redis-server)
command -v curl >/dev/null || missing+=(curl)  # tests/docs/test_tutorial.py runs the tutorial's curl commands
[ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)  # tests/durability/test_pgbouncer.py, in front of a Postgres of its own
[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || missing+=(rabbitmq-server)  # the broker-loss tests on RabbitMQ
[ -x /usr/bin/chromium ] || missing+=(chromium)  # the path tests/ui/test_browser.py launches
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || missing+=(faketime)
command -v cc >/dev/null || command -v gcc >/dev/null || missing+=(gcc)
"${PYTHON:-python3}" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)

[ ${#missing[@]} -eq 0 ] && exit 0

command="apt-get install -y ${missing[*]}"
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  printf 'make test needs %s. Install them, then run make test again:\n\n    sudo apt-get update && sudo %s\n\n' \
    "${missing[*]}" "$command" >&2
  exit 1
fi
echo "make test: installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
