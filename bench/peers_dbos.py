"""DBOS Transact on the same Postgres, in its own scratch database `pal_bench_dbos`.

A workflow here is a loop of `@DBOS.step()` no-op steps; DBOS checkpoints each step's output in
its system database (one committed write per step) before the next one starts, as a durable
engine must.

- A (`per_step_overhead`): one process launches DBOS and calls the workflow of `steps` steps
  directly (it runs in the calling thread); wall time / steps. A 10-step warm-up goes first.
- B (`throughput`), two ways:
  - `mode="queue"` (the one compared in the report): `workers` worker processes launch DBOS and
    listen on one DBOS queue (`worker_concurrency` = runs / workers, polled every 0.1 s, so each
    process takes its half and runs it on its threads); this process enqueues the `runs`
    workflows with `DBOSClient` and polls the system database for their completion. Elapsed =
    first enqueue .. the last workflow's `updated_at`.
  - `mode="direct"`: `workers` processes each start their share of the workflows with
    `DBOS.start_workflow` (threads) on a common "go" and wait for them; elapsed = go .. the last
    process done. No queue, so no polling delay: DBOS's best case.
  Worker start-up is outside the timing; each worker runs a warm-up workflow first.
- G (`throughput` with `steps=1`): the 1,000 no-op items of a fan-out as 1,000 one-step workflows; in
  queue mode with `global_concurrency` (the queue's fleet-wide limit, as `max_concurrency` is PAL Ops').

`python -m bench.peers_dbos worker --mode queue|direct ...` is the worker process; it speaks
line-based on stdin/stdout (`BENCH READY`, `GO runs steps`, `BENCH DONE end-time`, EOF = quit).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from dbos import DBOS

from bench import common

APP_NAME = "pal-bench"
APP_VERSION = "bench-1"  # fixed, so the client and every worker agree whatever the source hash
QUEUE = "bench"
QUEUE_POLL_SEC = 0.1
WAIT_LIMIT = 300.0


@DBOS.step()
def noop_step() -> None:
    return None


@DBOS.workflow()
def noop_workflow(steps: int) -> int:
    for _ in range(steps):
        noop_step()
    return steps


def _launch(executor_id: str = "bench-main") -> None:
    DBOS(
        config={
            "name": APP_NAME,
            "system_database_url": common.pg_url(common.DBOS_DB),
            "application_version": APP_VERSION,
            # One id per process, as DBOS asks of several processes sharing a system database.
            "executor_id": executor_id,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()


def per_step_overhead(steps: int, repeats: int) -> list[float]:
    """Seconds per step for each of `repeats` workflows of `steps` steps, in this process."""
    common.pg_recreate(common.DBOS_DB)
    results = []
    _launch()
    try:
        noop_workflow(10)  # warm-up: connection pool, prepared paths
        for _ in range(repeats):
            started = time.perf_counter()
            noop_workflow(steps)
            results.append((time.perf_counter() - started) / steps)
    finally:
        DBOS.destroy()
        common.pg_drop(common.DBOS_DB)
    return results


# --- B --------------------------------------------------------------------------------------------


def _read_line(proc, prefix: str, deadline: float) -> str:
    while True:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {prefix!r} from a DBOS worker in time; see {common.log_dir()}")
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"DBOS worker exited ({proc.poll()}); see {common.log_dir()}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


def _start_workers(workers: int, mode: str, concurrency: int, global_concurrency: int | None = None) -> list:
    procs = []
    for i in range(workers):
        cmd = [
            common.PYTHON,
            "-m",
            "bench.peers_dbos",
            "worker",
            "--mode",
            mode,
            "--concurrency",
            str(concurrency),
            "--executor-id",
            f"bench-{mode}-{i + 1}",
        ]
        if global_concurrency is not None:
            cmd += ["--global-concurrency", str(global_concurrency)]
        procs.append(common.spawn(cmd, name=f"dbos-{mode}-{i + 1}", pipe_stdio=True))
    deadline = time.monotonic() + common.READY_TIMEOUT
    for proc in procs:
        _read_line(proc, "BENCH READY", deadline)
    return procs


def _queue_batch(client, runs: int, steps: int) -> float:
    import psycopg

    started = time.time()
    ids = []
    for _ in range(runs):
        handle = client.enqueue(
            {"queue_name": QUEUE, "workflow_name": "noop_workflow", "app_version": APP_VERSION}, steps
        )
        ids.append(handle.get_workflow_id())
    deadline = time.monotonic() + WAIT_LIMIT
    with psycopg.connect(common.pg_url(common.DBOS_DB), autocommit=True) as conn:
        while True:
            done, errors, last = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status <> 'SUCCESS'), max(updated_at)"
                " FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)"
                " AND status IN ('SUCCESS', 'ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED')",
                (ids,),
            ).fetchone()
            if errors:
                raise RuntimeError(f"{errors} DBOS workflows did not succeed")
            if done == runs:
                split = conn.execute(
                    "SELECT executor_id, count(*) FROM dbos.workflow_status WHERE workflow_uuid = ANY(%s)"
                    " GROUP BY 1 ORDER BY 1",
                    (ids,),
                ).fetchall()
                print(f"dbos queue batch: workflows per executor {dict(split)}", file=sys.stderr, flush=True)
                return last / 1000.0 - started
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done}/{runs} DBOS workflows finished within {WAIT_LIMIT:.0f}s")
            time.sleep(0.02)


def _direct_batch(procs: list, runs: int, steps: int) -> float:
    shares = [runs // len(procs) + (1 if i < runs % len(procs) else 0) for i in range(len(procs))]
    started = time.time()
    for proc, share in zip(procs, shares, strict=True):
        proc.stdin.write(f"GO {share} {steps}\n")
        proc.stdin.flush()
    deadline = time.monotonic() + WAIT_LIMIT
    ends = [float(_read_line(proc, "BENCH DONE", deadline)) for proc in procs]
    return max(ends) - started


def throughput(
    runs: int, steps: int, workers: int, repeats: int = 1, mode: str = "queue", global_concurrency: int | None = None
) -> list[float]:
    """Steps per second for each of `repeats` batches of `runs` workflows of `steps` steps; with
    `global_concurrency` (queue mode), at most that many run at once over all the workers."""
    if mode not in ("queue", "direct"):
        raise ValueError(f"mode must be queue or direct, got {mode!r}")
    common.pg_recreate(common.DBOS_DB)
    # One launch creates the schema, so the workers do not race to migrate it.
    _launch()
    DBOS.destroy()
    procs, client, results = [], None, []
    try:
        procs = _start_workers(workers, mode, math.ceil(runs / workers), global_concurrency)
        if mode == "queue":
            from dbos import DBOSClient

            client = DBOSClient(system_database_url=common.pg_url(common.DBOS_DB), application_name=APP_NAME)
            _queue_batch(client, workers * 2, 2)  # warm-up
            for _ in range(repeats):
                results.append(runs * steps / _queue_batch(client, runs, steps))
        else:
            _direct_batch(procs, workers * 2, 2)
            for _ in range(repeats):
                results.append(runs * steps / _direct_batch(procs, runs, steps))
    finally:
        if client is not None:
            client.destroy()
        for proc in procs:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()  # EOF: the worker destroys DBOS and exits
        common.stop(procs, grace=15)
        common.pg_drop(common.DBOS_DB)
    return results


def _worker(mode: str, concurrency: int, executor_id: str, global_concurrency: int | None = None) -> None:
    _launch(executor_id)
    try:
        if mode == "queue":
            # DBOS refuses a worker limit above the global one.
            if global_concurrency is not None:
                concurrency = min(concurrency, global_concurrency)
            DBOS.register_queue(
                QUEUE,
                worker_concurrency=concurrency,
                global_concurrency=global_concurrency,
                polling_interval_sec=QUEUE_POLL_SEC,
                on_conflict="always_update",
            )
        print("BENCH READY", flush=True)
        for line in sys.stdin:
            if mode == "direct" and line.startswith("GO "):
                runs, steps = (int(x) for x in line.split()[1:3])
                handles = [DBOS.start_workflow(noop_workflow, steps) for _ in range(runs)]
                for handle in handles:
                    handle.get_result()
                print(f"BENCH DONE {time.time():.6f}", flush=True)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.peers_dbos")
    parser.add_argument("role", choices=["worker"])
    parser.add_argument("--mode", choices=["queue", "direct"], required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--executor-id", default="bench-worker")
    parser.add_argument("--global-concurrency", type=int, default=None)
    args = parser.parse_args()
    _worker(args.mode, args.concurrency, args.executor_id, args.global_concurrency)
