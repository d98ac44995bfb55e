"""Flow control on the pages (issue 14): /ops/ lists the runs waiting on their budget and each rate limit's use; an
operator raises a budget from the run page or /ops/ (journaled with who and why) and the run goes on."""

import pytest

from runs.models import RateSlot, RunStatus
from runs.services import workflow_create
from tests.helpers import drive_to_end, make_run, step_events

pytestmark = pytest.mark.django_db


def waiting_on_budget():
    workflow_create(
        definition={
            "name": "capped-page",
            "budget": {"max_tokens": 1},
            "steps": [
                {"id": "a", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "one"},
                {"id": "b", "kind": "llm_call", "provider": "fake", "model": "m", "prompt": "two"},
            ],
        }
    )
    from runs.models import Workflow

    run = make_run(workflow=Workflow.objects.get(name="capped-page"))
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "budget"
    return run


def test_ops_lists_a_run_waiting_on_its_budget_and_the_rate_limits_use(operator, settings):
    settings.PAL_RATE_LIMITS = {"llm:m": {"requests_per_minute": 30}}
    run = waiting_on_budget()

    page = operator.get("/ops/").content.decode()

    assert "Pending budget decisions" in page and str(run.id)[:8] in page
    assert "of max_tokens 1" in page and 'action="/runs/' in page
    assert "llm:m" in page and f"{RateSlot.objects.filter(key='llm:m').count()} of 30" in page


def test_an_operator_raises_the_budget_from_the_run_page_and_the_run_goes_on(operator):
    run = waiting_on_budget()
    assert 'id="budget-panel"' in operator.get(f"/runs/{run.id}/").content.decode()

    answer = operator.post(
        f"/runs/{run.id}/budget/", {"max_tokens": "1000", "reason": "it is worth it", "next": f"/runs/{run.id}/"}
    )
    assert answer.status_code == 302
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED
    (raised,) = step_events(run, "budget_raised")
    assert (raised.payload["by"], raised.payload["why"], raised.payload["max_tokens"]) == (
        "otto",
        "it is worth it",
        1000,
    )


def test_a_budget_form_with_no_reason_changes_nothing_and_says_why(operator, viewer):
    run = waiting_on_budget()
    answer = operator.post(f"/runs/{run.id}/budget/", {"max_tokens": "1000", "reason": ""}, follow=True)
    assert "needs a reason" in answer.content.decode()
    assert step_events(run, "budget_raised") == []
    assert viewer.post(f"/runs/{run.id}/budget/", {"max_tokens": "5", "reason": "x"}).status_code == 403
