"""An operator's forced re-drive and a concurrency limit on real workers (issue 14): with max_runs 1, a run waiting on
its approval that is re-driven, forced, while another run of its group holds the slot is queued on the group, saying
why, with no task; once the slot frees it walks, finds its approval still undecided and parks again; decided, it
finishes. The journal's intervals never show two running at once, and each model call is made once."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunLock, RunStatus
from runs.services import approval_decide, run_redrive
from tests.durability.test_concurrency_wakeups_workers import first_waits_second_holds
from tests.helpers import describe, events, wait_for_end, wait_until
from tests.services.test_concurrency_wakeups import most_running_at_once

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_forced_redrive_of_a_waiting_run_waits_for_the_slot_and_never_runs_the_group_over(
    celery_workers, llm_provider
):
    first, second = first_waits_second_holds(celery_workers, llm_provider, names=("redrive-a", "redrive-b"))

    run_redrive(run_id=first.id, by="oscar", reason="it looks stuck", force=True)

    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED, describe(first)
    assert run_why(first).startswith("concurrency gate:: 1 of 1 running")
    assert not RunLock.objects.filter(run_id=first.id).exists()  # no task went out for it
    (redriven,) = events(first, "run_redriven")
    assert redriven.payload["force"] is True and redriven.payload["queued"]["max_runs"] == 1
    llm_provider.delay = 0.0
    second = wait_for_end(second, timeout=90)
    wait_until(  # the freed slot books it; its walk finds the approval undecided and parks again
        lambda: Run.objects.filter(id=first.id, status=RunStatus.WAITING, waiting_on__kind="approval").exists(),
        timeout=60,
        what="the re-driven run to take the freed slot and park on its approval again",
        explain=lambda: describe(first),
    )
    second_ended = next(e.created_at for e in events(second) if e.kind == "run_succeeded")
    assert [e.created_at for e in events(first) if e.kind == "run_started"][-1] >= second_ended

    approval_decide(run_id=first.id, step_id="ok", approved=True, by="otto")
    first = wait_for_end(first, timeout=90)

    assert (first.status, second.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED), describe(first)
    assert most_running_at_once([first, second]) == 1
    assert len(llm_provider.billed) == 2  # each run's call once
    assert [e.kind for e in events(first)].count("approval_requested") == 1
