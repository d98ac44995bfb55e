"""Item rows left by a walk that died (issue 23, section 3): the next walk of the run deletes in its first commit
every row it will not wait for, and runs those items anew. So a late message for an old booking (the fleet was
busy) runs nothing, and a frozen item worker's writes are refused; the item runs once under its key.

The dead walk is its writes: its lease, its journal (the fan-out and the item started) and its booking, as
runs.walk writes them; the next walk is a real one (the sweep, then run_drive), and the late message is what a
worker that receives it runs (run_item)."""

import pytest
from django.utils import timezone

from journal.services import FencedOut, NewEvent, events_append
from runs import leases
from runs.models import BranchLock, Run, RunLock, RunStatus
from runs.steps.tools import tool
from runs.walk import run_item
from runs.walk.fleet import Booking, item_finish, item_take, items_book
from tests.helpers import CALLS, calls, drive_to_end, make_run, sweep_after_expiry, tool_step

pytestmark = pytest.mark.django_db

STEP = {**tool_step("fan", "test_meanwhile", {"n": "{{ item }}"}), "for_each": "{{ input.items }}"}
MEANWHILE: dict[str, object] = {}  # run id -> what the fleet does while the next walk runs the item
SEEN: dict[str, object] = {}  # run id -> what that came to


@tool("test_meanwhile")
def meanwhile_tool(args, ctx):
    """Records the call; on the first, runs what the test left for the moment the item runs (a late message)."""
    CALLS[ctx.run_id].append({"step_id": ctx.step_id, "key": ctx.key})
    then = MEANWHILE.pop(ctx.run_id, None)
    if callable(then):
        SEEN[ctx.run_id] = then()
    return args


def a_dead_walks_booking() -> tuple[Run, str]:
    """A run whose walk booked its one item for the fleet and died: (the run, the booking's task id)."""
    run = make_run(steps=[STEP], input={"items": [0]})
    task = RunLock.objects.get(run_id=run.id).owner.removeprefix("task:")
    fence = leases.lease_acquire(run_id=run.id, task_id=task)
    assert fence is not None
    fields = {"tool": "test_meanwhile", "args": {"n": 0}}
    events_append(
        run_id=run.id,
        events=[
            NewEvent("run_started", payload={"worker": fence.owner}),
            NewEvent("step_started", "fan", 1, {"key": f"{run.id}:fan:1", "kind": "tool_call", "items": 1}),
            NewEvent("step_started", "fan[0]", 1, {"key": f"{run.id}:fan[0]:1", "kind": "tool_call", "item": 0}),
        ],
        writer=fence.owner,
        fence=fence,
    )
    Run.objects.filter(id=run.id).update(status=RunStatus.RUNNING, started_at=timezone.now())
    ((_, booked),) = items_book(run_id=run.id, bookings=[Booking("fan[0]", 1, fields, False, STEP)])
    leases.heartbeat.untrack(fence)  # the walk is dead: nothing beats its lease
    return run, booked


def walk_again(run: Run) -> None:
    sweep_after_expiry(run)  # its lease expired: the sweep books the run for a new task
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED


def test_a_late_message_for_a_dead_walks_booking_runs_nothing_while_the_next_walk_runs_the_item():
    run, booked = a_dead_walks_booking()
    # While the next walk runs the item on its own thread (it is lone), the fleet gets to the old booking at last.
    MEANWHILE[str(run.id)] = lambda: run_item(run_id=run.id, sid="fan[0]", task_id=booked)

    walk_again(run)

    assert SEEN.pop(str(run.id)) == "gone"
    assert [c["key"] for c in calls(run, "fan[0]")] == [f"{run.id}:fan[0]:1"]  # once, not twice under its key


def test_a_frozen_item_workers_writes_are_refused_while_the_next_walk_runs_its_item():
    run, booked = a_dead_walks_booking()
    frozen = item_take(run_id=run.id, sid="fan[0]", task_id=booked, owner="frozen:1:a:item")
    assert frozen is not None
    BranchLock.objects.filter(run_id=run.id).update(expires_at=timezone.now())  # then it froze: no more beats

    def woken() -> tuple[bool, bool]:
        try:
            events_append(run_id=run.id, events=[NewEvent("late", "fan[0]", 1, {})], writer="w", fence=frozen.fence)
        except FencedOut:
            appended = False
        else:
            appended = True
        return item_finish(fence=frozen.fence, result={"output": "late"}), appended

    MEANWHILE[str(run.id)] = woken

    walk_again(run)

    assert SEEN.pop(str(run.id)) == (False, False)  # neither its outcome nor a journal row went in
    assert len(calls(run, "fan[0]")) == 1
    assert run.output == [{"n": 0}]
