"""Pauses in the walk (issue 27): a paused workflow, run or fleet parks its runs at the start of a slice, holding no
lease; a paused dependency parks the step before its call while the run's other steps go on; `why` names the pause;
the resume wakes them and the journal says who and why both ways."""

import itertools
import time

import pytest
from django.core import mail
from django.db import connection

from runs.explain import run_why
from runs.models import RunLock, RunStatus
from runs.services import pause_create, pause_resume
from runs.steps.tools import tool
from tests.helpers import LOCMEM_MAIL, drive, drive_to_end, echo, email, events, kinds, mailer, make_run, make_workflow

pytestmark = pytest.mark.django_db(transaction=True)


@tool("test_resume_pause")
def resume_pause_tool(args, ctx):
    """Resumes a pause from inside a run's walk, a moment after its other branch looked at it."""
    time.sleep(0.3)
    try:
        pause_resume(pause_id=args["pause"], by="bob", reason="back")
    finally:
        connection.close()  # the branch's own thread: its connection is not the walk's
    return {"resumed": True}


def test_a_paused_workflow_holds_a_new_run_until_the_resume_wakes_it():
    workflow = make_workflow(steps=[echo("a"), echo("b")], name="billing")
    pause = pause_create(scope="workflow", target="billing", by="alice", reason="bad prompt")
    run = make_run(workflow=workflow)

    drive(run)

    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "paused"
    assert not RunLock.objects.filter(run_id=run.id).exists()  # no lease, no worker
    assert run_why(run) == "paused: workflow billing by alice: bad prompt"
    paused = events(run, "run_paused")[0].payload
    assert paused["by"] == "alice" and paused["why"] == "bad prompt" and paused["pause"] == str(pause.id)
    assert "step_started" not in kinds(run)

    pause_resume(pause_id=pause.id, by="bob", reason="prompt mended")
    run.refresh_from_db()
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    resumed = events(run, "run_resumed")[0].payload
    assert resumed["by"] == "bob" and "prompt mended" in resumed["why"]


def test_a_paused_dependency_parks_its_step_before_the_call_while_the_other_steps_go_on(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    pause = pause_create(scope="dependency", target="email", by="alice", reason="smtp outage")
    run = make_run(
        steps=[
            {**email("mail", "ops@example.com", "hi", "body"), "needs": []},
            {**echo("other"), "needs": []},
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.WAITING
    assert [e.step_id for e in events(run, "step_completed")] == ["other"]
    assert mail.outbox == [] and "side_effect_claimed" not in kinds(run)  # parked before the call
    assert run_why(run).startswith("paused: email by alice: smtp outage")
    assert events(run, "run_paused")[0].step_id == "mail"

    pause_resume(pause_id=pause.id, by="alice", reason="smtp back")
    run.refresh_from_db()
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED and len(mail.outbox) == 1


def test_a_run_pause_holds_that_run_only_and_a_fleet_pause_holds_every_run():
    held, free = make_run(), make_run()
    pause_create(scope="run", target=str(held.id), by="alice", reason="look at it")

    drive(held), drive(free)

    assert held.status == RunStatus.WAITING and free.status == RunStatus.SUCCEEDED
    fleet = pause_create(scope="fleet", target="", by="alice", reason="deploy")
    later = make_run()
    drive(later)
    assert later.status == RunStatus.WAITING and run_why(later) == "paused: the fleet by alice: deploy"
    pause_resume(pause_id=fleet.id, by="alice", reason="deployed")
    later.refresh_from_db()
    drive_to_end(later)
    assert later.status == RunStatus.SUCCEEDED


def test_a_paced_resume_gives_each_held_run_its_own_wake_time_by_the_database_clock():
    workflow = make_workflow(steps=[echo("a")])
    pause = pause_create(scope="workflow", target=workflow.name, by="alice", reason="hold")
    runs = [make_run(workflow=workflow) for _ in range(4)]
    for run in runs:
        drive(run)

    _, released = pause_resume(pause_id=pause.id, by="alice", reason="go", per_second=2)

    for run in runs:
        run.refresh_from_db()
    assert released == 4 and all(run.status == RunStatus.WAITING for run in runs)  # woken by their timers
    gaps = [(b.wake_at - a.wake_at).total_seconds() for a, b in itertools.pairwise(runs)]
    assert gaps == pytest.approx([0.5, 0.5, 0.5], abs=0.001)
    assert "resumed, it goes on at" in run_why(runs[-1])


def test_a_pause_resumed_while_its_step_parks_lets_the_call_go_on_and_parks_nothing(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    pause = pause_create(scope="dependency", target="email", by="alice", reason="smtp outage")
    run = make_run(
        steps=[
            {**email("mail", "ops@example.com", "hi", "body"), "needs": []},
            {
                "id": "resume",
                "kind": "tool_call",
                "tool": "test_resume_pause",
                "args": {"pause": str(pause.id)},
                "needs": [],
            },
        ]
    )

    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED and len(mail.outbox) == 1
    assert "run_paused" not in kinds(run) and "run_waiting" not in kinds(run)
