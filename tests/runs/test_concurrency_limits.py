"""A workflow's concurrency limit (issue 14): at most max_runs of a group run at once, the others wait queued with a
why naming the limit, holding no lease and polled by nothing, and start in creation order as slots free."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunLock, RunStatus
from runs.recovery import sweep_once
from runs.selectors import stuck_runs
from runs.services import approval_decide, run_cancel, run_create, workflow_create
from tests.helpers import drive, echo_step, events

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _one_step_per_slice(settings):
    settings.PAL_SLICE_SECONDS = 0.000001  # each task walks one step and hands the run to a new task


def limited(name: str, *, max_runs: int, key: str | None = "{{ input.customer }}", steps=None):
    concurrency = {"max_runs": max_runs, **({"key": key} if key else {})}
    return workflow_create(
        definition={"name": name, "concurrency": concurrency, "steps": steps or [echo_step(f"s{i}") for i in range(3)]}
    )


def booked(runs) -> list[Run]:
    """The runs a task is on its way for (a booking), oldest first: what workers would take."""
    held = set(
        RunLock.objects.filter(run_id__in=[r.id for r in runs], owner__startswith="task:").values_list(
            "run_id", flat=True
        )
    )
    return [r for r in runs if r.id in held]


def work_off(runs, *, watch_key=None) -> int:
    """Drive booked tasks one at a time (the queue), until nothing is booked; returns the most runs that were
    running at once in the group."""
    most, last = 0, {}
    for turn in range(500):
        ready = booked(runs)
        if not ready:
            return most
        chosen = min(ready, key=lambda r: last.get(r.id, -1))  # round robin, as several workers would
        last[chosen.id] = turn
        drive(chosen)
        running = Run.objects.filter(id__in=[r.id for r in runs], status=RunStatus.RUNNING)
        if watch_key:
            running = running.filter(concurrency_key=watch_key)
        most = max(most, running.count())
    raise AssertionError("the runs did not settle")


def test_at_most_max_runs_run_at_once_and_the_rest_start_in_creation_order():
    limited("limited", max_runs=2)
    runs = [run_create(workflow_name="limited", input={"customer": "acme"})[0] for _ in range(6)]

    most = work_off(runs)

    assert most == 2
    for run in runs:
        run.refresh_from_db()
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}
    assert [r.id for r in sorted(runs, key=lambda r: r.started_at)] == [r.id for r in runs]  # creation order
    assert all(any(e.kind == "run_started" for e in events(r)) for r in runs)


def test_a_held_back_run_says_why_holds_no_lease_and_is_not_stuck():
    limited("one-at-a-time", max_runs=1)
    first, _ = run_create(workflow_name="one-at-a-time", input={"customer": "acme"})
    second, _ = run_create(workflow_name="one-at-a-time", input={"customer": "acme"})
    drive(first)  # takes the slot, walks one step, hands off
    drive(second)  # its task comes: no slot

    second.refresh_from_db()
    assert second.status == RunStatus.QUEUED and not RunLock.objects.filter(run_id=second.id).exists()
    assert run_why(second).startswith("concurrency one-at-a-time:acme: 1 of 1 running")
    assert second.id not in set(stuck_runs().values_list("id", flat=True))
    assert str(second.id) not in sweep_once().redriven


def test_groups_are_per_key_and_a_cancel_or_a_wait_gives_the_slot_back():
    limited("per-customer", max_runs=1, steps=[{"id": "ok", "kind": "approval", "prompt": "go?"}, echo_step("end")])
    acme1, acme2, globex = (
        run_create(workflow_name="per-customer", input={"customer": c})[0] for c in ("acme", "acme", "globex")
    )
    for run in (acme1, acme2, globex):
        drive(run)
    acme1.refresh_from_db(), acme2.refresh_from_db(), globex.refresh_from_db()
    # acme1 parked on its approval: its slot went to acme2, which parked too; globex has a group of its own.
    assert (acme1.status, acme2.status, globex.status) == (RunStatus.WAITING,) * 3

    acme3, _ = run_create(workflow_name="per-customer", input={"customer": "acme"})
    approval_decide(run_id=acme1.id, step_id="ok", approved=True, by="otto")
    run_cancel(run_id=acme2.id, by="otto", reason="not needed")
    work_off([acme1, acme3])

    acme1.refresh_from_db(), acme3.refresh_from_db()
    assert acme1.status == RunStatus.SUCCEEDED and acme3.status == RunStatus.WAITING
