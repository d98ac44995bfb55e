"""The web app's connection pool (PAL_DB_POOL, pal/asgi.py): a connection handed out is checked without a round trip
when nothing says it is broken.

Django gives its psycopg pool psycopg_pool's own check (CONN_HEALTH_CHECKS): an empty query, one round trip to
Postgres at every request before the request's first statement (a quarter of a GET /runs/{id}'s statements, and
the server's CPU for each; docs/PERFORMANCE.md, E). A connection that the server has closed since it went back to
the pool (a restart, pg_terminate_backend, idle_session_timeout, a crashed backend) has something to read on its
socket: Postgres sends the reason before it closes, and the kernel the end of the stream. So the check here asks the
socket first (one poll, no wait) and makes the round trip only when there is something to read or the connection
is already known broken; a connection that fails it is replaced by the pool, as before.
"""

import select

from psycopg_pool import ConnectionPool


def connection_check(conn) -> None:
    """psycopg_pool's `check`: raise when the connection is not usable; quiet, and no round trip, when its socket
    is idle."""
    if conn.closed or conn.broken:
        ConnectionPool.check_connection(conn)  # raises: the pool discards it
        return
    waiting = select.poll()
    waiting.register(conn.fileno(), select.POLLIN | select.POLLPRI)
    if waiting.poll(0):
        ConnectionPool.check_connection(conn)  # a message or the end of the stream: ask the server


def pool_checks_install(wrapper) -> bool:
    """Make the pool of this Django connection (when it has one) check with connection_check. Django passes its own
    check to the pool it makes and takes no other (OPTIONS["pool"]["check"] would be given twice), so it is set on
    the pool made but not yet opened; a pool without checks (CONN_HEALTH_CHECKS off) keeps none. Returns whether
    it was set."""
    pool = getattr(wrapper, "pool", None)
    if pool is None or getattr(pool, "_check", None) is None:
        return False
    pool._check = connection_check
    return True
