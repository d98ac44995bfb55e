"""A walk whose slice is over (stopping) while one branch still runs and another waits out a backoff (Graph.later)
waits for the running one; it used to spin its thread at 100 % until it ended (issue 23, section 1)."""

import threading
import time

import pytest

from runs.models import Run, RunStatus
from runs.walk.scheduler import Graph
from tests.helpers import drive, make_run, step_events, tool_step

pytestmark = pytest.mark.django_db


def test_a_stopping_walk_with_a_branch_in_backoff_waits_for_the_running_one_without_spinning(monkeypatch, settings):
    settings.PAL_SLICE_SECONDS = 0.001  # the slice is over as soon as both branches started
    settings.PAL_ITEMS_ACROSS_WORKERS = False  # both run on this walk's threads
    sent = []
    monkeypatch.setattr("runs.walk.walk.enqueue_drive", lambda **kw: sent.append(kw))
    run = make_run(
        steps=[
            {**tool_step("flaky", "test_fail", retry={"max_attempts": 2, "backoff_seconds": 0.05}), "needs": []},
            {**tool_step("slow", "sleep", {"seconds": 1.5}), "needs": []},
        ]
    )
    run = Run.objects.get(id=run.id)

    waits = []  # each wait of the walk's loop for a branch's message, and whether the walk was stopping then
    next_message = Graph.next_message

    def recorded(graph, timeout):
        waits.append((graph.stopping, timeout))
        return next_message(graph, timeout)

    monkeypatch.setattr(Graph, "next_message", recorded)
    began_wall, began_cpu = time.monotonic(), time.thread_time()  # this thread is the walk's
    drive(run)
    wall, cpu = time.monotonic() - began_wall, time.thread_time() - began_cpu

    print(f"stopping walk: {wall:.2f} s wall, {cpu:.3f} s of the walk thread's CPU, {len(waits)} waits")
    assert threading.current_thread() is threading.main_thread()
    stopping = [timeout for was_stopping, timeout in waits if was_stopping]
    # It waited for the slow branch's message (no timeout): a spin was a wait of 0 s, again and again.
    assert stopping and all(timeout is None for timeout in stopping), stopping[:10]
    assert len(stopping) <= 3, len(stopping)
    # The slice ended: both attempts journaled, the run handed to a new task that takes the backoff on.
    assert [e.step_id for e in step_events(run, "step_failed")] == ["flaky"]
    assert step_events(run, "step_completed", "slow") and run.status == RunStatus.RUNNING and sent
