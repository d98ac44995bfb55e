"""A move on real workers (issue 27, section 2): a run parked on an approval after an email step is moved to a new
version that adds a step after the approval; approved, it finishes on the new version, the email was sent exactly
once (the SMTP sink counts), and the new step ran. The move is journaled with who and why."""

import uuid

import pytest

from runs.audit import Audit
from runs.models import Run, RunLock, RunStatus
from runs.services import approval_decide, run_move, workflow_create
from runs.services.ingest import run_create
from tests.helpers import QUICK, describe, echo, email, events, wait_for_end, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_run_parked_after_an_email_moves_to_a_version_with_a_new_step_and_sends_the_email_once(
    celery_workers, smtp_sink
):
    celery_workers(smtp_sink.env(), name="move-a", **QUICK)
    name = f"move-{uuid.uuid4().hex[:10]}"
    mail = email("mail", "ops@example.com", "Ticket {{ input.id }}", "about {{ input.id }}")
    review = {"id": "review", "kind": "approval", "prompt": "Close ticket {{ input.id }}?"}
    workflow_create(definition={"name": name, "steps": [mail, review]})
    v2 = workflow_create(definition={"name": name, "steps": [mail, review, echo("close", ticket="{{ input.id }}")]})
    run, _ = run_create(workflow_name=name, version=1, input={"id": "T-7"})

    wait_until(
        lambda: Run.objects.filter(id=run.id, status=RunStatus.WAITING).exists(),
        timeout=60,
        what="the run parked on its approval",
        explain=lambda: describe(run),
    )
    smtp_sink.wait_for_messages(1)

    moved = run_move(run_id=run.id, version=v2.version, audit=Audit(by="olga", why="v2 closes the ticket"))

    assert [s["step_id"] for s in moved["reused"]] == ["mail", "review"] and moved["rerun"] == []
    assert [s["step_id"] for s in moved["new"]] == ["close"] and moved["wakes"] is False
    run.refresh_from_db()
    assert (run.status, run.workflow_id) == (RunStatus.WAITING, v2.id)
    assert not RunLock.objects.filter(run_id=run.id).exists()  # parked: no lease, no worker
    approval_decide(run_id=run.id, step_id="review", approved=True, by="ada", comment="close it")

    run = wait_for_end(run, timeout=60)
    assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert run.workflow.version == 2 and run.output == {"ticket": "T-7"}  # the new step ran, and is the output
    assert len(smtp_sink.messages) == 1  # the email was sent exactly once
    assert [e.step_id for e in events(run, "step_started") if e.step_id == "mail"] == ["mail"]
    (summary,) = [e for e in events(run, "definition_moved") if e.step_id is None]
    assert (summary.payload["from"], summary.payload["to"], summary.payload["by"]) == (1, 2, "olga")
    assert [e.step_id for e in events(run, "step_completed")] == ["mail", "review", "close"]
