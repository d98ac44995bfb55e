"""A workflow's `concurrency` (docs/reference/workflows.md): at most `max_runs` runs of a group (the workflow, and
the value of `key` rendered from the run's input) are running at once; the others stay queued and start in creation
order as slots free.

A run's group is fixed when it is created (Run.concurrency_key). When its first task comes, the walk asks for a slot
(slot_take) in the commit that would start it; without one, the run stays queued with waiting_on
{"kind": "concurrency", ...}, no lease and no task: nothing polls it (the sweep leaves such a run alone). Whatever frees
a slot (a run of the group ending, parking on a wait, or cancelled) hands it on in its own commit (slot_hand_over):
one booking of the oldest waiting run. Both lock the group's row (ConcurrencyKey), so a count and a hand-over never
miss each other. A child run counts in its own workflow's group; it is driven by its parent and never held back.
"""

import hashlib
import json
from typing import Any

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


def _lock(key: str) -> None:
    ConcurrencyKey.objects.bulk_create([ConcurrencyKey(key=key)], ignore_conflicts=True)
    ConcurrencyKey.objects.select_for_update().filter(key=key).first()


def _waiting(key: str):
    return Run.objects.filter(concurrency_key=key, status=RunStatus.QUEUED, waiting_on__kind="concurrency")


def slot_take(run: Run) -> dict | None:
    """Inside the commit that would start the run: None when it may start; else what it waits on (the group, how
    many run, the limit). A run that finds a free slot but older runs of the group waiting for one waits too, and
    hands the slot to the oldest: runs start in creation order."""
    key = run.concurrency_key
    if not key:
        return None
    _lock(key)
    running = Run.objects.filter(concurrency_key=key, status=RunStatus.RUNNING).count()
    limit = max_runs_of(run)
    # Any older queued run of the group goes first, one waiting for a slot or one whose first task is on its way.
    older = (
        Run.objects.filter(concurrency_key=key, status=RunStatus.QUEUED)
        .filter(Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, id__lt=run.id))
        .exists()
    )
    if running < limit and not older:
        if running + 1 < limit:
            slot_hand_over(key)  # a slot is still free after this one: the next waiting run takes it
        return None
    if running < limit:
        slot_hand_over(key)
    return {"kind": "concurrency", "key": key, "running": running, "max_runs": limit}


def slot_hand_over(key: str | None) -> None:
    """Inside the commit that frees a slot of the group (an ending, a wait, a cancel): book the oldest run waiting
    for one. Its walk takes the slot (slot_take) when its task comes."""
    if not key:
        return
    _lock(key)
    # Not one already handed a slot (booked, its task on the way): two slots freed at once go to two runs.
    waiting = (
        _waiting(key).filter(without_live_lease()).order_by("created_at", "id").values_list("id", flat=True).first()
    )
    if waiting is not None:
        book_drive(run_id=waiting)
