"""Who and why once (runs.audit): every operator service refuses a blank reason the same way, before it writes
anything, and journals the same by / who / why."""

import pytest

from journal.models import JournalEvent
from runs import services
from runs.audit import Audit
from runs.errors import ServiceError
from tests.helpers import drive, echo_step, make_run, tool_step

pytestmark = pytest.mark.django_db

BLANKS = ["", "   ", "\n\t"]


def _failed_run():
    run = make_run(steps=[tool_step("boom", "test_fail")])
    drive(run)
    return run


SERVICES = {
    "cancel": lambda run, reason: services.run_cancel(run_id=run.id, by="otto", reason=reason),
    "re-drive": lambda run, reason: services.run_redrive(run_id=run.id, by="otto", reason=reason, force=True),
    "retry": lambda run, reason: services.run_retry(run_id=run.id, by="otto", reason=reason),
    "fork": lambda run, reason: services.run_fork(run_id=run.id, from_step="boom", by="otto", reason=reason),
    "budget": lambda run, reason: services.run_budget_raise(run_id=run.id, by="otto", reason=reason, max_tokens=9),
    "bulk": lambda run, reason: services.bulk_start(action="cancel", filters={}, by="otto", reason=reason),
}


@pytest.mark.parametrize("blank", BLANKS)
@pytest.mark.parametrize("name", SERVICES)
def test_every_operator_service_refuses_a_blank_reason_before_writing(name, blank):
    run = _failed_run()
    before = JournalEvent.objects.count()
    with pytest.raises(ServiceError) as refused:
        SERVICES[name](run, blank)
    assert refused.value.code == "reason_required" and "needs a reason" in refused.value.detail
    assert JournalEvent.objects.count() == before


def test_the_journaled_who_and_why_is_one_shape():
    assert Audit(by="otto", why="flaky").payload(force=True) == {
        "by": "otto",
        "who": "otto",
        "why": "flaky",
        "force": True,
    }
    run = make_run(steps=[echo_step("a"), {"id": "go", "kind": "signal", "name": "go"}])
    drive(run)
    services.run_cancel(run_id=run.id, by="otto", reason="not needed")
    (cancelled,) = JournalEvent.objects.filter(run_id=run.id, kind="run_cancelled")
    assert {k: cancelled.payload[k] for k in ("by", "who", "why")} == {"by": "otto", "who": "otto", "why": "not needed"}
