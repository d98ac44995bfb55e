"""The web process while the database is away: every call answers 503 at once, and serving resumes as soon as the
database is back (docs/reference/api.md, "Errors"; docs/OPERATIONS.md, "While the database or the broker is away")."""

# Found away (a request's database error, or a kept connection that the server closed, after which a fresh
# connection is refused), the database is looked at again at most every LOOK_EVERY seconds, by one request at a time
# opening a connection of its own; meanwhile every other request is answered 503 unavailable (Retry-After) without
# waiting on the pool (docs/PERFORMANCE-code.md). pal.settings gives the pool a short
# reconnect_timeout, so a request once the database is back makes it connect.

import sys
import threading
import time

import psycopg
from django.db import connections
from django.db.utils import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from django.template.loader import render_to_string
from psycopg_pool import PoolTimeout

API_PREFIX = "/api/"  # where the REST API answers (pal.urls): JSON errors there; pal.middleware reads it here
LOOK_EVERY = 0.25  # seconds between looks at a database that is away
LOOK_TIMEOUT = 2  # seconds a look waits for a connection (libpq's least connect_timeout)
RETRY_AFTER = 1  # seconds, the Retry-After of a 503
# A database error that says the connection (or the server) went, not that a statement was wrong: the walk leaves
# the run to the sweep uncounted; any other database error (DataError, IntegrityError, ...) is a bug, counted.
CONNECTION_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
DETAIL = (
    "the database is away ({why}); try again in a moment: a call sent again with the same Idempotency-Key is safe "
    "(it never makes or does anything twice)"
)


class _State:
    """What the last look found: away (with why) or not, and when the next look is due."""

    def __init__(self):
        self.why: str | None = None  # None: not known to be away
        self.looked_at = 0.0
        self.looking = threading.Lock()  # one look at a time; the other requests answer from the last one

    def look(self) -> str | None:
        """Open a connection of our own and close it: None when the database accepts one, else why not."""
        why: str | None = None
        try:
            params = connections["default"].get_connection_params()
            psycopg.connect(**{**params, "connect_timeout": LOOK_TIMEOUT}).close()
        except psycopg.Error as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        self.why, self.looked_at = why, time.monotonic()
        return why

    def away(self, *, now: bool = False) -> str | None:
        """Why the database is away, or None. A look is made when one is due (now: even when not known away) and
        no other thread is making one; otherwise the last look's finding is the answer. Postgres only."""
        if (self.why is None and not now) or connections["default"].vendor != "postgresql":
            return None
        if time.monotonic() - self.looked_at < LOOK_EVERY:
            return self.why
        if not self.looking.acquire(blocking=False):
            return self.why
        try:
            return self.look()
        finally:
            self.looking.release()


state = _State()


def database_away() -> str | None:
    """Why the database is known to be away (looking again when a look is due), or None."""
    return state.away()


def database_suspect() -> None:
    """Something says the database may have gone (a kept connection closed by the server): look now."""
    state.away(now=True)


def detail(why: str) -> str:
    return DETAIL.format(why=why)


def refusal_after(exc: BaseException | None) -> str | None:
    """The 503's detail when exc (a request's error) is a database error and a look finds the database away, or
    the pool gave no connection in time (a pool too small for the load: a retry is as safe); else None."""
    if not isinstance(exc, CONNECTION_ERRORS):
        return None
    why = state.away(now=True)
    if why:
        return detail(why)
    if isinstance(exc, PoolTimeout) or isinstance(exc.__cause__, PoolTimeout):
        return (
            f"no database connection was free ({exc.__cause__ or exc}; the pool holds PAL_DB_POOL_SIZE); try again in "
            "a moment: a call sent again with the same Idempotency-Key is safe (it never makes or does anything twice)"
        )
    return None


def api_unavailable(text: str) -> JsonResponse:
    response = JsonResponse({"detail": text, "code": "unavailable"}, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


def page_unavailable(request, text: str) -> HttpResponse:
    """The 503 of a page: a line of text for htmx (its flash bar), else a page that reads nothing from the database
    (no user, no session: rendered without the request's context processors)."""
    if request.headers.get("HX-Request") == "true":
        response = HttpResponse(f"Unavailable: {text}", content_type="text/plain; charset=utf-8", status=503)
    else:
        response = HttpResponse(render_to_string("503.html", {"detail": text}), status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    return response


def unavailable(request, text: str) -> HttpResponse:
    """The 503 with this detail, JSON for the API, a page elsewhere."""
    if request.path_info.startswith(API_PREFIX):
        return api_unavailable(text)
    return page_unavailable(request, text)


def unavailable_after_error(request) -> HttpResponse | None:
    """In handler500: the 503 when the error being handled is the database's going away, else None."""
    text = refusal_after(sys.exc_info()[1])
    return unavailable(request, text) if text else None
