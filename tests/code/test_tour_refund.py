"""The tour's Python workflow (workflows/refund.py) walks as README says: model, approval over 100, map, one email."""

import pytest

from journal.models import JournalEvent
from runs.models import Run, RunStatus
from runs.services import approval_decide
from tests.helpers import LOCMEM_MAIL, drive_to_end, mailer
from workflows.refund import refund, refund_agent

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


def test_the_tours_agent_looks_up_parks_on_the_refund_then_answers_with_both_results():
    ticket = (
        'Refund invoice 7.\ncall lookup_invoice {"invoice_id": 7}\ncall refund_payment {"invoice_id": 7, "amount": 123}'
    )
    run = Run.objects.get(id=refund_agent.start({"ticket": ticket}))
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "approval", (run.error, run.waiting_on)
    lookup = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="llm[1.0]")
    assert lookup.payload["output"] == {"id": 7, "amount": 123, "paid": True}
    assert not JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id="llm[1.1]").exists()
    approval_decide(
        run_id=run.id, step_id="llm[1.1]", approved=True, by="alice", arguments={"invoice_id": 7, "amount": 100}
    )
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refund = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="llm[1.1]")
    assert refund.payload["output"] == {"invoice_id": 7, "refunded": 100}
    assert run.output["turns"] == 2 and "refunded" in run.output["reply"]
