"""Reruns (issue 27, section 3): the runs a filter selects, rerun from their failed step (a retry in place) or from a
step (a failed run retried in place from there; one that succeeded forked), one turn at a time, paced, abortable,
each run once however many deliveries of the task come; the sweep gives a chain that died a new claim."""

from datetime import timedelta

import pytest
from django.utils import timezone

from journal.receipts import receipt_build
from journal.selectors import waterfall_bars
from runs.models import Rerun, RerunItem, RerunItemStatus, RerunStatus, Run, RunStatus
from runs.recovery import reruns_resend
from runs.services import rerun_abort, rerun_advance, rerun_preview, rerun_start, run_retry
from tests.helpers import drive_to_end, echo_step, make_run, make_workflow, record_drive_sends, step_events, tool_step

pytestmark = pytest.mark.django_db

FLAKY = tool_step("charge", "test_fail_before", {"succeed_on": 2})  # fails its first attempt, then works


class SentReruns(list):
    """Stands in for the rerun task: records (rerun id, claim, countdown) of each send."""

    def apply_async(self, args, countdown=None):
        self.append((args[0], args[1], countdown))


@pytest.fixture
def sent(monkeypatch):
    record_drive_sends(monkeypatch)
    reruns = SentReruns()
    monkeypatch.setattr("runs.dispatch.rerun", reruns)
    return reruns


@pytest.fixture(autouse=True)
def _grace(settings):
    settings.PAL_RECOVERY_INTERVAL = 5
    settings.PAL_LEASE_TTL = 5


def ended(workflow, n: int) -> list[Run]:
    runs = [make_run(workflow=workflow, input={"n": i}) for i in range(n)]
    for run in runs:
        drive_to_end(run)
    return runs


def start(**kwargs) -> Rerun:
    kwargs.setdefault("reason", "the card processor was down")
    kwargs.setdefault("by", "otto")
    return rerun_start(**kwargs)


def retried_by(run, rerun) -> list:
    return [e for e in step_events(run, "run_retried") if (e.payload.get("rerun_job") or {}).get("id") == str(rerun.id)]


def test_a_dry_run_counts_the_runs_the_filter_selects_and_plans_each(sent):
    billing = make_workflow(steps=[echo_step("load"), FLAKY], name="billing")
    failed = ended(billing, 3)
    ended(make_workflow(steps=[echo_step("fine")], name="other"), 1)  # another workflow's run is not selected

    preview = rerun_preview(filter={"workflow": "billing"}, from_step="failed", per_second=2)

    assert preview["count"] == 3 == len(failed) and preview["actions"] == {"retry": 3, "fork": 0}
    assert preview["seconds"] == 1.5 and preview["too_many"] is False
    assert [plan["run_id"] for plan in preview["preview"]] == [str(run.id) for run in failed]  # oldest first
    plan = preview["preview"][0]
    assert plan["action"] == "retry" and plan["failed_step"] == "charge" and plan["refused"] is None
    assert [(s["step_id"], s["attempt"]) for s in plan["reused"]] == [("load", 1)]
    assert [(s["step_id"], s["attempt"], s["why"]) for s in plan["rerun"]] == [("charge", 2, "failed")]
    assert not Rerun.objects.exists()  # a dry run starts nothing


def test_a_rerun_retries_each_failed_run_once_journaled_with_the_rerun(sent):
    runs = ended(make_workflow(steps=[echo_step("load"), FLAKY]), 3)
    rerun = start(filter={}, from_step="failed", name="INC-7")
    assert (rerun.status, rerun.count, rerun.done) == (RerunStatus.RUNNING, 3, 0)

    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)  # a second delivery of the task: nothing is left to do

    rerun.refresh_from_db()
    assert (rerun.status, rerun.done, rerun.refused) == (RerunStatus.DONE, 3, 0) and rerun.finished_at
    for run in runs:
        (row,) = retried_by(run, rerun)
        assert (row.step_id, row.attempt, row.payload["by"], row.payload["why"]) == (
            "charge",
            2,
            "otto",
            "the card processor was down",
        )
        assert row.payload["rerun_job"] == {"id": str(rerun.id), "name": "INC-7"}
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING
        drive_to_end(run)
        assert run.status == RunStatus.SUCCEEDED
    assert set(RerunItem.objects.values_list("status", "action")) == {(RerunItemStatus.RERUN, "retry")}


def test_a_paced_rerun_takes_one_run_a_turn_and_sends_its_next_turn_for_when_it_is_due(
    sent, django_capture_on_commit_callbacks
):
    ended(make_workflow(steps=[FLAKY]), 3)
    rerun = start(filter={}, from_step="failed", per_second=0.5)

    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)
    with django_capture_on_commit_callbacks(execute=True):
        rerun_advance(rerun_id=rerun.id, claim=rerun.claim)  # early: its turn is not due yet

    rerun.refresh_from_db()
    assert rerun.done == 1 and rerun.status == RerunStatus.RUNNING
    (rerun_id, claim, countdown) = sent[-1]
    assert (rerun_id, claim) == (str(rerun.id), rerun.claim) and 1.0 < countdown <= 2.0  # 1/per_second
    Rerun.objects.filter(id=rerun.id).update(next_at=timezone.now())  # its turn came
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)
    assert Rerun.objects.get(id=rerun.id).done == 2


def test_from_a_step_a_failed_run_is_retried_in_place_from_there(sent):
    (run,) = ended(make_workflow(steps=[echo_step("load"), echo_step("price"), FLAKY], name="shop"), 1)
    preview = rerun_preview(filter={"workflow": "shop"}, from_step="price")
    assert [(s["step_id"], s["attempt"]) for s in preview["preview"][0]["rerun"]] == [("price", 2), ("charge", 2)]

    rerun = start(filter={"workflow": "shop"}, from_step="price")
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    assert [(e.step_id, e.attempt) for e in retried_by(run, rerun)] == [("charge", 2), ("price", 2)]
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED
    assert [e.attempt for e in step_events(run, "step_started", "price")] == [1, 2]  # a fresh attempt, a new key
    assert [e.attempt for e in step_events(run, "step_started", "load")] == [1]  # reused
    # The receipt and the waterfall read the retry's two rows as one retry that reused load alone.
    receipt = receipt_build(run_id=run.id)
    reused = {(s["step_id"], s["attempt"]): [r["kind"] for r in s["reused"]] for s in receipt["steps"]}
    assert reused[("load", 1)] == ["retried"] and reused[("price", 1)] == [] and reused[("price", 2)] == []
    assert [bar["step_id"] for bar in waterfall_bars(run_id=run.id) if bar["cached"]] == ["load"]


def test_from_a_step_a_succeeded_run_is_forked(sent):
    (run,) = ended(make_workflow(steps=[echo_step("load"), echo_step("notify")], name="mailer"), 1)
    assert run.status == RunStatus.SUCCEEDED

    rerun = start(filter={"workflow": "mailer", "status": "succeeded"}, from_step="notify", name="INC-9")
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    item = RerunItem.objects.get(rerun=rerun)
    assert item.action == "fork" and item.status == RerunItemStatus.RERUN and item.fork_run_id is not None
    (forked,) = step_events(run, "run_forked")
    assert forked.payload["rerun_job"] == {"id": str(rerun.id), "name": "INC-9"}
    assert forked.payload["fork_run_id"] == str(item.fork_run_id) and forked.payload["reused"] == ["load"]
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED  # the original stays as it ended


def test_a_run_that_is_no_longer_failed_is_refused_and_counted(sent):
    first, second = ended(make_workflow(steps=[FLAKY]), 2)
    rerun = start(filter={}, from_step="failed")
    run_retry(run_id=first.id, by="alice", reason="by hand meanwhile")

    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    rerun.refresh_from_db()
    assert (rerun.status, rerun.done, rerun.refused) == (RerunStatus.DONE, 2, 1)
    refused = RerunItem.objects.get(rerun=rerun, run=first)
    assert refused.status == RerunItemStatus.REFUSED and refused.code == "run_not_failed"
    assert retried_by(first, rerun) == [] and len(retried_by(second, rerun)) == 1


def test_an_abort_stops_the_turns_and_a_second_abort_is_a_conflict(sent):
    ended(make_workflow(steps=[FLAKY]), 3)
    rerun = start(filter={}, from_step="failed", per_second=0.2)
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    aborted = rerun_abort(rerun_id=rerun.id, by="alice", reason="the processor is down again")
    Rerun.objects.filter(id=rerun.id).update(next_at=timezone.now())
    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)

    assert (aborted.status, aborted.aborted_by, aborted.abort_reason) == (
        "aborted",
        "alice",
        "the processor is down again",
    )
    assert Rerun.objects.get(id=rerun.id).done == 1
    assert RerunItem.objects.filter(rerun=rerun, status=RerunItemStatus.PENDING).count() == 2
    with pytest.raises(Exception, match="only a running rerun can be aborted") as refused:
        rerun_abort(rerun_id=rerun.id, by="alice", reason="again")
    assert refused.value.code == "rerun_ended"


def test_the_sweep_gives_a_quiet_rerun_a_new_chain_and_the_old_one_reruns_nothing(
    sent, django_capture_on_commit_callbacks
):
    runs = ended(make_workflow(steps=[FLAKY]), 2)
    rerun = start(filter={}, from_step="failed")
    assert reruns_resend() == []  # within the grace its task may still be in the broker

    long_ago = timezone.now() - timedelta(seconds=60)
    Rerun.objects.filter(id=rerun.id).update(updated_at=long_ago, next_at=long_ago)
    with django_capture_on_commit_callbacks(execute=True):
        assert reruns_resend() == [str(rerun.id)]
    (_, claim, _) = sent[-1]
    assert claim != rerun.claim

    rerun_advance(rerun_id=rerun.id, claim=rerun.claim)  # the old chain, late: it takes no turn
    assert Rerun.objects.get(id=rerun.id).done == 0
    rerun_advance(rerun_id=rerun.id, claim=claim)
    assert Rerun.objects.get(id=rerun.id).status == RerunStatus.DONE
    assert [len(retried_by(run, rerun)) for run in runs] == [1, 1]


def test_a_rerun_that_selects_nothing_is_done_at_once(sent):
    rerun = start(filter={"workflow": None}, from_step="failed")
    assert (rerun.status, rerun.count) == (RerunStatus.DONE, 0) and rerun.finished_at
    assert sent == []
