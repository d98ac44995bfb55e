"""Items of a fan-out booked for the fleet (runs.walk.fleet): who wins each conditional write, what a fenced-out item
writer can still do (nothing), and an item run by run_item as a worker that received its task would."""

import threading
import time

import pytest

from journal.models import JournalEvent
from journal.services import FencedOut, NewEvent, events_append
from runs import leases
from runs.errors import StepError, Wait
from runs.models import BranchLock, RunStatus
from runs.steps.tools import tool
from runs.walk.fleet import (
    Booking,
    item_finish,
    item_holds,
    item_take,
    item_take_back,
    items_book,
    items_done,
    items_of,
    run_item,
)
from runs.walk.items import _item_outcome
from tests.helpers import drive_to_end, make_run, tool_step

pytestmark = pytest.mark.django_db


def book(run, sid="fan[0]", attempt=1, fields=None, resumed=False) -> str:
    ((_, task_id),) = items_book(
        run_id=run.id, bookings=[Booking(sid, attempt, fields or {"tool": "echo", "args": {"n": 0}}, resumed)]
    )
    return task_id


def fan_out_run():
    return make_run(
        steps=[{**tool_step("fan", "echo", {"n": "{{ item }}"}), "for_each": "{{ input.items }}"}],
        input={"items": [0, 1]},
    )


def test_the_worker_with_the_booked_task_takes_the_item_once_and_then_the_walk_cannot_take_it_back():
    run = fan_out_run()
    task_id = book(run)
    taken = item_take(run_id=run.id, sid="fan[0]", task_id=task_id, owner="w1:1:a:item")
    assert taken is not None and taken.fence.branch == "fan[0]" and taken.attempt == 1
    assert item_take(run_id=run.id, sid="fan[0]", task_id=task_id, owner="w2:2:b:item") is None
    assert not item_take_back(run_id=run.id, sid="fan[0]", owner=f"task:{task_id}")
    assert item_holds(fence=taken.fence)


def test_a_booking_the_walk_took_back_is_gone_for_the_worker_that_receives_its_task():
    run = fan_out_run()
    task_id = book(run)
    assert item_take_back(run_id=run.id, sid="fan[0]", owner=f"task:{task_id}")
    assert item_take(run_id=run.id, sid="fan[0]", task_id=task_id, owner="w1:1:a:item") is None
    assert run_item(run_id=run.id, sid="fan[0]", task_id=task_id) == "gone"


def test_an_item_booked_again_fences_out_its_old_writer_everywhere():
    run = fan_out_run()
    old = item_take(run_id=run.id, sid="fan[0]", task_id=book(run), owner="w1:1:a:item")
    assert old is not None
    new_task = book(run, resumed=True)  # its worker stopped beating: the walk books it again
    new = item_take(run_id=run.id, sid="fan[0]", task_id=new_task, owner="w1:1:a:item")  # even the same name
    assert new is not None and new.fence.epoch > old.fence.epoch and new.resumed
    assert not item_holds(fence=old.fence)
    assert not item_finish(fence=old.fence, result={"output": "late"})
    with pytest.raises(FencedOut):
        events_append(run_id=run.id, events=[NewEvent("late", "fan[0]", 1, {})], writer="w1", fence=old.fence)
    # The new writer's rows go in, with no epoch: the run lease's epochs along the journal stay the run's.
    (seq,) = events_append(run_id=run.id, events=[NewEvent("note", "fan[0]", 1, {})], writer="w1", fence=new.fence)
    assert JournalEvent.objects.get(run_id=run.id, seq=seq).epoch is None
    assert item_finish(fence=new.fence, result={"output": {"n": 0}})
    assert items_of(run_id=run.id)["fan[0]"].result == {"output": {"n": 0}}


def test_a_cancel_drops_the_items_rows_with_the_run_lease():
    run = fan_out_run()
    taken = item_take(run_id=run.id, sid="fan[0]", task_id=book(run), owner="w1:1:a:item")
    leases.lease_drop(run_id=run.id)
    assert not BranchLock.objects.filter(run_id=run.id).exists()
    assert taken is not None and not item_finish(fence=taken.fence, result={"output": 1})


def test_items_done_deletes_only_the_rows_as_they_were_read():
    run = fan_out_run()
    book(run, "fan[0]")
    book(run, "fan[1]")
    rows = items_of(run_id=run.id)
    book(run, "fan[1]")  # booked again after the read: a new epoch, not the row that was read
    items_done(run_id=run.id, rows=list(rows.values()))
    assert list(items_of(run_id=run.id)) == ["fan[1]"]


def test_run_item_runs_the_step_with_the_fields_the_walk_rendered_and_writes_its_outcome():
    run = fan_out_run()
    task_id = book(run, "fan[1]", fields={"tool": "echo", "args": {"n": "rendered \u0000 as sent"}})
    assert run_item(run_id=run.id, sid="fan[1]", task_id=task_id) == "done"
    row = items_of(run_id=run.id)["fan[1]"]
    assert row.result["output"] == {"n": "rendered \u0000 as sent"}
    assert row.result["extra"]["ran_on"] == row.owner and row.owner.endswith(":item")
    assert row.result["ms"] >= 0


def test_an_items_outcome_reads_back_as_the_walk_settles_it():
    from runs.replay import StepState
    from runs.walk.branch import Branch

    branch = Branch("fan[0]", {"id": "fan", "kind": "deliver"}, StepState(), item=(0, "x"))
    assert _item_outcome(branch, {"output": [1, 2]}) == ([1, 2], None)
    _, error = _item_outcome(branch, {"error": {"message": "no", "code": "webhook_refused", "permanent": False}})
    assert isinstance(error, StepError) and error.code == "webhook_refused" and not error.permanent
    wait = {"waiting_on": {"kind": "rate_limit", "limit": "llm"}, "wake_at": "2026-12-01T10:00:00+00:00", "journal": []}
    _, error = _item_outcome(branch, {"wait": wait})
    assert isinstance(error, Wait) and error.waiting_on["kind"] == "rate_limit" and error.wake_at.hour == 10


def test_with_no_worker_free_the_walk_takes_its_bookings_back_and_runs_every_item_itself(settings):
    settings.PAL_ITEM_PICKUP_SECONDS = 0.0
    run = make_run(
        steps=[
            {**tool_step("fan", "echo", {"n": "{{ item }}"}), "for_each": "{{ input.items }}", "max_concurrency": 3}
        ],
        input={"items": list(range(7))},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [o["n"] for o in run.output] == list(range(7))
    completed = JournalEvent.objects.filter(run_id=run.id, kind="step_completed", step_id__startswith="fan[")
    assert completed.count() == 7 and not [e for e in completed if "ran_on" in e.payload]
    assert not BranchLock.objects.filter(run_id=run.id).exists()


@tool("test_thread_name")
def thread_name(args, ctx):
    """Which thread ran the item: a walk's branch thread ("pal-branch...") or the walk's own."""
    time.sleep(float(args.get("nap", 0)))
    return {"thread": threading.current_thread().name}


def test_items_quicker_than_a_thread_hand_off_run_on_the_walks_own_thread_after_the_first_wave(monkeypatch):
    # A no-op item takes well under the 2 ms bound on a quiet machine; five threads at one GIL on a loaded one can
    # take longer. The bound is the executor's to choose; what is tested is that it is used.
    monkeypatch.setattr("runs.walk.scheduler.QUICK_SECONDS", 0.05)
    run = make_run(
        steps=[
            {
                **tool_step("fan", "test_thread_name", {"i": "{{ item }}"}),
                "for_each": "{{ input.items }}",
                "max_concurrency": 5,
            }
        ],
        input={"items": list(range(30))},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    threads = [o["thread"] for o in run.output]
    assert all(name.startswith("pal-branch") for name in threads[:5]), threads  # nothing known of the step yet
    assert threading.current_thread().name in threads[5:], threads  # then: one after another, on the walk's thread


def test_items_slower_than_a_thread_hand_off_keep_running_side_by_side():
    run = make_run(
        steps=[
            {
                **tool_step("fan", "test_thread_name", {"nap": 0.01}),
                "for_each": "{{ input.items }}",
                "max_concurrency": 4,
            }
        ],
        input={"items": list(range(12))},
    )
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert all(o["thread"].startswith("pal-branch") for o in run.output), run.output
