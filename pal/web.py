"""The web app's ASGI entry (pal/asgi.py): sync views in ONE hop to a fixed pool of threads; async views on Django's
own async handler."""

# Django's ASGIHandler runs a sync view on a new thread per request (ThreadSensitiveContext) and every sync
# middleware's process_request and process_response through sync_to_async, each a hop from the event loop to that
# thread and back, a new thread and a connection taken from and given back to the pool per request
# (docs/PERFORMANCE-code.md).
#
# Here a request whose view is sync (every page and API call but the two event streams) is read from the socket on
# the event loop, then handled whole on one of PAL_WEB_THREADS threads by a handler whose middleware chain is loaded
# in sync mode, as under WSGI: the same middlewares, signals and error answers, one hop. A view that is async (the
# event streams, which must not hold a thread while they idle) still goes through Django's ASGIHandler, unchanged.
# PAL_WEB_SYNC_PATH=0 sends every request there (how scenario E measures the code before this).

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix

from pal.db_pool import kept_connections_install, web_thread_start


class SyncPathHandler(ASGIHandler):
    """ASGIHandler's request parsing and error answers, with the middleware chain loaded for sync views."""

    def __init__(self):
        BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    def respond(self, scope, body_file, resolved=None) -> tuple[int, list[tuple[bytes, bytes]], list[bytes]]:
        """The whole request on the calling (pool) thread: (status, headers, body parts). resolved: (path, match)
        as Application.resolve made them (None: not resolved), which Django then need not resolve again."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=ASGIHandler, scope=scope)
        request, refused = self.create_request(scope, body_file)
        if request is not None and resolved is not None:
            request.__dict__["_pal_match"] = resolved  # resolve_request takes it back
        response: Any = self.get_response(request) if request is not None else refused
        response._handler_class = ASGIHandler
        try:
            # A file (WhiteNoise's static files, the only streaming answers of a sync view) is read here, off the
            # event loop; Django's async handler reads a sync iterator whole as well.
            body = list(response) if response.streaming else [response.content]
            return response.status_code, response_headers(response), body
        finally:
            response.close()  # request_finished: close_old_connections (kept, or given back: pal.db_pool)
            body_file.close()

    def resolve_request(self, request):
        # The match Application.resolve made for this very path, unless a middleware gave the request its own
        # urlconf (or FORCE_SCRIPT_NAME made its path_info another).
        path, match = request.__dict__.pop("_pal_match", (None, None))
        if match is None or path != request.path_info or hasattr(request, "urlconf"):
            return super().resolve_request(request)
        request.resolver_match = match
        return match


def response_headers(response) -> list[tuple[bytes, bytes]]:
    """As ASGIHandler.send_response encodes them: the header's case kept, cookies as Set-Cookie."""
    headers = []
    for header, value in response.items():
        if isinstance(header, str):
            header = header.encode("ascii")
        if isinstance(value, str):
            value = value.encode("latin1")
        headers.append((bytes(header), bytes(value)))
    for cookie in response.cookies.values():
        headers.append((b"Set-Cookie", cookie.output(header="").encode("ascii").strip()))
    return headers


class Application:
    """The ASGI callable: one hop to the pool for a sync view, Django's ASGIHandler for an async one."""

    def __init__(self, django: ASGIHandler):
        self.django = django
        self.sync_path = settings.PAL_WEB_SYNC_PATH
        self.handler = SyncPathHandler()
        threads = settings.PAL_WEB_THREADS
        # Each thread keeps its database connection across requests when the pool has room for all (pal.db_pool).
        keeps = self.sync_path and kept_connections_install(threads=threads)
        self.threads = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="pal-web", initializer=web_thread_start if keeps else None
        )
        if self.sync_path:
            from runs import dispatch  # once Django is set up (pal.asgi imports this module before)

            dispatch.drive_sender_start()  # new runs' messages sent by a thread of their own, several at a time

    def resolve(self, scope) -> tuple[str, ResolverMatch | None]:
        """(the address Django resolves (ASGIRequest.path_info), its match or None when nothing matches)."""
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        try:
            return path, get_resolver().resolve(path)
        except Resolver404:
            return path, None  # Django's 404 answer is sync

    def view_is_async(self, scope) -> bool:
        match = self.resolve(scope)[1]
        return match is not None and iscoroutinefunction(match.func)

    async def __call__(self, scope, receive, send):
        if not self.sync_path or scope["type"] != "http":
            return await self.django(scope, receive, send)
        path, match = self.resolve(scope)
        if match is not None and iscoroutinefunction(match.func):
            return await self.django(scope, receive, send)
        try:
            body_file = await self.handler.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        answer = self.handler.respond
        resolved = (path, match) if match is not None else None
        status, headers, body = await loop.run_in_executor(self.threads, answer, scope, body_file, resolved)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        last = len(body) - 1
        for index, part in enumerate(body):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})
        if not body:
            await send({"type": "http.response.body"})
