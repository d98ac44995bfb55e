"""A workflow's `concurrency` (docs/reference/workflows.md): at most `max_runs` runs of a group (the workflow, and
the value of `key` rendered from the run's input) are running at once; the others stay queued and start as slots
free, the highest priority first, then in creation order."""

# A run's group is fixed when it is created (Run.concurrency_key). When its first task comes, the walk asks for a slot
# (slot_take) in the commit that would start it; without one, the run stays queued with waiting_on
# {"kind": "concurrency", ...}, no lease and no task: nothing polls it (the sweep leaves such a run alone). Whatever
# frees a slot (a run of the group ending, parking on a wait, or cancelled) hands it on in its own commit
# (slot_hand_over): one booking of the first waiting run (the highest priority, then the oldest). Both lock the
# group's row (ConcurrencyKey), so a count and a hand-over never miss each other. A hand-over books another run's lease
# row while it holds the group's row, the one step against the order of every writer (lease row, status row, group's
# row): so it waits only briefly for a lease row that another transaction is writing (a cancel or a re-drive of that
# run) and then hands the slot to the next waiting run.
#
# An operator's re-drive of a queued or waiting run asks for a slot as a wake-up does (runs.services.run_redrive),
# forced or not: force steals a lease and never lets a group run more than max_runs (docs/FLOW-CONTROL.md).
#
# A wake-up (runs.services.run_wake: an approval decided, a signal, a timer, a rate limit's slot, a budget raised) asks
# for a slot again, as a new run does: a run that gave its slot back when it parked goes `queued` on its group when the
# group is full, and a hand-over starts it in creation order.
#
# A child run counts in its own workflow's group: it takes a slot when it is created (slot_take_child) or woken, and
# without one it is created queued on its group, and its parent's step waits on it (kind child) until a hand-over
# books it; its own task then walks it, and its ending wakes the parent. A child in the same group as one of its
# ancestors (a workflow that calls itself, for the same key) takes no slot of its own: it rides on that ancestor's
# (its concurrency_key is None), since holding it back while the ancestor holds the group's last slot would have the
# tree wait for itself.

import hashlib
import json
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import Q

from .dispatch import book_drive
from .leases import without_live_lease
from .models import ConcurrencyKey, Run, RunStatus, Workflow
from .workflows import render

MAX_KEY = 200


def concurrency_key_for(workflow: Workflow, input: Any) -> str | None:
    """The run's group, or None when its workflow has no concurrency limit."""
    spec = (workflow.definition or {}).get("concurrency")
    if not isinstance(spec, dict):
        return None
    template = spec.get("key")
    value = render(template, {"input": input}, field="concurrency.key") if template else ""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    key = f"{workflow.name}:{text}"
    if len(key) > MAX_KEY:  # a long value: its hash stands for it (the same value, the same group)
        key = f"{workflow.name}:sha256:{hashlib.sha256(text.encode()).hexdigest()}"
    return key


def max_runs_of(run: Run) -> int:
    spec = (run.workflow.definition or {}).get("concurrency") or {}
    return int(spec.get("max_runs", 1))


def key_lock(key: str) -> None:
    """Inside a transaction: lock the row of `key` (made on first use) until the commit. A concurrency group's
    count and hand-over, and a rate limit's window (runs.rate_limits), are read and written under it."""
    ConcurrencyKey.objects.bulk_create([ConcurrencyKey(key=key)], ignore_conflicts=True)
    ConcurrencyKey.objects.select_for_update().filter(key=key).first()


def _waiting(key: str):
    return Run.objects.filter(concurrency_key=key, status=RunStatus.QUEUED, waiting_on__kind="concurrency")


def held_back(run: Run) -> bool:
    """Whether the run is queued on its group's limit (a child so held is waited on by its parent's step)."""
    waiting_on = run.waiting_on if isinstance(run.waiting_on, dict) else {}
    return run.status == RunStatus.QUEUED and waiting_on.get("kind") == "concurrency"


def slot_take(run: Run) -> dict | None:
    """Inside the commit that would start (or wake) the run: None when it may start; else what it waits on (the
    group, how many run, the limit). A run that finds a free slot but runs of the group before it waiting for one
    waits too, and hands the slot to the first: runs start by priority, then in creation order."""
    if not run.concurrency_key:
        return None
    # Any queued run of the group before it goes first, one waiting for a slot or one whose first task is on its way.
    return _take(run.concurrency_key, max_runs_of(run), older=before(run.priority, run.created_at, run.id))


def before(priority: int, created_at, run_id) -> Q:
    """The runs that a run of this priority, creation time and id comes after: higher priority, or the same and
    older (created_at, then id)."""
    older = Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=run_id)
    return Q(priority__gt=priority) | (Q(priority=priority) & older)


def slot_take_child(*, key: str | None, workflow: Workflow, priority: int = 0) -> dict | None:
    """slot_take for a child run about to be created (key from child_concurrency_key): every queued run of its
    group of its priority or higher comes before it (each is older)."""
    if not key:
        return None
    spec = (workflow.definition or {}).get("concurrency") or {}
    return _take(key, int(spec.get("max_runs", 1)), older=Q(priority__gte=priority))


def child_concurrency_key(*, parent: Run, workflow: Workflow, input: Any) -> str | None:
    """A child's group: its workflow's, or None when an ancestor is in that group (it rides on that one's slot)."""
    key = concurrency_key_for(workflow, input)
    ancestor: Run | None = parent
    while key and ancestor is not None:
        if ancestor.concurrency_key == key:
            return None
        ancestor = Run.objects.filter(id=ancestor.parent_run_id).first() if ancestor.parent_run_id else None
    return key


def _take(key: str, limit: int, *, older: Q) -> dict | None:
    key_lock(key)
    running = Run.objects.filter(concurrency_key=key, status=RunStatus.RUNNING).count()
    older_waits = Run.objects.filter(concurrency_key=key, status=RunStatus.QUEUED).filter(older).exists()
    if running < limit and not older_waits:
        if running + 1 < limit:
            slot_hand_over(key)  # a slot is still free after this one: the next waiting run takes it
        return None
    if running < limit:
        slot_hand_over(key)
    return {"kind": "concurrency", "key": key, "running": running, "max_runs": limit}


def slot_hand_over(key: str | None) -> None:
    """Inside the commit that frees a slot of the group (an ending, a wait, a cancel): book the first run waiting
    for one, the highest priority, then the oldest. Its walk takes the slot (slot_take) when its task comes."""
    if not key:
        return
    key_lock(key)
    # Not one already handed a slot (booked, its task on the way): two slots freed at once go to two runs.
    waiting = _waiting(key).filter(without_live_lease()).order_by(*QUEUE_ORDER).values_list("id", "priority")
    for run_id, priority in waiting[:HAND_OVER_TRIES]:
        if _book_unless_busy(run_id, priority):
            return


QUEUE_ORDER = ("-priority", "created_at", "id")  # the order waiting runs are taken in (slots, paced resumes)
HAND_OVER_TRIES = 5  # waiting runs a hand-over tries, in that order, when the first ones' lease rows are busy
HAND_OVER_WAIT = "200ms"  # how long it waits for one (less than Postgres' deadlock_timeout, 1 s by default)


def _book_unless_busy(run_id, priority: int) -> bool:
    """book_drive for a waiting run, unless another transaction is writing its lease row: a cancel or a re-drive
    of that very run holds that row, then wants the group's row that we hold (each would wait for the other). On
    Postgres the booking waits HAND_OVER_WAIT at most, then gives up (False), undoing only itself (a savepoint), and
    the slot goes to the next waiting run; the cancelled run needs none, and a re-driven one asks for it itself."""
    if connection.vendor != "postgresql":  # one writer at a time: nothing to wait for
        book_drive(run_id=run_id, priority=priority)
        return True
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)", [HAND_OVER_WAIT]
            )
            previous = cursor.fetchone()[0]
            book_drive(run_id=run_id, priority=priority)  # None: someone booked it meanwhile; its walk takes the slot
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "55P03":  # lock_not_available: our wait ran out
            raise
        return False
    return True
