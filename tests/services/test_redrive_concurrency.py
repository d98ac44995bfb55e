"""An operator's re-drive goes through the concurrency rule like everything else (runs.concurrency): a waiting or
queued run of a full group is queued on it with the why and no task, forced or not, and starts in creation order
when a slot frees; with a free slot a waiting run takes it in the re-drive's commit. Force steals a lease; it never
lets a group run more than max_runs."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.services import Conflict, approval_decide, run_create, run_redrive, workflow_create
from tests.helpers import drive, echo_step, events, kinds
from tests.runs.test_concurrency_limits import booked, work_off
from tests.services.test_concurrency_wakeups import most_running_at_once

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _one_step_per_slice(settings):
    settings.PAL_SLICE_SECONDS = 0.000001  # each task walks one step and hands the run to a new task


def gate(max_runs: int = 1):
    """A group of max_runs per customer; a run asked to waits on an approval first."""
    workflow_create(
        definition={
            "name": "gate",
            "concurrency": {"key": "{{ input.customer }}", "max_runs": max_runs},
            "steps": [
                {"id": "ok", "kind": "approval", "prompt": "go?", "when": "input.ask"},
                echo_step("work"),
                echo_step("more"),
            ],
        }
    )


def start(*, ask: bool) -> Run:
    run, _ = run_create(workflow_name="gate", input={"customer": "acme", "ask": ask})
    return run


def waiting_behind_a_holder() -> tuple[Run, Run]:
    """(a run parked on its approval, which gave its slot back; a run that took the slot and still runs), in a group
    of one. Needs one step per slice (PAL_SLICE_SECONDS tiny), or the holder would walk to its end."""
    gate()
    waiting = start(ask=True)
    drive(waiting)  # parks on its approval: its slot goes back
    holder = start(ask=False)
    drive(holder)  # takes the free slot, walks one step, hands off: still running
    return waiting, holder


def running() -> int:
    return Run.objects.filter(concurrency_key="gate:acme", status=RunStatus.RUNNING).count()


@pytest.mark.parametrize("force", [False, True])
def test_a_redrive_of_a_waiting_run_of_a_full_group_queues_it_with_the_why_and_sends_no_task(force):
    waiting, holder = waiting_behind_a_holder()
    assert (waiting.status, holder.status) == (RunStatus.WAITING, RunStatus.RUNNING)

    run_redrive(run_id=waiting.id, by="oscar", reason="looks stuck", force=force)

    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED and running() == 1
    assert run_why(waiting).startswith("concurrency gate:acme: 1 of 1 running")
    assert not RunLock.objects.filter(run_id=waiting.id).exists()  # no lease, no task: nothing polls it
    assert str(waiting.id) not in sweep_once().redriven
    (redriven,) = [e for e in events(waiting) if e.kind == "run_redriven"]
    assert (redriven.payload["who"], redriven.payload["force"], redriven.payload["task_id"]) == ("oscar", force, None)
    assert redriven.payload["queued"] == {"kind": "concurrency", "key": "gate:acme", "running": 1, "max_runs": 1}
    with pytest.raises(Conflict) as refused:  # its approval is decided once the run waits on it again
        approval_decide(run_id=waiting.id, step_id="ok", approved=True, by="otto")
    assert refused.value.code == "not_waiting_on_approval"
    assert "queued on its concurrency group 'gate:acme', 1 of 1 running" in refused.value.detail


def test_a_queued_redriven_run_starts_when_the_slot_frees_parks_on_its_open_approval_and_then_finishes():
    waiting, holder = waiting_behind_a_holder()
    run_redrive(run_id=waiting.id, by="oscar", reason="kick it", force=True)

    work_off([waiting, holder])  # the holder ends; its ending books the re-driven run, which walks

    waiting.refresh_from_db(), holder.refresh_from_db()
    assert most_running_at_once([waiting, holder]) == 1  # from the journal's intervals
    assert holder.status == RunStatus.SUCCEEDED
    assert waiting.status == RunStatus.WAITING and waiting.waiting_on["kind"] == "approval"  # still undecided
    holder_ended = next(e.created_at for e in events(holder) if e.kind == "run_succeeded")
    started_again = [e for e in events(waiting) if e.kind == "run_started"][-1]
    assert started_again.payload.get("resumed") is True and started_again.created_at > holder_ended

    approval_decide(run_id=waiting.id, step_id="ok", approved=True, by="otto")
    work_off([waiting])

    waiting.refresh_from_db()
    assert waiting.status == RunStatus.SUCCEEDED
    assert kinds(waiting).count("approval_requested") == 1  # the walk found its request; it did not ask again


def test_a_redrive_of_a_waiting_run_with_a_free_slot_takes_it_in_the_same_commit():
    gate(max_runs=2)
    waiting = start(ask=True)
    drive(waiting)
    other = start(ask=False)
    drive(other)
    assert running() == 1

    run_redrive(run_id=waiting.id, by="oscar", reason="kick it")

    waiting.refresh_from_db()
    assert waiting.status == RunStatus.RUNNING and running() == 2  # the slot is counted from this commit on
    assert booked([waiting]) == [waiting]
    (redriven,) = [e for e in events(waiting) if e.kind == "run_redriven"]
    assert "queued" not in redriven.payload and redriven.payload["task_id"]
    late = start(ask=False)
    drive(late)  # the group is full: the newcomer waits

    late.refresh_from_db()
    assert late.status == RunStatus.QUEUED and run_why(late).startswith("concurrency gate:acme: 2 of 2 running")


def test_a_redrive_of_a_held_back_run_keeps_it_queued_while_the_group_is_full():
    gate()
    holder = start(ask=False)
    drive(holder)
    held = start(ask=False)
    drive(held)  # its task came: no slot
    held.refresh_from_db()
    assert held.status == RunStatus.QUEUED and not RunLock.objects.filter(run_id=held.id).exists()

    run_redrive(run_id=held.id, by="oscar", reason="why is it not running", force=True)

    held.refresh_from_db()
    assert held.status == RunStatus.QUEUED and held.waiting_on["kind"] == "concurrency" and running() == 1
    assert not RunLock.objects.filter(run_id=held.id).exists()
    assert next(e for e in events(held) if e.kind == "run_redriven").payload["queued"]["running"] == 1
    assert "run_started" not in kinds(held)


def test_a_redrive_of_a_younger_held_back_run_hands_a_free_slot_to_the_oldest_first():
    gate()
    holder = start(ask=False)
    drive(holder)
    older, younger = start(ask=False), start(ask=False)
    drive(older), drive(younger)  # both held back
    # The holder ends without handing its slot on (as if that hand-over had been lost): a free slot, two waiting.
    Run.objects.filter(id=holder.id).update(status=RunStatus.SUCCEEDED)
    RunLock.objects.filter(run_id=holder.id).delete()

    run_redrive(run_id=younger.id, by="oscar", reason="unstick")

    younger.refresh_from_db()
    assert younger.status == RunStatus.QUEUED and not RunLock.objects.filter(run_id=younger.id).exists()
    assert next(e for e in events(younger) if e.kind == "run_redriven").payload["queued"]["running"] == 0
    assert booked([older, younger]) == [older]  # the free slot went to the oldest waiting run, in the same commit
    drive(older)
    older.refresh_from_db()
    assert older.status == RunStatus.RUNNING and running() == 1
    most = work_off([older, younger])  # its ending hands the slot to the younger one
    older.refresh_from_db(), younger.refresh_from_db()
    assert most == 1 and (older.status, younger.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)
    assert older.started_at < younger.started_at
