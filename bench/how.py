"""How each row of docs/PERFORMANCE.md was measured ((scenario, side, variant) -> the text under its table), and the
small helpers every section of the report writes its figures with."""

import math

NOT_YET = "not measured yet"

HOW = {
    ("A", "ours", "run_drive"): "one run of 1,000 no-op steps driven by `runs.walk.run_drive` in one process; "
    "wall time / steps (bench/ours.py)",
    ("A", "ours", "run_drive, a commit per step"): "as run_drive, with PAL_PURE_BATCH_MS=0: each echo step commits "
    "its own rows, the path of every step with an effect outside the database",
    ("A", "ours", "celery worker, 10,000 steps, a commit per step"): "as the row of 10,000 steps through the worker, "
    "with PAL_PURE_BATCH_MS=0 in the worker: each step commits its own rows, so the run outlasts its first slice "
    "and its hand-offs are measured",
    ("A", "ours", "celery worker, a commit per step"): "as the worker row of 1,000 steps, with PAL_PURE_BATCH_MS=0 in "
    "the worker: each step commits its own rows, the path of every step with an effect",
    ("A", "ours", "python workflow"): "a `@workflow` calling a no-op `@step` 1,000 times, walked like the JSON run "
    "above (one slice, one process); wall time / steps; its ratio is the JSON run's figure over this one",
    ("A", "ours", "python workflow, pure steps"): "as the row above, the no-op being a `@step(pure=True)`: its rows "
    "share commits (PAL_PURE_BATCH_STEPS, PAL_PURE_BATCH_MS), as echo's do in the JSON run",
    ("A", "ours", "celery worker"): "the same workflow of 1,000 no-op steps created through the service (as the API "
    "does) and walked by ONE `celery -A pal worker --pool solo` with the default settings (PAL_SLICE_SECONDS unset: "
    "2-second slices, each ended by a hand-off to a new task, which takes the lease and replays the journal so far); "
    "the journal's `run_created` to `run_succeeded` (created_at, stamped by the process that wrote the row, the bench "
    "and the worker on one machine) / steps; the first pick-up and the hand-offs are in that time (bench/real_path.py)",
    ("A", "ours", "celery worker, 10,000 steps"): "as the row above, with 10,000 no-op steps (the most a workflow may "
    "have); the hand-offs are found in the journal (each gives the run a new lease epoch: a slice's first row is the "
    "first of a new epoch) and each one's cost is the gap from the row before it; what a hand-off reads is then timed "
    "in the bench process with the worker stopped (bench/real_path.py)",
    ("A", "dbos", "workflow"): "one `@DBOS.workflow` calling a no-op `@DBOS.step` 1,000 times, called directly in "
    "one process; wall time / steps",
    ("A", "celery", "chain"): "1 worker process (`--pool solo`); a chain of 1,000 no-op tasks, each sending the "
    "next; first send to last done / steps",
    ("A", "celery", "roundtrip"): "1 worker process (`--pool solo`); 1,000 sequential `noop.delay().get()` round "
    "trips (Redis result backend); wall time / steps",
    ("B", "ours", "celery workers"): "200 runs of 10 no-op steps over 2 `celery -A pal worker --pool solo` "
    "processes; first create to last finish (bench/ours.py)",
    ("B", "dbos", "queue"): "2 worker processes listening on one DBOS queue (worker_concurrency 100, polled every "
    "0.1 s); 200 workflows of 10 steps enqueued with `DBOSClient`; first enqueue to last "
    "`updated_at`",
    ("B", "dbos", "direct"): "2 processes, each `DBOS.start_workflow` of 100 workflows of 10 steps on a common go "
    "(threads, no queue); go to last process done",
    ("B", "celery", "chains"): "2 worker processes (`--pool solo`); 200 chains of 10 no-op tasks sent at once; first "
    "send to last chain done",
    ("C", "ours", "kill -9"): "two `celery -A pal worker --pool solo` processes and `celery -A pal beat`; a run inside "
    "a 60-second tool step; kill -9 of the worker holding its lease; from the kill to the run's resumed "
    "`step_started` (same attempt, same key) journaled by the other worker. The bound is interval + TTL = 10 s",
    ("C", "ours", "idle fleet"): "PAL_RECOVERY_INTERVAL 2 s. "
    "The transactions are the server's (pg_stat_database's commits and rollbacks of the database, beat and workers "
    "together, over the window). "
    "`celery -A pal beat` and 2 `celery -A pal worker --pool solo` processes (as "
    "`bench.idle_app`: pal's own app, each process counting the statements it sends through Django's cursors) with "
    "no run at all, first with the look at lease expiry on (`PAL_SWEEP_AT_LEASE_EXPIRY`, the default), then with it "
    "off; over a 60-second window after 10 s of start-up, the statements of both workers together, the tasks they "
    "ran (the beat's sweeps and schedule ticks; each task's first use of its connection adds one health-check "
    "`SELECT 1`, not in the count) and the sweeps made, each scaled to a minute; the statements of one idle sweep "
    'are counted in the bench process (bench/ours.py). "code at REF (before)": the same fleet, look on, of the '
    "code of that commit (BENCH_C_BEFORE_REF; a full run takes dc9cca4^, before an idle sweep became one "
    "transaction), its beat and workers run from a `git archive` of it on the same database",
    ("D", "ours", "sweep"): "`sweep_once()` with the stuck runs' leases expired, timed while it books, journals and "
    "re-enqueues each of them; the finished runs are made with INSERT ... SELECT generate_series. The same sweep "
    "with no finished runs at all is in the next line, to show that finished runs add nothing",
    ("E", "ours", "wrk"): "`wrk` (a second process, 2 threads, 16 connections, closed loop) against `uvicorn "
    "pal.asgi:application --workers 1` on Postgres, once per server path: pal.web's sync path (a sync view handled "
    "whole on one of PAL_WEB_THREADS threads) and Django's own ASGI handler (`PAL_WEB_SYNC_PATH=0`: a new thread and "
    "a hop per sync middleware per request, how every request was served before), and with BENCH_E_BEFORE_REF "
    "the code of that commit (`git archive`, same database, same bench). POST /api/v1/runs with a new run "
    "each time (its Celery message really sent to Redis; no worker, the runs stay queued), GET /api/v1/runs/{id} "
    "round-robin over 200 runs, POST /api/v1/runs/batch of 100 runs; a 2-second warm-up of each first, not counted. "
    "Latency is wrk's, from sending a request to its whole answer; uvicorn's CPU is utime + stime from /proc over "
    "the pass. The view's own time is the same call through Django's test client in the bench process, one at a "
    "time, before the servers start; the overhead is uvicorn's CPU per answer over that CPU, minus 1 "
    "(bench/api_load.py)",
    ("F", "ours", "httpx streams"): "500 runs parked on an approval (walked in the bench process), one "
    "`GET /api/v1/runs/{id}/events/stream` each, held open by one httpx AsyncClient "
    "in the bench process against `uvicorn --workers 1`; RSS and threads from "
    "/proc/PID/status, CPU from /proc/PID/stat over the idle window; events counted "
    "against each run's journal; then the runs are cancelled through the service "
    "(bench/api_load.py)",
    ("G", "ours", "for_each"): "one run whose one `tool_call` step (tool `echo`) has `for_each` over 1,000 items and "
    "`max_concurrency` 50, on 2 `celery -A pal worker --pool solo` processes (the first items go to the walk's "
    "threads and to the fleet; once the step's items are seen to take less than a thread hand-off, the rest run on "
    "the walk's own thread, their outcomes journaled with the next starts: docs/GRAPHS.md); from just before "
    "`run_create` to the run's `finished_at` (bench/graphs.py)",
    ("G", "ours", "plain list"): "one run of the same 1,000 echo steps as a plain list (each needs the one before), "
    "on the same 2 workers; from just before `run_create` to `finished_at`",
    ("G", "dbos", "queue"): "1,000 one-step workflows enqueued with `DBOSClient` on one DBOS queue with "
    "`global_concurrency` 50 (the fleet-wide limit, as `max_concurrency`), 2 worker processes polling it every "
    "0.1 s; first enqueue to last `updated_at`",
    ("G", "dbos", "direct"): "2 processes, each `DBOS.start_workflow` of 500 one-step workflows on a common go "
    "(threads, no queue, no limit: DBOS's best case); go to last process done",
    ("G", "celery", "group"): "2 worker processes (`--pool solo`); one `celery.group` of 1,000 no-op tasks, each "
    "pushing to a Redis list when done; send to last done",
    ("H", "ours", "needs []"): "one run of 8 `tool_call` steps (tool `sleep`, 1 s) with `needs: []`, on 2 "
    "`celery -A pal worker --pool solo` processes; the journal's `run_started` to `run_succeeded` ÷ 1 s "
    "(bench/graphs.py)",
}


def _fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _not_ok(r: dict) -> str:
    if r["status"] == "not_implemented":
        return NOT_YET
    if r["status"] == "skipped":
        return f"skipped: {r['message']}"
    return f"error: {r['message'][:300]} (log {r.get('log')})"


def _how(r: dict) -> list[str]:
    return ["How it was measured: " + HOW.get((r["scenario"], r["side"], r["variant"]), "") + ".", ""]
