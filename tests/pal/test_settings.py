"""A bad setting stops start-up with a message naming the variable (docs/reference/settings.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_django(probe: str = "", **env):
    """Import the settings in a fresh interpreter, as manage.py, a worker or uvicorn would, then run `probe`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAL_", "DJANGO_", "EMAIL_"))}
    clean.update(DJANGO_SETTINGS_MODULE="pal.settings", PAL_VAR_DIR="/tmp/pal-settings-test", **env)
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + probe],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("PAL_LEASE_TTL", "abc", "must be a number"),
        ("PAL_RECOVERY_INTERVAL", "-5", "at least"),
        ("PAL_MAX_CHILD_DEPTH", "2.5", "whole number"),
        ("PAL_LLM_BASE_URL", "ftp://example", "http://"),
        ("DATABASE_URL", "mysql://u:p@h/db", "postgres://"),
        ("CELERY_BROKER_URL", "kafka://localhost:9092", "amqp://"),
        ("DJANGO_DEBUG", "maybe", "true or false"),
        ("PAL_AGENTS", "[1, 2]", "PAL_AGENTS"),
        ("PAL_LLM_PRICES", "not json", "must be JSON"),
        ("EMAIL_PORT", "99999", "at most"),
        ("PAL_SWEEP_HISTORY", "lots", "whole number"),
        ("PAL_SWEEP_HISTORY", "0", "at least 1"),
    ],
)
def test_a_bad_value_stops_start_up_naming_the_variable(name, value, words):
    result = start_django(**{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr
    assert words in result.stderr


def test_good_values_start():
    result = start_django(
        PAL_LEASE_TTL="12.5",
        PAL_RECOVERY_INTERVAL="3",
        PAL_MAX_CHILD_DEPTH="2",
        DJANGO_DEBUG="yes",
        PAL_AGENTS='{"x": "python -c pass"}',
    )
    assert result.returncode == 0, result.stderr


def test_the_embedded_sqlite_database_fsyncs_every_commit(tmp_path):
    """synchronous=FULL (2) in WAL mode: a commit that returned survives a power cut, so a claimed side effect
    is never rolled back and sent again after the reboot."""
    probe = (
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    cursor.execute('PRAGMA synchronous'); sync = cursor.fetchone()[0]\n"
        "    cursor.execute('PRAGMA journal_mode'); mode = cursor.fetchone()[0]\n"
        "print(connection.vendor, sync, mode)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAL_", "DJANGO_", "EMAIL_"))}
    clean.update(
        DJANGO_SETTINGS_MODULE="pal.settings",
        PAL_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'pal.sqlite3'}",
    )
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + probe],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["sqlite", "2", "wal"]


def _postgres_settings(**env) -> dict:
    probe = "import json; from django.conf import settings; print(json.dumps(settings.DATABASES['default']))"
    result = start_django(probe, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_behind_pgbouncer_no_statement_is_prepared_and_no_cursor_held():
    db = _postgres_settings(DATABASE_URL="postgres://u:p@127.0.0.1:6432/pal", PAL_DB_PGBOUNCER="true")
    assert db["OPTIONS"]["prepare_threshold"] is None
    assert db["DISABLE_SERVER_SIDE_CURSORS"] is True


def test_behind_pgbouncer_statements_are_prepared_when_told_to():
    db = _postgres_settings(
        DATABASE_URL="postgres://u:p@127.0.0.1:6432/pal", PAL_DB_PGBOUNCER="1", PAL_DB_PREPARE="true"
    )
    assert db["OPTIONS"]["prepare_threshold"] == 5


def test_without_pgbouncer_statements_are_prepared_and_cursors_may_be_held():
    db = _postgres_settings(DATABASE_URL="postgres://u:p@127.0.0.1:5432/pal")
    assert db["OPTIONS"]["prepare_threshold"] == 5
    assert db["DISABLE_SERVER_SIDE_CURSORS"] is False


def test_a_multi_host_database_url_gives_libpq_every_host_and_port():
    db = _postgres_settings(
        DATABASE_URL="postgres://pal:pw@10.0.0.1:5433,db2.internal:5434/pal?target_session_attrs=read-write"
    )
    assert (db["HOST"], db["PORT"], db["NAME"], db["USER"]) == ("10.0.0.1,db2.internal", "5433,5434", "pal", "pal")
    assert db["OPTIONS"]["target_session_attrs"] == "read-write"


def test_a_multi_host_database_url_with_a_bad_port_stops_start_up_naming_it():
    result = start_django(DATABASE_URL="postgres://pal:pw@h1:5433,h2:port/pal")
    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr and "'h2:port'" in result.stderr
