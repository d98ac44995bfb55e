"""The run lease: the one place that reads or writes run_locks."""

# Every operation is a single conditional write whose row count (or RETURNING) says who won:
# - lease_reserve: the sweep (or a creator) books the run for one Celery task id, stealing only an expired lease;
# - lease_acquire: the worker that received that task converts the booking to its own name;
# - lease_heartbeat: one UPDATE per worker process per beat for the leases its walks are using;
# - lease_handoff / lease_release: give the run back at the end of a slice, a wait or the end.
# The epoch grows by one at every acquisition or steal and is the fencing token (journal.services.Fence).

import json
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, connections
from django.db.models import Q
from django.utils import timezone

from journal.services import Fence, FencedOut
from pal.clock import db_clock, db_clock_sql

_ident: dict = {"pid": None, "name": None}


def worker_id() -> str:
    """This process's owner name: host:pid:nonce, new after every fork."""
    pid = os.getpid()
    if _ident["pid"] != pid:
        _ident.update(pid=pid, name=f"{settings.PAL_WORKER_NAME}:{pid}:{uuid.uuid4().hex[:8]}")
    return _ident["name"]


def task_owner(task_id: str) -> str:
    return f"task:{task_id}"


def lease_live(expires_at, *, now) -> bool:
    """The one rule for a live lease: it has not expired (expires at or after now, a value of the database's clock:
    pal.clock.db_now). A heartbeat extends only a live lease and a taker steals only an expired one, in SQL below by
    the same comparison against the database's clock."""
    return expires_at is not None and expires_at >= now


def without_live_lease(*, now=None, via: str = "lock") -> Q:
    """A filter of runs (reached through `via`) that no live lease holds: no lease row, or one that expired by the
    database's clock (or by `now`, a value of it)."""
    return Q(**{f"{via}__isnull": True}) | Q(**{f"{via}__expires_at__lt": now or db_clock()})


def _uuid(value):
    value = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    return value if connection.vendor == "postgresql" else value.hex


def _ttl(extra: float = 0.0) -> tuple[str, list]:
    """SQL for a new expiry: the database's clock plus the TTL (and extra), with its params."""
    return db_clock_sql(settings.PAL_LEASE_TTL + extra)


def _ttl_estimate(extra: float = 0.0):
    """This process's guess at a new expiry, for an answer only (never compared with anything)."""
    return timezone.now() + timedelta(seconds=settings.PAL_LEASE_TTL + extra)


# Taking a lease is two conditional writes, each of whose row count says who won. First the UPDATE of an existing
# row (our own booking, an expired lease, or any with force): one primary-key row, O(1) however long the journal.
_TAKE = """
UPDATE run_locks SET owner = %s, epoch = epoch + 1, expires_at = {expires}, acquired_at = {now}
 WHERE run_id = %s AND (expires_at < {now} OR owner = %s {force})
RETURNING epoch
"""
# Else, when the run has no row, an INSERT whose epoch continues from the run's last fenced journal row, so it never
# goes back after a release deleted the row. Fenced rows' epochs never decrease along seq (a writer appends with its
# epoch only while its lease holds), so the last one is the highest: a backwards read of the primary key that stops
# at the first row written under a lease, not a MAX over the whole journal.
_CREATE = """
INSERT INTO run_locks (run_id, owner, epoch, expires_at, acquired_at)
VALUES (%s, %s, COALESCE((SELECT epoch FROM journal_events WHERE run_id = %s AND epoch IS NOT NULL
                          ORDER BY seq DESC LIMIT 1), 0) + 1, {expires}, {now})
ON CONFLICT (run_id) DO NOTHING
RETURNING epoch
"""


def _upsert(*, run_id, owner, match_owner, extra: float = 0.0, force=False, bookings=False) -> int | None:
    """Take or create the run's lease row, expiring a TTL (+ extra) from now, both by the database's clock.
    force: whatever holds it; bookings: a booking no worker has taken (owner task:...) too."""
    (now, now_params), (expires, expires_params) = db_clock_sql(), _ttl(extra)
    run = _uuid(run_id)
    also = "OR TRUE" if force else ("OR owner LIKE 'task:%%'" if bookings else "")
    take = _TAKE.format(force=also, expires=expires, now=now)
    take_params = [owner, *expires_params, *now_params, run, *now_params, match_owner]
    with connection.cursor() as cursor:
        cursor.execute(take, take_params)
        row = cursor.fetchone()
        if row is None:
            cursor.execute(_CREATE.format(expires=expires, now=now), [run, owner, run, *expires_params, *now_params])
            row = cursor.fetchone()
        if row is None and (force or bookings):
            # A row appeared between the two writes (another taker inserted it): a forced take steals it too.
            cursor.execute(take, take_params)
            row = cursor.fetchone()
    return row[0] if row else None


def lease_reserve(*, run_id, task_id: str, delay: float = 0.0, force: bool = False) -> Fence | None:
    """Book the run for one task; steals only an expired lease (or any, with force). None: someone holds it."""
    owner = task_owner(task_id)
    epoch = _upsert(run_id=run_id, owner=owner, match_owner=owner, extra=delay, force=force)
    return Fence(run_id, owner, epoch) if epoch is not None else None


def lease_reserve_unwalked(*, run_id, task_id: str) -> Fence | None:
    """lease_reserve that also takes a booking no worker has taken yet (a queued run's first task, the next slice of
    one): a run no walk holds. The booked task, when it comes, finds the run booked for another and does nothing.
    None: a worker holds it (a live lease of `host:pid:nonce`)."""
    owner = task_owner(task_id)
    epoch = _upsert(run_id=run_id, owner=owner, match_owner=owner, bookings=True)
    return Fence(run_id, owner, epoch) if epoch is not None else None


def lease_reserve_new(*, bookings: list[tuple]) -> list[Fence]:
    """lease_reserve for runs created in the caller's transaction, [(run_id, task_id)], in one INSERT.

    Such a run has no lease row and no journal, so lease_reserve's UPDATE would match nothing and its INSERT's
    epoch, the last fenced journal row's + 1, is 1: the same rows in one statement. Nobody else can see the runs
    before the commit, so no booking races these (a conflict would be a bug, and raises)."""
    if not bookings:
        return []
    if connection.vendor == "postgresql":
        sql, params, fences = lease_reserve_new_part(bookings=bookings)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
        return fences
    # SQLite: one machine, one clock (pal.clock).
    now, expires_at = timezone.now(), _ttl_estimate()
    runs, owners = [_uuid(run_id) for run_id, _ in bookings], [task_owner(task_id) for _, task_id in bookings]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO run_locks (run_id, owner, epoch, expires_at, acquired_at) VALUES "
            + ", ".join(["(%s, %s, 1, %s, %s)"] * len(bookings)),
            [value for run, owner in zip(runs, owners, strict=True) for value in (run, owner, expires_at, now)],
        )
    return [Fence(run_id, owner, 1, expires_at=expires_at) for (run_id, _), owner in zip(bookings, owners, strict=True)]


# Postgres: the bookings as one JSON text of records, so the statement is the same whatever their number (parsed
# once); one string is cheaper to adapt than two arrays (journal.services._START_RECORDS).
_RESERVE_NEW = (
    "INSERT INTO run_locks (run_id, owner, epoch, expires_at, acquired_at) "
    "SELECT b.r, b.o, 1, statement_timestamp() + %s * interval '1 second', statement_timestamp() "
    "FROM jsonb_to_recordset(%s::jsonb) AS b(r uuid, o text)"
)


def lease_reserve_new_part(*, bookings: list[tuple]) -> tuple[str, list, list[Fence]]:
    """lease_reserve_new's INSERT for Postgres, not run: (sql, params, the Fences it books), for the caller to run
    alone or as a part of one statement with the runs' own rows (runs.services.ingest._runs_insert), which returns the
    expiry the rows got by the database's clock (their expires_at); the Fences carry this process's estimate
    until the caller has it."""
    expires_at = _ttl_estimate()
    booked = [(run_id, task_owner(task_id)) for run_id, task_id in bookings]
    records = [{"r": str(run_id), "o": owner} for run_id, owner in booked]
    fences = [Fence(run_id, owner, 1, expires_at=expires_at) for run_id, owner in booked]
    return _RESERVE_NEW, [float(settings.PAL_LEASE_TTL), json.dumps(records)], fences


def lease_acquire(*, run_id, task_id: str) -> Fence | None:
    """Take the run for this worker: succeeds on our own booking, an expired lease, or no lease at all."""
    owner = worker_id()
    epoch = _upsert(run_id=run_id, owner=owner, match_owner=task_owner(task_id))
    if epoch is None:
        return None
    fence = Fence(run_id, owner, epoch)
    heartbeat.track(fence)
    return fence


def lease_take(*, run_id, wait: float | None = None) -> Fence:
    """Take a child run for this worker (its parent's walk drives it inline): succeeds on no lease, an expired
    one, or one this worker holds. A lease left by a dead worker is waited out (at most a TTL and a beat)."""
    owner = worker_id()
    deadline = time.monotonic() + (
        settings.PAL_LEASE_TTL + 2 * settings.PAL_HEARTBEAT_INTERVAL if wait is None else wait
    )
    while True:
        epoch = _upsert(run_id=run_id, owner=owner, match_owner=owner)
        if epoch is not None:
            fence = Fence(run_id, owner, epoch)
            heartbeat.track(fence)
            return fence
        if time.monotonic() > deadline:
            raise FencedOut(Fence(run_id, owner, 0))
        time.sleep(min(0.25, settings.PAL_HEARTBEAT_INTERVAL))


def lease_handoff(*, fence: Fence, task_id: str, delay: float = 0.0) -> Fence:
    """Pass a held lease to the task that will walk the next slice (or wake after a backoff)."""
    owner = task_owner(task_id)
    (now, now_params), (expires, expires_params) = db_clock_sql(), _ttl(delay)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE run_locks SET owner = %s, epoch = epoch + 1, expires_at = {expires}, acquired_at = {now} "
            "WHERE run_id = %s AND owner = %s AND epoch = %s RETURNING epoch",
            [owner, *expires_params, *now_params, _uuid(fence.run_id), fence.owner, fence.epoch],
        )
        row = cursor.fetchone()
    heartbeat.untrack(fence)
    if row is None:
        raise FencedOut(fence)
    return Fence(fence.run_id, owner, row[0])


def lease_release(*, fence: Fence, branches: bool = False) -> None:
    """Delete our lease; raises FencedOut if it was no longer ours (the caller's transaction must roll back).
    branches: the walk booked items for other workers (runs.walk.fleet): their rows go too."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM run_locks WHERE run_id = %s AND owner = %s AND epoch = %s",
            [_uuid(fence.run_id), fence.owner, fence.epoch],
        )
        deleted = cursor.rowcount
        if deleted == 1 and branches:
            # The walk waited for its items on other workers before giving the run up: what is left is spent.
            cursor.execute("DELETE FROM branch_locks WHERE run_id = %s", [_uuid(fence.run_id)])
    heartbeat.untrack(fence)
    if deleted != 1:
        raise FencedOut(fence)


def lease_drop(*, run_id) -> None:
    """Remove whatever lease a run has (cancel, end of a run by an operator): its holder is fenced out."""
    # A plain DELETE does not see a booking that another transaction inserted and has not committed yet (a re-drive
    # of a waiting run, which has no row): that booking would outlive the cancel and let its task write after it.
    # So the row is first written (insert or update), which waits for any such booking to commit or roll back, then
    # deleted; the caller's commit publishes both at once.
    run = _uuid(run_id)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO run_locks (run_id, owner, epoch, expires_at, acquired_at) VALUES (%s, %s, 0, %s, %s) "
            "ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner",
            [run, "dropping", now, now],
        )
        cursor.execute("DELETE FROM run_locks WHERE run_id = %s", [run])
        # Its items running on other workers lose their leases too: each stops at its next write.
        cursor.execute("DELETE FROM branch_locks WHERE run_id = %s", [run])


def fence_check(fence: Fence) -> None:
    """Inside a transaction: hold the lease row (FOR SHARE on Postgres) or raise FencedOut."""
    lock = " FOR SHARE" if connection.vendor == "postgresql" else ""
    table = "branch_locks" if fence.branch is not None else "run_locks"
    params = [_uuid(fence.run_id), fence.owner, fence.epoch]
    item = ""
    if fence.branch is not None:  # an item of a fan-out run by another worker (runs.walk.fleet)
        item, params = " AND sid = %s", [*params, fence.branch]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE run_id = %s AND owner = %s AND epoch = %s{item}{lock}", params)
        if cursor.fetchone() is None:
            raise FencedOut(fence)


def lease_heartbeat(fences) -> list[str]:
    """Extend exactly these leases (each (run, owner, epoch) a walk in this process is using), in one UPDATE, and
    only while they are live: an expired lease is never revived (the sweep may be re-driving it). Returns the run
    ids still held."""
    fences = list(fences)
    if not fences:
        return []
    (now, now_params), (expires, expires_params) = db_clock_sql(), _ttl()
    pairs = " OR ".join(["(run_id = %s AND owner = %s AND epoch = %s)"] * len(fences))
    params: list = [*expires_params, *now_params]
    for fence in fences:
        params += [_uuid(fence.run_id), fence.owner, fence.epoch]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE run_locks SET expires_at = {expires} WHERE expires_at >= {now} AND ({pairs}) RETURNING run_id",
            params,
        )
        return [str(uuid.UUID(str(row[0]))) for row in cursor.fetchall()]


def item_heartbeat(fences) -> list[tuple[str, str]]:
    """lease_heartbeat for the items of fan-outs this process runs for other runs' walks (branch_locks rows, each
    fenced by (run, sid, owner, epoch)): one UPDATE; returns the (run id, sid) pairs still held."""
    fences = list(fences)
    if not fences:
        return []
    (now, now_params), (expires, expires_params) = db_clock_sql(), _ttl()
    pairs = " OR ".join(["(run_id = %s AND sid = %s AND owner = %s AND epoch = %s)"] * len(fences))
    params: list = [*expires_params, *now_params]
    for fence in fences:
        params += [_uuid(fence.run_id), fence.branch, fence.owner, fence.epoch]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE branch_locks SET expires_at = {expires} WHERE expires_at >= {now} AND ({pairs}) "
            "RETURNING run_id, sid",
            params,
        )
        return [(str(uuid.UUID(str(row[0]))), row[1]) for row in cursor.fetchall()]


class Heartbeat:
    """A daemon thread per worker process that beats while a walk in this process uses a lease.

    It extends the tracked (run, epoch) pairs only: a lease whose walk ended, however it ended, is no longer
    tracked and expires. It also notices a lease that vanished (stolen, dropped by a cancel, or expired while the
    database was away) so a long step can stop early: lost(fence) turns true and the step's context checks it.
    """

    def __init__(self):
        self._held: dict[str, Fence] = {}
        self._items: dict[tuple[str, str], Fence] = {}  # items of other runs' fan-outs (Fence.branch set)
        self._lost: set[tuple[str, int]] = set()
        self._items_lost: set[tuple[str, str, int]] = set()
        self._lock = threading.Lock()
        self._thread = None
        self._pid = None
        self.beat = None  # the beat function; None is lease_heartbeat (tests swap it)

    def track(self, fence: Fence):
        with self._lock:
            if fence.branch is not None:
                self._items[(str(fence.run_id), fence.branch)] = fence
                self._items_lost.discard((str(fence.run_id), fence.branch, fence.epoch))
            else:
                self._held[str(fence.run_id)] = fence
                self._lost.discard((str(fence.run_id), fence.epoch))
        self._ensure_thread()

    def untrack(self, fence: Fence):
        with self._lock:
            if fence.branch is not None:
                item = self._items.get((str(fence.run_id), fence.branch))
                if item is not None and item.epoch == fence.epoch:
                    del self._items[(str(fence.run_id), fence.branch)]
                return
            held = self._held.get(str(fence.run_id))
            if held is not None and held.epoch == fence.epoch:
                del self._held[str(fence.run_id)]

    def lost(self, fence: Fence) -> bool:
        with self._lock:
            if fence.branch is not None:
                return (str(fence.run_id), fence.branch, fence.epoch) in self._items_lost
            return (str(fence.run_id), fence.epoch) in self._lost

    def _ensure_thread(self):
        if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="pal-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            time.sleep(settings.PAL_HEARTBEAT_INTERVAL)
            with self._lock:
                held = list(self._held.values())
                items = list(self._items.values())
            if not held and not items:
                continue
            try:
                close_old_connections()
                alive = set((self.beat or lease_heartbeat)(held)) if held else set()
                items_alive = set(item_heartbeat(items))
            except Exception:  # the database may be away for a moment; the next beat tries again
                connections.close_all()
                continue
            with self._lock:
                for fence in held:
                    run_id = str(fence.run_id)
                    if run_id not in alive and self._held.get(run_id) == fence:
                        self._lost.add((run_id, fence.epoch))
                for fence in items:
                    key = (str(fence.run_id), fence.branch or "")
                    if key not in items_alive and self._items.get(key) == fence:
                        self._items_lost.add((*key, fence.epoch))


heartbeat = Heartbeat()


def lease_describe(*, run_id) -> dict | None:
    """The lease row as it is now, for the journal and the pages (owner, epoch, expires_at)."""
    return lease_describe_with_clock(run_id=run_id)[0]


def lease_describe_with_clock(*, run_id) -> tuple[dict | None, Any]:
    """lease_describe, and the database's clock read in the same statement (None when the run has no lease row):
    what judges the lease, at no second round trip."""
    now, now_params = db_clock_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT owner, epoch, expires_at, {now} FROM run_locks WHERE run_id = %s", [*now_params, _uuid(run_id)]
        )
        row = cursor.fetchone()
    if row is None:
        return None, None
    expires = row[2]
    described = {
        "owner": row[0],
        "epoch": row[1],
        "expires_at": expires.isoformat() if hasattr(expires, "isoformat") else str(expires),
    }
    return described, row[3]


def lease_held_elsewhere(*, run_id) -> bool:
    """Whether a live lease that this process does not hold is on the run: its own task, or another worker, walks
    it (a child run booked by a freed slot or re-driven by an operator). Its parent waits on it; it does not take it."""
    now, now_params = db_clock_sql()  # the database's clock decides, as for every lease
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM run_locks WHERE run_id = %s AND owner <> %s AND expires_at >= {now}",
            [_uuid(run_id), worker_id(), *now_params],
        )
        return cursor.fetchone() is not None
