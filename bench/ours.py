"""PAL Ops itself: the side the peers are compared against.

Each function runs in its own child process (`bench.child`) with a fresh Postgres database
`pal_bench_ours` and Redis db 14 (see `common.ours_env()`); worker start-up, migrations and a warm-up
run stay outside the timed part, as they do for the peers.
"""

from __future__ import annotations

import os
import signal
import time

from bench import common


def _setup(**env):
    os.environ.update({k: str(v) for k, v in env.items()})
    common.django_setup()


def _noop_workflow(name: str, steps: int):
    from runs import services

    return services.workflow_create(
        definition={
            "name": name,
            "steps": [{"id": f"s{i}", "kind": "tool_call", "tool": "echo", "args": {"i": i}} for i in range(steps)],
        }
    )


def _drive_inline(run) -> None:
    from runs.models import RunLock
    from runs.walk import run_drive

    booked = RunLock.objects.get(run_id=run.id).owner.removeprefix("task:")
    run_drive(run_id=run.id, task_id=booked)


def per_step_overhead(steps: int, repeats: int, commit_each: bool = False) -> list[float]:
    """A: one run of `steps` echo steps walked by the executor in this process (as DBOS runs its workflow
    in-process): journal writes, lease and fencing real, no broker (one task walks a run). Seconds per step for
    each repeat. echo is pure: its rows share commits; `commit_each` gives each step a commit of its own
    (PAL_PURE_BATCH_MS=0), the path of every step with an effect."""
    more = {"PAL_PURE_BATCH_MS": 0} if commit_each else {}
    _setup(PAL_SLICE_SECONDS=10_000, **more)  # one slice: the measurement is the walk, not the hand-offs
    from runs import services

    _noop_workflow("bench-a", steps)
    _noop_workflow("bench-warm", 20)
    for _ in range(3):
        _drive_inline(services.run_create(workflow_name="bench-warm")[0])
    figures = []
    for _ in range(repeats):
        run, _ = services.run_create(workflow_name="bench-a")
        started = time.perf_counter()
        _drive_inline(run)
        figures.append((time.perf_counter() - started) / steps)
        run.refresh_from_db()
        assert run.status == "succeeded", run.error
    return figures


def per_step_overhead_python(steps: int, repeats: int, pure: bool = False) -> list[float]:
    """A, Python: a @workflow calling a no-op @step `steps` times, walked as A's JSON run is (one slice, in this
    process): each call journaled like a JSON step, the function on its own thread; `pure`: a @step(pure=True),
    whose rows share commits. Seconds per step."""
    _setup(PAL_SLICE_SECONDS=10_000)
    from pal.workflows import step, workflow
    from runs import services

    @step(name="noop", pure=pure)
    def noop(i: int) -> dict:
        return {"i": i}

    @workflow(name="bench-a-py")
    def bench_a_py(ctx, input):
        for i in range(input["steps"]):
            noop(i)
        return {"steps": input["steps"]}

    for _ in range(3):
        _drive_inline(services.run_create(workflow_name="bench-a-py", input={"steps": 20})[0])
    figures = []
    for _ in range(repeats):
        run, _ = services.run_create(workflow_name="bench-a-py", input={"steps": steps})
        started = time.perf_counter()
        _drive_inline(run)
        figures.append((time.perf_counter() - started) / steps)
        run.refresh_from_db()
        assert run.status == "succeeded", run.error
    return figures


def _wait_finished(ids, timeout: float):
    from runs.models import FINAL_STATUSES, Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Run.objects.filter(id__in=ids).exclude(status__in=FINAL_STATUSES).exists():
            return
        time.sleep(0.05)
    raise RuntimeError(f"runs not finished after {timeout:.0f}s")


def throughput(runs: int, steps: int, workers: int) -> float:
    """B: `runs` runs of `steps` echo steps created through the service (as the API does) and walked by
    `workers` real Celery worker processes on Redis; steps per second from the first create to the last
    run's finished_at."""
    _setup()
    from django.db.models import Max

    from pal.celery import app
    from runs import services
    from runs.models import Run

    _noop_workflow("bench-b", steps)
    with common.celery_workers(app, "pal", workers, env=common.ours_env()):
        warm = [services.run_create(workflow_name="bench-b")[0].id for _ in range(workers * 2)]
        _wait_finished(warm, 60)
        started = time.time()
        ids = [services.run_create(workflow_name="bench-b")[0].id for _ in range(runs)]
        _wait_finished(ids, 240)
        last = Run.objects.filter(id__in=ids).aggregate(last=Max("finished_at"))["last"].timestamp()
        assert not Run.objects.filter(id__in=ids).exclude(status="succeeded").exists()
    return runs * steps / (last - started)


def crash_to_resume(repeats: int) -> list[float]:
    """C: seconds from the kill -9 of the worker holding a run (inside a 60-second tool step) and every early sweep
    planned so far to the run's resumed step_started on another worker, with beat sweeping every
    PAL_RECOVERY_INTERVAL and leases of PAL_LEASE_TTL. The aim: about a TTL (the beat plans the early sweep)."""
    _setup()
    from journal.models import JournalEvent
    from pal.celery import app
    from runs import services
    from runs.models import RunLock

    services.workflow_create(
        definition={
            "name": "bench-c",
            "steps": [
                {"id": "first", "kind": "tool_call", "tool": "echo", "args": {}},
                {"id": "long", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 60}},
            ],
        }
    )
    env = common.ours_env() | {k: os.environ[k] for k in ("PAL_RECOVERY_INTERVAL", "PAL_LEASE_TTL")}
    beat = common.spawn(
        [common.PYTHON, "-m", "celery", "-A", "pal", "beat", "-l", "WARNING", "-s", f"/tmp/bench-beat-{os.getpid()}"],
        name="beat",
        env=env,
    )
    figures = []
    try:
        for number in range(repeats):
            # A fresh pair each time: the victim starts alone, so the run and any early sweep planned as a countdown
            # message (the code before issue 23 section 6) are both held by it; the survivor starts just before the
            # kill and holds nothing.
            with common.celery_workers(app, "pal", 1, env=env, name=f"c{number}victim"):
                run, _ = services.run_create(workflow_name="bench-c")
                deadline = time.monotonic() + 60
                while not JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id="long").exists():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the long step never started")
                    time.sleep(0.05)
                time.sleep(float(os.environ["PAL_LEASE_TTL"]) / 2)  # a heartbeat and the sweeps that plan
                with common.celery_workers(app, "pal", 1, env=env, name=f"c{number}survivor"):
                    holder_pid = int(RunLock.objects.get(run_id=run.id).owner.split(":")[1])
                    killed = time.time()
                    os.kill(holder_pid, signal.SIGKILL)  # --pool solo: the worker process is the lease holder
                    resumed = None
                    while resumed is None:
                        if time.monotonic() > deadline + 60:
                            raise RuntimeError("the run was not resumed within 60 s")
                        resumed = JournalEvent.objects.filter(
                            run_id=run.id, kind="step_started", step_id="long", payload__resumed=True
                        ).first()
                        time.sleep(0.05)
                    figures.append(resumed.created_at.timestamp() - killed)
                    services.run_cancel(run_id=run.id, by="bench", reason="measured")
    finally:
        common.stop([beat])
    return figures


def sweep_time(finished: int, stuck: int, repeats: int) -> list[float]:
    """D: seconds one recovery sweep takes with `finished` finished runs and `stuck` running ones whose leases
    expired (it books, journals and re-enqueues each stuck run). Rows are made with INSERT ... SELECT from
    generate_series. The same sweep is first timed with no finished runs, to show it does not grow with them."""
    _setup()
    from django.db import connection

    from runs.models import RunLock
    from runs.recovery import sweep_once

    workflow = _noop_workflow("bench-d", 1)

    def make_stuck():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM run_locks")
            cursor.execute("DELETE FROM journal_events WHERE kind = 'run_redriven'")
            cursor.execute(
                "INSERT INTO run_locks (run_id, owner, epoch, expires_at, acquired_at) "
                "SELECT id, 'dead-worker:1:x', 1, now() - interval '1 hour', now() - interval '2 hours' "
                "FROM runs WHERE status = 'running'"
            )

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs (id, workflow_id, status, input, trigger_meta, depth, created_by, request_hash, "
            "journal_head_hash, created_at, updated_at, started_at) "
            "SELECT gen_random_uuid(), %s, 'running', '{}', '{}', 0, 'bench', '', '', now(), now(), now() "
            "FROM generate_series(1, %s)",
            [workflow.id, stuck],
        )
    figures_empty = []
    for _ in range(repeats):
        make_stuck()
        started = time.perf_counter()
        record = sweep_once(who="bench")
        figures_empty.append(time.perf_counter() - started)
        assert len(record.redriven) == stuck, len(record.redriven)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs (id, workflow_id, status, input, output, trigger_meta, depth, created_by, "
            "request_hash, journal_head_hash, created_at, updated_at, started_at, finished_at) "
            "SELECT gen_random_uuid(), %s, 'succeeded', '{}', '{}', '{}', 0, 'bench', '', '', "
            "now(), now(), now(), now() "
            "FROM generate_series(1, %s)",
            [workflow.id, finished],
        )
        cursor.execute("ANALYZE runs")
    figures = []
    for _ in range(repeats):
        make_stuck()
        started = time.perf_counter()
        record = sweep_once(who="bench")
        figures.append(time.perf_counter() - started)
        assert len(record.redriven) == stuck, len(record.redriven)
    assert RunLock.objects.count() == stuck
    # The harness reports the figures with finished runs; the empty-table figures go to the log for the ratio.
    print(f"sweep with 0 finished runs: {[round(f, 3) for f in figures_empty]}")
    print(f"sweep with {finished} finished runs: {[round(f, 3) for f in figures]}")
    return {"values": figures, "details": {"with_no_finished_runs": figures_empty}}


def _statements_of_one_sweep() -> int:
    """Statements (as Django sends them, BEGIN/SAVEPOINT included) of one sweep_once() with nothing stuck."""
    from django.db import connection

    from runs.recovery import sweep_once

    sent = 0

    def count(execute, sql, params, many, context):
        nonlocal sent
        sent += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        sweep_once(who="bench")
    return sent


def _database_transactions() -> int:
    """Commits and rollbacks of the bench's database so far, as the server counts them (pg_stat_database)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _worker_counts(folder) -> tuple[int, int]:
    """Statements and tasks so far, summed over the worker processes' files (bench.idle_app)."""
    statements = tasks = 0
    for path in folder.glob("[0-9]*"):
        sent, ran = path.read_text().split()
        statements, tasks = statements + int(sent), tasks + int(ran)
    return statements, tasks


def idle_fleet_queries(seconds: float, workers: int, settle: float) -> dict:
    """C, idle load: a beat and `workers` worker processes with no run at all, the look at lease expiry on
    (PAL_SWEEP_AT_LEASE_EXPIRY, the default) and then off. For each: the statements the workers sent to the
    database over `seconds` (counted in each worker process by bench.idle_app, after `settle` seconds for the
    workers to start), the tasks they ran (each makes one health-check `SELECT 1` more) and the sweeps made, scaled
    to a minute; and the statements of one idle sweep, counted in this process; with BENCH_C_BEFORE_REF, the same
    for a fleet of that commit's code. Values: transactions per minute with the look on."""
    import tempfile
    from pathlib import Path

    _setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import override_settings
    from django.utils import timezone

    from bench.idle_app import app
    from runs.models import Sweep

    env = common.ours_env() | {k: os.environ[k] for k in ("PAL_RECOVERY_INTERVAL", "PAL_LEASE_TTL")}
    # BENCH_C_BEFORE_REF=<commit>: a third fleet, beat and workers of that commit's code (look on), the "before".
    before = os.environ.get("BENCH_C_BEFORE_REF", "").strip()
    fleets: list[tuple[str, bool, Path | None]] = [("on", True, None), ("off", False, None)]
    if before:
        from bench.api_load import tree_at

        fleets.append((f"code at {before} (before)", True, tree_at(before)))
    statements = {}
    for look in (True, False):
        with override_settings(PAL_SWEEP_AT_LEASE_EXPIRY=look):
            _statements_of_one_sweep()  # warm: the first sweep creates what later ones find
            statements["on" if look else "off"] = _statements_of_one_sweep()
    Sweep.objects.all().delete()
    connection.close()
    figures = {}
    for name, look, tree in fleets:
        folder = Path(tempfile.mkdtemp(prefix="pal-bench-idle-"))
        look_env = env | {"PAL_SWEEP_AT_LEASE_EXPIRY": str(look).lower(), "BENCH_STATEMENTS_DIR": str(folder)}
        look_env |= {"PYTHONPATH": str(tree)} if tree else {}
        schedule = f"/tmp/bench-beat-i-{os.getpid()}-{len(figures)}"
        beat = common.spawn(
            [common.PYTHON, "-m", "celery", "-A", "pal", "beat", "-l", "WARNING", "-s", schedule],
            name="beat-idle",
            env=look_env,
            cwd=tree,
        )
        try:
            with common.celery_workers(app, "bench.idle_app", workers, env=look_env, name="idle-", cwd=tree):
                time.sleep(settle)
                (sent_before, ran_before), began = _worker_counts(folder), timezone.now()
                xacts_before = _database_transactions()
                time.sleep(seconds)
                xacts_after = _database_transactions()
                (sent_after, ran_after), ended = _worker_counts(folder), timezone.now()
                sweeps = Sweep.objects.filter(started_at__gte=began, started_at__lt=ended).count()
                connection.close()
        finally:
            common.stop([beat])
        per_minute = 60.0 / seconds
        figures[name] = {
            # The server's count, beat and workers together (each backend reports within ~10 s of its last
            # transaction, so over a steady minute the lag at both ends cancels out).
            "transactions_per_minute": round((xacts_after - xacts_before) * per_minute, 1),
            "statements_per_minute": round((sent_after - sent_before) * per_minute, 1),
            "tasks_per_minute": round((ran_after - ran_before) * per_minute, 1),
            "sweeps_per_minute": round(sweeps * per_minute, 1),
            "statements_per_sweep": statements.get(name, "–"),  # counted in this process: this code's only
        }
    print(f"idle fleet ({workers} workers and a beat, interval {settings.PAL_RECOVERY_INTERVAL} s): {figures}")
    return {"values": [figures["on"]["transactions_per_minute"]], "details": {"idle": figures}}
