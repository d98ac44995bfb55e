"""The sweep's backstop for bulk actions (a task lost with the broker, or whose worker died) and its bounded
history of sweeps."""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import recovery
from runs.models import BulkAction, BulkStatus, Run, RunStatus, Sweep
from runs.recovery import bulk_actions_resend, sweep_once, sweeps_prune
from runs.services import bulk as bulk_service
from runs.services import bulk_apply, bulk_start, run_cancel
from tests.helpers import echo_step, make_run, make_workflow, step_events

pytestmark = pytest.mark.django_db

APPROVAL = {"id": "review", "kind": "approval", "prompt": "Go on?"}


class SentBulks(list):
    """Stands in for the Celery task: records the bulk ids sent (after commit)."""

    def apply_async(self, args):
        self.append(*args)


@pytest.fixture
def sent_bulks(monkeypatch):
    sent = SentBulks()
    monkeypatch.setattr("runs.dispatch.bulk", sent)
    return sent


@pytest.fixture(autouse=True)
def _grace(settings):
    settings.PAL_RECOVERY_INTERVAL = 5
    settings.PAL_LEASE_TTL = 5


def live_runs(n: int) -> list[Run]:
    workflow = make_workflow(steps=[APPROVAL, echo_step("after")])
    return [make_run(workflow=workflow) for _ in range(n)]


def start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks) -> BulkAction:
    """A bulk cancel of these runs, its task sent (and then lost). Sorts `runs` in the order it applies them."""
    with django_capture_on_commit_callbacks(execute=True):
        bulk = bulk_start(action="cancel", filters={"ids": [str(r.id) for r in runs]}, reason="cleanup", by="otto")
    assert sent_bulks == [bulk.id]
    sent_bulks.clear()
    runs.sort(key=lambda run: bulk.run_ids.index(str(run.id)))
    return bulk


def quiet_for(bulk: BulkAction, seconds: float) -> None:
    BulkAction.objects.filter(id=bulk.id).update(updated_at=timezone.now() - timedelta(seconds=seconds))


def cancelled_events(run) -> int:
    return len(step_events(run, "run_cancelled"))


# --- a pending bulk action whose task was lost ------------------------------------------------------


def test_the_sweep_sends_a_lost_pending_bulk_task_again_once_its_grace_has_passed(
    sent_bulks, django_capture_on_commit_callbacks
):
    runs = live_runs(2)
    bulk = start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks)  # its message is then lost

    with django_capture_on_commit_callbacks(execute=True):
        early = sweep_once(who="test")
    assert sent_bulks == [] and early.bulk_resent == []  # within the grace its message may still be in the broker

    quiet_for(bulk, 6)
    with django_capture_on_commit_callbacks(execute=True):
        late = sweep_once(who="test")
    assert sent_bulks == [bulk.id]
    assert late.bulk_resent == [bulk.id] and Sweep.objects.get(id=late.id).bulk_resent == [bulk.id]

    bulk_apply(bulk_id=bulk.id)  # what the re-sent task does
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.failed, bulk.position) == (BulkStatus.DONE, 2, 0, 2)
    assert {r.status for r in Run.objects.filter(id__in=[r.id for r in runs])} == {RunStatus.CANCELLED}


def test_a_resent_bulk_task_is_sent_once_per_grace_and_a_second_delivery_does_nothing(
    sent_bulks, django_capture_on_commit_callbacks
):
    runs = live_runs(1)
    bulk = start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks)
    quiet_for(bulk, 6)
    with django_capture_on_commit_callbacks(execute=True):
        assert bulk_actions_resend() == [bulk.id]
        assert bulk_actions_resend() == []  # the send is a sign of life: the next sweep waits a grace again
    assert sent_bulks == [bulk.id]

    bulk_apply(bulk_id=bulk.id)
    bulk_apply(bulk_id=bulk.id)  # the original message, delivered late after all
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.failed) == (BulkStatus.DONE, 1, 0)
    assert cancelled_events(runs[0]) == 1


def test_the_sweep_leaves_done_bulk_actions_alone(sent_bulks, django_capture_on_commit_callbacks):
    bulk = start_cancel(live_runs(1), sent_bulks, django_capture_on_commit_callbacks)
    bulk_apply(bulk_id=bulk.id)
    quiet_for(bulk, 600)
    with django_capture_on_commit_callbacks(execute=True):
        assert bulk_actions_resend() == []
    assert sent_bulks == []


# --- a running bulk action whose task died ----------------------------------------------------------


def test_a_running_bulk_action_whose_task_died_goes_on_after_the_last_run_it_counted(
    sent_bulks, django_capture_on_commit_callbacks
):
    runs = live_runs(3)
    bulk = start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks)
    # Its task claimed it, cancelled and counted the first run, and died.
    run_cancel(run_id=runs[0].id, by="otto", reason="cleanup")
    BulkAction.objects.filter(id=bulk.id).update(status=BulkStatus.RUNNING, claim="dead-delivery", position=1, done=1)

    redelivered = bulk_apply(bulk_id=bulk.id)  # the worker-lost redelivery: it is running, so it is left alone
    assert redelivered is None and BulkAction.objects.get(id=bulk.id).position == 1

    quiet_for(bulk, 6)
    with django_capture_on_commit_callbacks(execute=True):
        assert bulk_actions_resend() == [bulk.id]
    assert BulkAction.objects.get(id=bulk.id).status == BulkStatus.PENDING
    bulk_apply(bulk_id=bulk.id)

    bulk.refresh_from_db()
    # The first run is neither cancelled again nor counted as refused ("already ended") by the new delivery.
    assert (bulk.status, bulk.done, bulk.failed, bulk.errors, bulk.position) == (BulkStatus.DONE, 3, 0, [], 3)
    assert [cancelled_events(r) for r in runs] == [1, 1, 1]


@pytest.mark.django_db(transaction=True)
def test_a_delivery_whose_claim_was_taken_over_stops_without_committing_the_run_it_was_on(
    sent_bulks, django_capture_on_commit_callbacks, monkeypatch
):
    runs = live_runs(3)
    bulk = start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks)
    real_cancel = bulk_service.run_cancel  # what bulk_apply calls for each run

    def sweep_takes_over():  # what bulk_actions_resend writes, committed on its own
        BulkAction.objects.filter(id=bulk.id).update(status=BulkStatus.PENDING, claim="")

    def slow_after_the_first_run(*, run_id, by, reason):
        if str(run_id) == str(runs[0].id):
            # This delivery stalls after the first run's commit, long enough for the sweep to hand it on.
            transaction.on_commit(sweep_takes_over)
        return real_cancel(run_id=run_id, by=by, reason=reason)

    monkeypatch.setattr(bulk_service, "run_cancel", slow_after_the_first_run)
    bulk_apply(bulk_id=bulk.id)
    bulk.refresh_from_db()
    assert (bulk.status, bulk.position, bulk.done, bulk.failed) == (BulkStatus.PENDING, 1, 1, 0)
    assert Run.objects.get(id=runs[1].id).status != RunStatus.CANCELLED  # its cancel was undone with it
    assert cancelled_events(runs[1]) == 0

    monkeypatch.setattr(bulk_service, "run_cancel", real_cancel)
    bulk_apply(bulk_id=bulk.id)  # the delivery the sweep sent
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.failed, bulk.position) == (BulkStatus.DONE, 3, 0, 3)
    assert [cancelled_events(r) for r in runs] == [1, 1, 1]


def test_refusals_are_counted_once_across_a_take_over(sent_bulks, django_capture_on_commit_callbacks):
    runs = live_runs(2)
    bulk = start_cancel(runs, sent_bulks, django_capture_on_commit_callbacks)
    run_cancel(run_id=runs[1].id, by="someone", reason="earlier")  # the bulk's cancel of it is refused
    BulkAction.objects.filter(id=bulk.id).update(status=BulkStatus.RUNNING, claim="dead-delivery")
    quiet_for(bulk, 6)
    with django_capture_on_commit_callbacks(execute=True):
        bulk_actions_resend()
    bulk_apply(bulk_id=bulk.id)
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done, bulk.failed) == (BulkStatus.DONE, 1, 1)
    assert [e["run_id"] for e in bulk.errors] == [str(runs[1].id)] and bulk.errors[0]["code"] == "run_ended"


# --- the history of sweeps --------------------------------------------------------------------------


def old_sweeps(n: int) -> list[Sweep]:
    start = timezone.now() - timedelta(hours=1)
    return [
        Sweep.objects.create(started_at=start + timedelta(seconds=i), finished_at=start + timedelta(seconds=i))
        for i in range(n)
    ]


def test_a_sweep_due_for_its_housekeeping_keeps_only_the_newest_pal_sweep_history_sweeps(settings, monkeypatch):
    settings.PAL_SWEEP_HISTORY = 10
    made = old_sweeps(15)
    monkeypatch.setattr(recovery, "_housekept_at", [-recovery.HOUSEKEEPING_EVERY])  # this process's first pass

    latest = sweep_once(who="test")

    kept = list(Sweep.objects.order_by("-started_at").values_list("id", flat=True))
    assert kept == [latest.id, *[s.id for s in reversed(made)][:9]]


def test_pruning_the_sweeps_is_one_delete_and_a_short_history_loses_nothing():
    old_sweeps(5)
    with CaptureQueriesContext(connection) as queries:
        assert sweeps_prune(keep=10) == 0
    assert len(queries) == 1 and queries[0]["sql"].startswith("DELETE")
    assert Sweep.objects.count() == 5
    assert sweeps_prune(keep=3) == 2
    assert Sweep.objects.count() == 3


def test_a_sweep_between_housekeepings_prunes_nothing(settings, monkeypatch):
    settings.PAL_SWEEP_HISTORY = 10
    old_sweeps(15)
    monkeypatch.setattr(recovery, "_housekept_at", [-recovery.HOUSEKEEPING_EVERY])
    sweep_once(who="test")
    sweep_once(who="test")  # within the minute: the table may grow by the passes of a minute, no more
    assert Sweep.objects.count() == 11
