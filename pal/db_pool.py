"""The web app's connection pool (PAL_DB_POOL, pal/asgi.py): a connection handed out is checked without a round trip
when nothing says it is broken."""

# Django gives its psycopg pool psycopg_pool's own check (CONN_HEALTH_CHECKS): an empty query, one round trip to
# Postgres at every request before the request's first statement (docs/PERFORMANCE-code.md). A
# connection that the server has closed since it went back to the pool (a restart, pg_terminate_backend,
# idle_session_timeout, a crashed backend) has something to read on its socket: Postgres sends the reason before it
# closes, and the kernel the end of the stream. So the check here asks the socket first (one poll, no wait) and makes
# the round trip only when there is something to read or the connection is already known broken; a connection that fails
# it is replaced by the pool, as before.

import ctypes
import select
import threading
import time
from typing import Any

from django.conf import settings
from django.core.signals import request_started
from django.db import connections
from django.db.backends.signals import connection_created
from psycopg_pool import ConnectionPool

from pal import db_away


def connection_check(conn) -> None:
    """psycopg_pool's `check`: raise when the connection is not usable; quiet, and no round trip, when its socket
    is idle."""
    if conn.closed or conn.broken:
        ConnectionPool.check_connection(conn)  # raises: the pool discards it
        return
    if has_input(conn.fileno()):
        ConnectionPool.check_connection(conn)  # a message or the end of the stream: ask the server


# The look is poll(2) with no timeout, made through ctypes.PyDLL, which keeps the GIL for the call: select.poll
# gives the GIL up around every poll, even one that cannot wait, and under load (pal.web's threads taking turns at
# one GIL) each give-up is a switch to another thread and a wait to get it back, at every request's start
# (docs/PERFORMANCE-code.md). Where libc has no poll to call, select.poll does it.
class _PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


_poll: Any = None
try:
    _poll = ctypes.PyDLL(None).poll
    _poll.argtypes = [ctypes.POINTER(_PollFd), ctypes.c_ulong, ctypes.c_int]
    _poll.restype = ctypes.c_int
except (OSError, AttributeError):  # no libc poll to be found
    _poll = None

_LOOKED_FOR = select.POLLIN | select.POLLPRI


def has_input(fd: int) -> bool:
    """Whether the socket fd has something to read (a message, the end of the stream) or an error, now."""
    if _poll is None:
        waiting = select.poll()
        waiting.register(fd, _LOOKED_FOR)
        return bool(waiting.poll(0))
    return _poll(ctypes.byref(_PollFd(fd, _LOOKED_FOR, 0)), 1, 0) != 0  # -1, an error: the round trip decides


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


# --- a web thread keeps its connection ------------------------------------------------------------
#
# pal.web handles every sync request on one of PAL_WEB_THREADS fixed threads. Giving the connection back to the pool
# at each request's end (close_old_connections with CONN_MAX_AGE 0) and taking one again at the next request's
# first statement cost a pool checkout, a check and a give-back per request (about a tenth of a GET /runs/{id} in
# the server: docs/PERFORMANCE.md, E). A fixed thread is what a WSGI worker is, so it keeps its connection as a
# WSGI worker does (CONN_MAX_AGE None): Django's close_old_connections still gives it back at a request's end when
# the request left it unusable or outside autocommit, and at a request's start the socket look above replaces
# Django's health check (a round trip): a connection the server has closed meanwhile is given back (the pool
# discards it) and the request takes a fresh one.

_web_thread = threading.local()


def web_thread_start() -> None:
    """The initializer of pal.web's threads: connections opened on this thread are kept across requests."""
    _web_thread.keeps = True


def keeps_connections() -> bool:
    return getattr(_web_thread, "keeps", False)


def _kept_on_connect(sender, connection, **kwargs) -> None:
    if keeps_connections() and getattr(connection, "pool", None) is not None:
        connection.close_at = None  # close_old_connections no longer closes it at each request's end


def _kept_checked_at_request_start(**kwargs) -> None:
    """After Django's close_old_connections (connected before this): the look at the socket instead of Django's
    health check at the first statement."""
    if not keeps_connections():
        return
    for wrapper in connections.all(initialized_only=True):
        raw = wrapper.connection
        if raw is None or getattr(wrapper, "pool", None) is None:
            continue
        if getattr(raw, "_expire_at", float("inf")) <= time.monotonic():
            wrapper.close()  # past the pool's max_lifetime: the pool closes it and opens another, as for any
            continue
        try:
            connection_check(raw)
        except Exception:  # closed by the server, or broken: the pool discards it, the request takes another
            wrapper.close()
            db_away.database_suspect()  # a restart, or the database going away: if so, 503 at once (pal.db_away)
            continue
        # Django's health check (CONN_HEALTH_CHECKS: a round trip at the first statement) is this look's to make.
        wrapper.health_check_done = True  # type: ignore[attr-defined]


def kept_connections_install(*, threads: int) -> bool:
    """Let pal.web's `threads` keep their connections, when the pool can hold them all beside the event stream's
    threads (which keep theirs, pal.db_threads) with room to spare for everything else; else each request gives
    its connection back, as before. Returns whether they keep them."""
    options = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if not isinstance(options, dict) or threads + settings.PAL_STREAM_DB_THREADS >= options.get("max_size", 0):
        return False
    connection_created.connect(_kept_on_connect, dispatch_uid="pal.db_pool.kept_on_connect")
    request_started.connect(_kept_checked_at_request_start, dispatch_uid="pal.db_pool.kept_checked")
    return True
