"""The API's edge: a body-size limit and JSON errors for what Django answers before (or instead of) ninja; and
every request's answer while the database is away (DatabaseAwayMiddleware)."""

# Under /api/ only:
# - a body larger than PAL_API_MAX_BODY_BYTES is refused with 413 before anything parses it: at once from its
# Content-Length, or after reading one byte past the limit when it comes chunked;
# - text that PostgreSQL cannot store (NUL, an unpaired surrogate) in the JSON body, a header, the path or the
# query is refused with 422 naming where, before any call sees it (one check for every entry point);
# - an error answer that is not JSON (Django's 404 for an unknown address, ninja's 405, a 500) becomes
# {"detail", "code"} like every other error of the API.

import io
import json
import logging
import os
import re
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from axes.helpers import get_lockout_response
from axes.middleware import AxesMiddleware
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import Resolver404, resolve
from django_htmx.middleware import HtmxMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware

from journal.text import first_nonfinite, first_unstorable, loads_marking_nonfinite
from pal import db_away
from pal.db_away import API_PREFIX

log = logging.getLogger("pal.api")

CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "throttled",
    500: "internal_error",
}
DETAILS = {
    404: "there is no such address in the API",
    405: "this address does not answer that method",
    500: "internal error: the server failed; the request may be retried",
}


def error(status: int, detail: str, code: str | None = None) -> JsonResponse:
    return JsonResponse({"detail": detail, "code": code or CODES.get(status, "error")}, status=status)


def body_limit_response(request):
    """413 when the body is larger than the limit, else None (and the body is read and kept for the view)."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    limit = settings.PAL_API_MAX_BODY_BYTES
    too_large = error(413, f"the request body is larger than {limit} bytes (PAL_API_MAX_BODY_BYTES)")
    raw_length = request.META.get("CONTENT_LENGTH") or ""
    if raw_length:
        try:
            length = int(raw_length)
        except ValueError:
            return error(400, f"Content-Length {raw_length!r} is not a number")
        if length > limit:
            return too_large
    if not hasattr(request, "_body"):
        # Read past the limit by one byte at most, whatever Content-Length said (a chunked body has none);
        # Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check would answer 400, not 413.
        data = request.read(limit + 1)
        if len(data) > limit:
            return too_large
        request._body = data
        request._stream = io.BytesIO(data)
    return None


# In a JSON body: an escaped NUL or surrogate (either case of hex), or a surrogate's raw UTF-8-style bytes.
_SUSPECT_BODY = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])|\xed[\xa0-\xbf]")


def _in_path_parameter(request) -> tuple[str, str] | None:
    """The path parameter that holds it, named like ninja's ("path.id"), when the address matches a call."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None
    return first_unstorable({name: str(value) for name, value in match.kwargs.items()}, "path")


# Naming the headers one by one (request.headers) on every call was about 4 % of a GET's CPU (docs/PERFORMANCE-code.md).
def _headers_suspect(meta: dict) -> bool:
    """Whether any text of the request's environ (its headers among it) holds an unstorable character: one search
    over all of it, so that the headers are named one by one (request.headers) only when one may be to blame."""
    return (
        first_unstorable("\n".join(f"{key}\n{value}" for key, value in meta.items() if isinstance(value, str)))
        is not None
    )


def _unstorable_in(request) -> tuple[str, str] | None:
    """Where the request first holds text Postgres cannot store (or its JSON body a number no JSON column holds),
    named like ninja's validation errors."""
    found = first_unstorable(request.path, "path")
    if found is not None:
        found = _in_path_parameter(request) or found
    if found is None and _headers_suspect(request.META):
        found = first_unstorable(dict(request.headers), "header")
    if found is None and request.GET:
        found = first_unstorable({key: request.GET.getlist(key) for key in request.GET}, "query")
    if found is None and request.method not in ("GET", "HEAD", "OPTIONS"):
        body = request.body
        # Such text reaches a JSON body only as an escape ("\u0000", "\uD800") or as raw surrogate bytes (json
        # decodes bytes with surrogatepass): a body with neither is not parsed here, so the cost is a scan.
        if (b"\\u" in body or b"\xed" in body) and _SUSPECT_BODY.search(body):
            try:
                value = json.loads(body)
            except ValueError:
                return None  # not JSON: the call answers 400 malformed_json
            found = first_unstorable(value)
            if found is not None and not found[0]:
                found = ("body", found[1])
        if found is None and _SUSPECT_NUMBER.search(body):
            found = _nonfinite_in(body)
    return found


# In a JSON body: what Python's json reads as a number no JSON column stores (NaN, Infinity, 1e999 as inf) or
# refuses itself (a whole number of thousands of digits). A body with none of them is not parsed here.
_SUSPECT_NUMBER = re.compile(rb"NaN|Infinity|[0-9][eE]\+?[0-9]{3}|[0-9]{300}")


def _nonfinite_in(body: bytes) -> tuple[str, str] | None:
    try:
        value = loads_marking_nonfinite(body)
    except ValueError:
        return None  # not JSON: the call answers 400 malformed_json
    found = first_nonfinite(value)
    if found is not None and not found[0]:
        found = ("body", found[1])
    return found


def unstorable_response(request):
    """422 validation_error naming the field that holds a NUL, an unpaired surrogate or a non-finite number."""
    found = _unstorable_in(request)
    if found is None:
        return None
    loc, msg = found
    return JsonResponse(
        {"detail": f"{loc}: {msg}", "code": "validation_error", "errors": [{"loc": loc, "msg": msg}]}, status=422
    )


def jsonify(response):
    """An error answer that is not JSON becomes {"detail", "code"}; headers like Allow are kept."""
    if response.status_code < 400 or response.streaming:
        return response
    if response.get("Content-Type", "").startswith("application/json"):
        return response
    status = response.status_code
    replaced = error(status, DETAILS.get(status, f"HTTP {status}"))
    for header in ("Allow", "WWW-Authenticate", "Retry-After", "X-Frame-Options"):  # set by a middleware within
        if header in response:
            replaced[header] = response[header]
    return replaced


class ApiMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        refused = body_limit_response(request) or unstorable_response(request)
        if refused is not None:
            return refused
        return jsonify(self.get_response(request))

    async def __acall__(self, request):
        if not request.path.startswith(API_PREFIX):
            return await self.get_response(request)
        refused = body_limit_response(request) or unstorable_response(request)
        if refused is not None:
            return refused
        return jsonify(await self.get_response(request))


class DatabaseAwayMiddleware:
    """While the database is known to be away (pal.db_away), a 503 at once, without waiting on the pool: JSON
    under /api/, a page (or htmx's line) elsewhere. /health passes: it reports the database itself. An async
    request (the event streams) makes its look on a thread, never on the event loop."""

    sync_capable = True
    async_capable = True
    PASSES = ("/api/v1/health",)

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        why = None if request.path_info in self.PASSES else db_away.database_away()
        return db_away.unavailable(request, db_away.detail(why)) if why else self.get_response(request)

    async def __acall__(self, request):
        why = None
        if db_away.state.why is not None and request.path_info not in self.PASSES:
            why = await sync_to_async(db_away.database_away, thread_sensitive=False)()  # a look: off the event loop
        return db_away.unavailable(request, db_away.detail(why)) if why else await self.get_response(request)


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, able to run in an async chain.

    WhiteNoise 6 is sync-only; one sync middleware makes Django run the whole stack under ASGI through
    async_to_sync, so the event stream's async view would hold a thread and a database connection per open
    stream. Finding a static file is a dictionary lookup (or a stat under make run), fine on the event loop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        super().__init__(get_response)
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def add_files(self, root, prefix=None):
        # Until collectstatic has made STATIC_ROOT, settings serve from the apps (WHITENOISE_USE_FINDERS):
        # a missing STATIC_ROOT is that plan, not a mistake for WhiteNoise to warn "No directory at" about.
        # (Under autorefresh WhiteNoise only notes the folder, and a collectstatic later is still seen.)
        missing_root = root == self.static_root and not os.path.isdir(root)
        if missing_root and self.use_finders and not self.autorefresh:
            return
        super().add_files(root, prefix)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        return super().__call__(request)

    async def __acall__(self, request):
        if self.autorefresh:
            static_file = self.find_file(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return self.serve(static_file, request)
        return await self.get_response(request)


# --- the pages' middlewares, which API calls pass by ---------------------------------------------------------
#
# A call under /api/ authenticates by its Bearer token alone (tokens.auth) and answers JSON: it has no session, no
# CSRF cookie, no messages and no htmx. Django's middlewares for those still run on each call (a session store,
# a cookie signer for the messages, lazy user objects: about a twentieth of a GET /runs/{id}'s CPU), so each is
# used here through a subclass that hands an API call straight to the next. Subclasses, so that Django's checks
# (the admin's, for sessions, auth and messages) still find them; a page goes through them as before. That no API
# call can reach request.user or a session also keeps a browser's login cookie from ever driving the API.


class PagesOnly:
    """A page middleware's mixin: a request under /api/ passes by (sync or async: the next one's answer, or the
    coroutine that gives it, as it is)."""

    get_response: Any

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]


class PageSessionMiddleware(PagesOnly, SessionMiddleware):
    pass


class PageCsrfViewMiddleware(PagesOnly, CsrfViewMiddleware):
    def process_view(self, request, callback, callback_args, callback_kwargs):
        if request.path_info.startswith(API_PREFIX):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)


class PageAuthenticationMiddleware(PagesOnly, AuthenticationMiddleware):
    pass


class PageMessageMiddleware(PagesOnly, MessageMiddleware):
    pass


class PageHtmxMiddleware(PagesOnly, HtmxMiddleware):
    pass


class PageAxesMiddleware(PagesOnly, AxesMiddleware):
    """django-axes' lockout answer for the pages (an API call's bad tokens are tokens.auth's). Its async path
    handed the credentials where the response goes (django-axes 8.3.1): here both paths call it alike."""

    async def __acall__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return await self.get_response(request)
        response = await self.get_response(request)
        if getattr(settings, "AXES_ENABLED", True) and getattr(request, "axes_locked_out", None):
            credentials = getattr(request, "axes_credentials", None)
            response = await sync_to_async(get_lockout_response, thread_sensitive=True)(request, response, credentials)
        return response
