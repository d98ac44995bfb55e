"""PAL Ops' graphs (issue 12): scenarios G (a fan-out of no-op items) and H (independent steps side by side).

Each function runs in its own child process (`bench.child`) with a fresh database and broker
(`common.ours_env()`), on real `celery -A pal worker --pool solo` processes; worker start-up, migrations and
a warm-up run stay outside the timed part, as in bench/ours.py. The peers of G are in bench/peers_dbos.py
(`throughput` with `steps=1` and a global queue concurrency) and bench/peers_celery.py (`group_fan_out`).

- G (`fan_out`): one run whose one step is a `for_each` of `items` no-op `tool_call` items (tool `echo`) with
  `max_concurrency`; or (`shape="list"`) one run of the same number of echo steps as a plain list. Items per
  second from just before `run_create` to the run's `finished_at`.
- H (`parallel_sleeps`): one run of `steps` independent `sleep` tool steps (`needs: []`); the run's wall time
  from its journal (`run_started` to `run_succeeded`) divided by the sleep.
"""

from __future__ import annotations

import time

from bench import common

RUN_LIMIT = 240.0  # seconds a measured run may take before we call it stuck


def _workflow(name: str, steps: list[dict]):
    from runs import services

    return services.workflow_create(definition={"name": name, "steps": steps})


def _fan_out_steps(max_concurrency: int) -> list[dict]:
    return [
        {
            "id": "fan",
            "kind": "tool_call",
            "tool": "echo",
            "args": {"i": "{{ item }}"},
            "for_each": "{{ input.items }}",
            "max_concurrency": max_concurrency,
        }
    ]


def _list_steps(steps: int) -> list[dict]:
    return [{"id": f"s{i}", "kind": "tool_call", "tool": "echo", "args": {"i": i}} for i in range(steps)]


def _finished(run_id, timeout: float):
    from runs.models import FINAL_STATUSES, Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(id=run_id)
        if run.status in FINAL_STATUSES:
            if run.status != "succeeded":
                raise RuntimeError(f"run {run.id} ended {run.status}: {run.error}")
            return run
        time.sleep(0.05)
    raise RuntimeError(f"run {run_id} not finished after {timeout:.0f}s")


def _journal_wall(run) -> float:
    """Seconds from the run's first `run_started` to its `run_succeeded`, as the journal has them."""
    from journal.models import JournalEvent

    events = JournalEvent.objects.filter(run_id=run.id, kind__in=("run_started", "run_succeeded"))
    started = min(e.created_at for e in events if e.kind == "run_started")
    succeeded = max(e.created_at for e in events if e.kind == "run_succeeded")
    return (succeeded - started).total_seconds()


def _workers_used(run) -> int:
    """How many worker processes wrote the run's step events: a run's slices may move between workers."""
    from journal.models import JournalEvent

    writers = JournalEvent.objects.filter(run_id=run.id, kind="step_completed").values_list("writer", flat=True)
    # A worker's writer name is host:pid:nonce (runs.leases.worker_id); the nonce changes only after a fork.
    return len({":".join(w.split(":")[:2]) for w in writers.distinct()})


def fan_out(items: int, max_concurrency: int, workers: int, repeats: int, shape: str = "for_each") -> dict:
    """G: items per second for each of `repeats` runs of `items` no-op echo items (or steps, `shape="list"`)."""
    if shape not in ("for_each", "list"):
        raise ValueError(f"shape must be for_each or list, got {shape!r}")
    common.django_setup()
    from pal.celery import app
    from runs import services

    if shape == "for_each":
        _workflow("bench-g", _fan_out_steps(max_concurrency))
        _workflow("bench-g-warm", _fan_out_steps(max_concurrency))
        measured, warm = {"items": list(range(items))}, {"items": list(range(20))}
    else:
        _workflow("bench-g", _list_steps(items))
        _workflow("bench-g-warm", _list_steps(20))
        measured, warm = {}, {}
    figures, journal_walls, walks = [], [], []
    with common.celery_workers(app, "pal", workers, env=common.ours_env(), name=f"g-{shape.replace('_', '')}"):
        for _ in range(workers):
            _finished(services.run_create(workflow_name="bench-g-warm", input=warm)[0].id, 60)
        for _ in range(repeats):
            started = time.time()
            run, _ = services.run_create(workflow_name="bench-g", input=measured)
            run = _finished(run.id, RUN_LIMIT)
            figures.append(items / (run.finished_at.timestamp() - started))
            journal_walls.append(round(_journal_wall(run), 3))
            walks.append(_workers_used(run))
    print(f"G {shape}: items/s {[round(f) for f in figures]}; journal walls {journal_walls}; processes {walks}")
    return {"values": figures, "details": {"journal_seconds": journal_walls, "walking_processes": walks}}


def parallel_sleeps(steps: int, seconds: float, workers: int, repeats: int) -> dict:
    """H: for each of `repeats` runs of `steps` independent `sleep` steps, journal wall time / `seconds`."""
    common.django_setup()
    from pal.celery import app
    from runs import services

    def sleeps(name: str, how_long: float):
        return _workflow(
            name,
            [
                {"id": f"nap{i}", "kind": "tool_call", "tool": "sleep", "args": {"seconds": how_long}, "needs": []}
                for i in range(steps)
            ],
        )

    sleeps("bench-h", seconds)
    sleeps("bench-h-warm", 0.1)
    figures, walls = [], []
    with common.celery_workers(app, "pal", workers, env=common.ours_env(), name="h"):
        for _ in range(workers):
            _finished(services.run_create(workflow_name="bench-h-warm")[0].id, 60)
        for _ in range(repeats):
            run = _finished(services.run_create(workflow_name="bench-h")[0].id, RUN_LIMIT)
            wall = _journal_wall(run)
            walls.append(round(wall, 3))
            figures.append(wall / seconds)
    print(f"H: journal walls {walls} s for {steps} x sleep {seconds} s")
    return {"values": figures, "details": {"journal_seconds": walls}}
