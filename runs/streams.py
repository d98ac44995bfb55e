"""The live event stream of a run (GET /runs/{id}/events/stream): server-sent events on the ASGI app."""

# An open stream holds no thread and no database connection of its own while it waits:
# - its database reads run on a small shared pool of threads (PAL_STREAM_DB_THREADS), each with its own
# connection, instead of Django's async ORM, which under ASGI gives every request a thread and a connection
# of its own for as long as the request lasts (a thousand streams would be a thousand connections);
# - one watcher task per process looks for new events of every open stream in ONE query per tick
# (PAL_STREAM_POLL_INTERVAL) and wakes only the streams whose run has a new seq.
#
# A stream replays from its start seq, follows live, sends a keep-alive comment when idle for
# PAL_STREAM_KEEPALIVE seconds, and closes after the run's final event (run_succeeded / run_failed /
# run_cancelled) once the run is really over (a retried run goes on).

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from asgiref.sync import AsyncToSync, SyncToAsync
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Max

from journal.models import JournalEvent
from journal.selectors import FINAL_KINDS, events_for_run
from pal.db_threads import in_db_thread

from .models import FINAL_STATUSES, Run

log = logging.getLogger("pal.streams")
BATCH = 500

# --- the watcher ----------------------------------------------------------------------------------


def _max_seqs(run_ids: list[str]) -> dict[str, int]:
    rows = JournalEvent.objects.filter(run_id__in=run_ids).values("run_id").annotate(top=Max("seq"))
    return {str(row["run_id"]): row["top"] for row in rows}


class JournalWatcher:
    """Wakes waiting streams when their run's journal passes the seq they have sent. One per event loop."""

    def __init__(self):
        self._waiters: dict[str, list[tuple[int, asyncio.Future]]] = {}
        self._task: asyncio.Task | None = None

    async def wait(self, run_id: str, after_seq: int, timeout: float) -> bool:
        """True when the run has an event past after_seq, False after timeout."""
        future = asyncio.get_running_loop().create_future()
        entry = (after_seq, future)
        self._waiters.setdefault(run_id, []).append(entry)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(run_id, [])
            if entry in waiters:
                waiters.remove(entry)
            if not waiters:
                self._waiters.pop(run_id, None)

    async def _loop(self):
        while self._waiters:
            await asyncio.sleep(settings.PAL_STREAM_POLL_INTERVAL)
            run_ids = list(self._waiters)
            if not run_ids:
                break
            try:
                tops = await in_db_thread(_max_seqs, run_ids)
            except Exception:  # the database may be away for a moment: the streams wait for the next tick
                log.warning("event stream watcher could not read the journal", exc_info=True)
                continue
            for run_id in run_ids:
                top = tops.get(run_id, 0)
                for after_seq, future in self._waiters.get(run_id, []):
                    if top > after_seq and not future.done():
                        future.set_result(True)


_watchers: dict[asyncio.AbstractEventLoop, JournalWatcher] = {}


def watcher() -> JournalWatcher:
    loop = asyncio.get_running_loop()
    if loop not in _watchers:
        for old in [other for other in _watchers if other.is_closed()]:
            del _watchers[old]
        _watchers[loop] = JournalWatcher()
    return _watchers[loop]


# --- the stream -----------------------------------------------------------------------------------


def event_dict(event: JournalEvent) -> dict:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "step_id": event.step_id,
        "attempt": event.attempt,
        "payload": event.payload,
        "created_at": event.created_at,
    }


def sse_message(event: JournalEvent, *, named: bool = True) -> str:
    """One event. named=False leaves out the `event:` line, so a browser's EventSource gets every event as a
    "message" (it only hands named events to listeners of that very name, and custom kinds are open-ended)."""
    data = json.dumps(event_dict(event), cls=DjangoJSONEncoder, separators=(",", ":"))
    name = f"event: {event.kind}\n" if named else ""
    return f"id: {event.seq}\n{name}data: {data}\n\n"


def _run_is_over(run_id) -> bool:
    return Run.objects.filter(id=run_id, status__in=FINAL_STATUSES).exists()


def _release_request_thread() -> None:
    """Give back the thread Django's ASGI handler keeps for this request's synchronous parts."""
    # asgiref gives every ASGI request an executor thread of its own the first time a synchronous part runs (the
    # request_started signal always does), and keeps it until the request ends: for a stream that lasts an hour,
    # an idle thread per open stream. Once the view has answered, nothing synchronous runs until the end of the
    # request, and that part (request_finished) simply gets a new thread then.
    try:
        context = SyncToAsync.thread_sensitive_context.get(None)
        executor = SyncToAsync.context_to_thread_executor.pop(context, None) if context is not None else None
    except (AttributeError, TypeError):  # another asgiref: keep the thread, lose nothing else
        return
    if executor is not None:
        executor.shutdown(wait=False)


async def sse_events(*, run_id, after_seq: int, named: bool = True) -> AsyncIterator[str]:
    """The text of the stream: replay after after_seq, then live; ends once the run is over.

    A database failure ends the stream (the client reconnects with Last-Event-ID and loses nothing)."""
    if getattr(AsyncToSync.executors, "current", None) is None:  # under ASGI, not a sync server's thread
        _release_request_thread()
    try:
        async for chunk in _follow(run_id=run_id, after_seq=after_seq, named=named):
            yield chunk
    except Exception:
        log.warning("event stream of run %s ends on an error", run_id, exc_info=True)


async def _follow(*, run_id, after_seq: int, named: bool = True) -> AsyncIterator[str]:
    run_key = str(run_id)
    last = after_seq
    check_end = True  # at the start (a reconnect after the end) and after each final event
    yield "retry: 1000\n\n"  # EventSource reconnects after a second, sending Last-Event-ID
    idle_since = time.monotonic()
    while True:
        rows = await in_db_thread(events_for_run, run_id=run_id, after_seq=last, limit=BATCH)
        for event in rows:
            yield sse_message(event, named=named)
            last = event.seq
            if event.kind in FINAL_KINDS:
                check_end = True
        if rows:
            idle_since = time.monotonic()
        if len(rows) == BATCH:
            continue
        if check_end:
            check_end = False
            if await in_db_thread(_run_is_over, run_id):
                return
        left = settings.PAL_STREAM_KEEPALIVE - (time.monotonic() - idle_since)
        if left <= 0:
            yield ": keep-alive\n\n"
            idle_since = time.monotonic()
            continue
        await watcher().wait(run_key, last, left)
