"""The tour's Python workflow (workflows/refund.py) walks as README says: model, approval over 100, map, one email."""

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from runs.services import approval_decide
from tests.helpers import LOCMEM_MAIL, drive_to_end, mailer
from workflows.refund import refund

pytestmark = pytest.mark.django_db


def test_the_tours_refund_parks_for_approval_then_checks_each_line_and_mails_once(settings, mailoutbox):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    run = Run.objects.get(id=refund.start({"invoice_id": 7, "customer": "acme", "wait_seconds": 0}))
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "approval", (run.error, run.waiting_on)
    assert run.waiting_on["prompt"] == "Refund 123?"
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output["refunded"] == 123
    assert [c["sku"] for c in run.output["checks"]] == ["A-0", "A-1", "A-2"]
    started = JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id__regex=r"^[a-z_#0-9]+$")
    assert list(started.order_by("seq").values_list("step_id", flat=True)) == [
        "fetch_invoice",
        "llm",
        "approval",
        "map",
        "email",
    ]
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["customer@example.com"]
