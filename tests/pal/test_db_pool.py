"""pal.db_pool: the web app's pooled connections are checked by a look at their socket, with a round trip to
Postgres only when the socket has something to say; a connection the server closed is still caught and replaced.

Real Postgres (the test database), a real psycopg pool, a backend really terminated (pg_terminate_backend)."""

import os
import socket
import subprocess
import sys
import tempfile
import time

import psycopg
import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper
from psycopg_pool import ConnectionPool

from pal.db_pool import connection_check, has_input, pool_checks_install

# The pool is Postgres's (PAL_DB_POOL): an integration test, run in make test's Postgres pass.
pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def conninfo():
    assert connection.vendor == "postgresql", "the pool is Postgres's (PAL_DB_POOL)"
    params = connection.get_connection_params()
    keep = ("host", "port", "user", "password", "dbname")
    return " ".join(f"{k}={params[k]}" for k in keep if params.get(k))


def _terminate(conninfo: str, pid: int) -> None:
    """End the backend behind a connection, as a restart or an idle timeout would, and wait until it is gone."""
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]:
            assert time.monotonic() < deadline, f"backend {pid} still there"
            time.sleep(0.02)


def _traced(conn, check) -> bytes:
    """libpq's protocol trace of the check: every message it sent or received."""
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        check(conn)
        conn.pgconn.untrace()
        trace.seek(0)
        return trace.read()


def test_the_look_at_a_socket_sees_a_message_and_the_end_of_the_stream_and_nothing_on_a_quiet_one():
    quiet, peer = socket.socketpair()
    with quiet, peer:
        assert not has_input(quiet.fileno())
        peer.sendall(b"x")
        assert has_input(quiet.fileno())
        quiet.recv(1)
        assert not has_input(quiet.fileno())
        peer.close()
        assert has_input(quiet.fileno())  # the end of the stream


def test_an_idle_healthy_connection_passes_the_check_without_a_round_trip(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT 1")
        assert _traced(conn, ConnectionPool.check_connection) != b""  # psycopg_pool's own: a query
        assert _traced(conn, connection_check) == b""
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_connection_the_server_closed_fails_the_check(conninfo):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        _terminate(conninfo, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            connection_check(conn)


def test_a_pool_with_the_check_replaces_a_terminated_connection_before_handing_it_out(conninfo):
    with ConnectionPool(conninfo, min_size=1, max_size=1, check=connection_check, open=True) as pool:
        with pool.connection() as conn:
            first = conn.info.backend_pid
        _terminate(conninfo, first)
        with pool.connection() as conn:
            assert conn.info.backend_pid != first
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_web_apps_pool_gets_the_check_and_a_pool_without_checks_keeps_none(conninfo):
    settings = {**connection.settings_dict, "CONN_MAX_AGE": 0}
    settings["OPTIONS"] = {**settings["OPTIONS"], "pool": {"min_size": 1, "max_size": 1}}
    checked = DatabaseWrapper({**settings, "CONN_HEALTH_CHECKS": True}, alias="pool_test_checked")
    unchecked = DatabaseWrapper({**settings, "CONN_HEALTH_CHECKS": False}, alias="pool_test_unchecked")
    try:
        assert pool_checks_install(checked) and checked.pool._check is connection_check
        assert not pool_checks_install(unchecked) and unchecked.pool._check is None
        checked.ensure_connection()
        pid = checked.connection.info.backend_pid
        checked.close()  # back to the pool
        _terminate(conninfo, pid)
        checked.ensure_connection()  # the check sees the closed socket: the pool hands out a new connection
        assert checked.connection.info.backend_pid != pid
        with checked.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        checked.close()
    finally:
        checked.close_pool()
        unchecked.close_pool()


def test_the_asgi_app_installs_the_check_on_its_pool():
    assert connection.vendor == "postgresql", "the pool is Postgres's (PAL_DB_POOL)"
    probe = (
        "import pal.asgi; from django.db import connections; from pal.db_pool import connection_check; "
        "print(connections['default'].pool._check is connection_check)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "pal.settings", "PAL_DB_POOL": "1", "PAL_DB_CONN_MAX_AGE": "0"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"
