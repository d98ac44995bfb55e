"""A small shared pool of threads, each with its own database connection, for async code's database reads (the
event stream, the token check of an async view): PAL_STREAM_DB_THREADS threads however many requests wait on them,
instead of a thread and a connection per open request."""

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from asgiref.sync import AsyncToSync, sync_to_async
from django.conf import settings
from django.db import connection

_executor: ThreadPoolExecutor | None = None


def shared_pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=settings.PAL_STREAM_DB_THREADS, thread_name_prefix="pal-stream-db")
    return _executor


def _call(fn, *args, **kwargs):
    # A pool thread keeps its connection for good (CONN_MAX_AGE is 0 under ASGI for request threads; applying
    # it here would reconnect on every read): only a connection that failed is checked and replaced.
    if connection.connection is not None and connection.errors_occurred and not connection.is_usable():
        connection.close()
    try:
        return fn(*args, **kwargs)
    except Exception:
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        raise


async def in_db_thread(fn, *args, **kwargs):
    """Run a synchronous database function on the shared stream threads.

    When a sync server drives this async code (WSGI, Django's test client), its request thread waits for us
    anyway: the call runs there, on that thread's connection (a test's open transaction is only seen there)."""
    if getattr(AsyncToSync.executors, "current", None) is not None:
        return await sync_to_async(partial(fn, *args, **kwargs), thread_sensitive=True)()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(shared_pool(), partial(_call, fn, *args, **kwargs))
