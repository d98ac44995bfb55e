"""Pauses on real workers (issue 27): a paused webhook host parks every run's webhook step before its call while
the runs' other steps go on; a paced resume at 5 a second delivers each call exactly once and the receiver never
sees more than 5 in any second; a paused workflow holds its new runs, and a kill -9 of the worker meanwhile changes
nothing; a fleet pause holds every run."""

import uuid
from urllib.parse import urlsplit

import pytest

from runs.models import Run, RunStatus
from runs.recovery import sweep_once
from runs.services import pause_create, pause_resume, workflow_create
from runs.services.ingest import run_create
from tests.helpers import QUICK, describe, echo, events, sweep_until_end, wait_for_end, wait_until, webhook

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _workflow(*steps: dict) -> str:
    name = f"pauses-{uuid.uuid4().hex[:10]}"
    workflow_create(definition={"name": name, "steps": list(steps)})
    return name


def _start(name: str, n: int, **input_of) -> list[Run]:
    return [run_create(workflow_name=name, input={"n": index})[0] for index in range(n)]


def _all_held(runs: list[Run], pause) -> bool:
    rows = Run.objects.filter(id__in=[run.id for run in runs])
    return all(row.status == RunStatus.WAITING and (row.waiting_on or {}).get("pause") == str(pause.id) for row in rows)


def test_a_paced_resume_of_a_webhook_host_delivers_each_call_once_at_most_five_a_second(
    celery_workers, webhook_receiver
):
    celery_workers(webhook_receiver.env(), name="pace-a", concurrency=2, **QUICK)
    celery_workers(webhook_receiver.env(), name="pace-b", concurrency=2, **QUICK)
    host = urlsplit(webhook_receiver.url).hostname
    pause = pause_create(scope="dependency", target=f"webhook:{host}", by="alice", reason="receiver overloaded")
    name = _workflow(
        {**webhook("hook", webhook_receiver.url, {"n": "{{ input.n }}"}), "needs": []},
        {**echo("other"), "needs": []},
    )
    runs = _start(name, 10)

    wait_until(lambda: _all_held(runs, pause), timeout=60, what="every run parked on the webhook host's pause")

    assert webhook_receiver.requests == []  # parked before the call
    for run in runs:
        assert [e.step_id for e in events(run, "step_completed")] == ["other"]  # the other step went on
        assert events(run, "run_paused")[0].step_id == "hook"
    _, released = pause_resume(pause_id=pause.id, by="alice", reason="receiver scaled", per_second=5)
    assert released == 10

    for run in runs:
        run = wait_for_end(run, timeout=90)
        assert run.status == RunStatus.SUCCEEDED, describe(run)
    assert len(webhook_receiver.deliveries) == 10
    assert sorted(webhook_receiver.dedup.values()) == [1] * 10  # each call exactly once
    arrivals = sorted(request.received_at for request in webhook_receiver.deliveries)
    busiest = max(sum(1 for t in arrivals if start <= t < start + 1.0) for start in arrivals)
    print(f"paced at 5/s: 10 calls over {arrivals[-1] - arrivals[0]:.2f}s, at most {busiest} in any second")
    assert busiest <= 5


def test_a_paused_workflow_holds_its_new_runs_and_a_kill_9_meanwhile_changes_nothing(celery_workers):
    first = celery_workers(name="held-a", **QUICK)
    name = _workflow(echo("a"), echo("b"))
    pause = pause_create(scope="workflow", target=name, by="alice", reason="bad prompt")
    runs = _start(name, 3)
    wait_until(lambda: _all_held(runs, pause), timeout=60, what="the new runs held by the workflow's pause")
    journals = {run.id: len(events(run)) for run in runs}

    first.kill()  # kill -9 while the runs are held
    sweep_once(who="test")
    assert _all_held(runs, pause)
    assert {run.id: len(events(run)) for run in runs} == journals  # the sweep found nothing to do
    later = _start(name, 1)  # a run created while paused is created, and waits
    pause_resume(pause_id=pause.id, by="bob", reason="prompt mended", per_second=2)
    celery_workers(name="held-b", **QUICK)  # the paced wake-ups wait in the broker for a worker

    for run in runs:
        run = wait_for_end(run, timeout=60)
        assert run.status == RunStatus.SUCCEEDED, describe(run)
        assert events(run, "run_resumed")[0].payload["by"] == "bob"
        assert len(events(run, "run_paused")) == 1
    # Created while paused but walked only after the resume (no worker lived): it never waited.
    assert wait_for_end(later[0], timeout=60).status == RunStatus.SUCCEEDED


def test_a_fleet_pause_holds_every_workflow_until_the_resume(celery_workers):
    celery_workers(name="fleet", **QUICK)
    pause = pause_create(scope="fleet", target="*", by="alice", reason="deploy")
    runs = [*_start(_workflow(echo("a")), 1), *_start(_workflow(echo("b")), 1)]
    wait_until(lambda: _all_held(runs, pause), timeout=60, what="every run held by the fleet pause")

    pause_resume(pause_id=pause.id, by="alice", reason="deployed")

    for run in runs:
        assert wait_for_end(run, timeout=60).status == RunStatus.SUCCEEDED
        assert events(run, "run_resumed")[0].payload["by"] == "alice"  # woken by the resume: no sweep, no beat


def test_a_kill_9_during_a_paced_resume_loses_no_held_run(celery_workers):
    first = celery_workers(name="paced-a", **QUICK)
    name = _workflow(echo("a"))
    pause = pause_create(scope="workflow", target=name, by="alice", reason="hold")
    runs = _start(name, 5)
    wait_until(lambda: _all_held(runs, pause), timeout=60, what="the runs held by the workflow's pause")

    pause_resume(pause_id=pause.id, by="bob", reason="go slowly", per_second=1)
    wait_until(
        lambda: Run.objects.filter(id__in=[r.id for r in runs], status=RunStatus.SUCCEEDED).count() >= 1,
        timeout=30,
        what="the first paced run to end",
    )
    first.kill()  # kill -9 mid-release: the wake-ups it had taken from the broker die with it
    celery_workers(name="paced-b", **QUICK)

    for run in runs:  # the sweep wakes a turn that is due (wake_at is in the database)
        run = sweep_until_end(run, timeout=60)
        assert run.status == RunStatus.SUCCEEDED, describe(run)
        assert len(events(run, "step_completed")) == 1
        assert any(e.payload["by"] == "bob" for e in events(run, "run_resumed"))
