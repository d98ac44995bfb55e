"""Bare Celery on the Redis broker: the floor any Celery-based engine stands on.

Nothing is durable here: no database, no journal, no lease. The ratio against it is what
durability costs over a bare broker hop; it is not a competitor.

- A (`per_step_overhead`): one worker process (`--pool solo`), a chain of `steps` no-op tasks, each
  sending the next (`mode="chain"`); or `steps` sequential round trips, the caller sending one
  task and waiting for its result through the Redis result backend before sending the next
  (`mode="roundtrip"`). Wall time from the first send to the last step done, divided by `steps`.
- B (`throughput`): `workers` solo worker processes; `runs` chains of `steps` no-op tasks all
  sent at once; steps / (first send .. last chain done).
- G (`group_fan_out`): `workers` solo worker processes; one `celery.group` of `items` no-op tasks;
  tasks / (send .. last task done).

Worker start-up is outside every timing; a warm-up run precedes the measured ones.
"""

from __future__ import annotations

import os
import time
import uuid

from bench import common

os.environ["BENCH_CELERY_URL"] = common.redis_url(common.CELERY_REDIS_DB)

from bench import celery_app

APP_PATH = "bench.celery_app"
WAIT_LIMIT = 300.0  # seconds any one measured batch may take before we call it stuck


def _env() -> dict:
    return {"BENCH_CELERY_URL": celery_app.BROKER_URL}


def _chains(runs: int, steps: int) -> float:
    """Send `runs` chains of `steps` hops, wait until all are done; seconds from first send to last done."""
    r = celery_app._done_list()
    done_key = f"bench:done:{uuid.uuid4().hex}"
    started = time.perf_counter()
    for k in range(runs):
        celery_app.hop.apply_async((f"r{k}", 0, steps, done_key))
    finished = 0
    deadline = time.monotonic() + WAIT_LIMIT
    while finished < runs:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"only {finished}/{runs} chains finished within {WAIT_LIMIT:.0f}s")
        if r.blpop([done_key], timeout=max(1, min(5, int(left)))):
            finished += 1
    elapsed = time.perf_counter() - started
    r.delete(done_key)
    return elapsed


def _round_trips(steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        celery_app.noop.delay().get(timeout=30)
    return time.perf_counter() - started


def per_step_overhead(steps: int, repeats: int, mode: str = "chain") -> list[float]:
    """Seconds per step for each of `repeats` runs of `steps` steps, with one worker process."""
    if mode not in ("chain", "roundtrip"):
        raise ValueError(f"mode must be chain or roundtrip, got {mode!r}")
    common.redis_flush(common.CELERY_REDIS_DB)
    results = []
    try:
        with common.celery_workers(celery_app.app, APP_PATH, 1, env=_env(), name="celery-a"):
            if mode == "chain":
                _chains(1, min(steps, 100))  # warm-up: imports, connections
                for _ in range(repeats):
                    results.append(_chains(1, steps) / steps)
            else:
                _round_trips(min(steps, 100))
                for _ in range(repeats):
                    results.append(_round_trips(steps) / steps)
    finally:
        common.redis_flush(common.CELERY_REDIS_DB)
    return results


def throughput(runs: int, steps: int, workers: int, repeats: int = 1) -> list[float]:
    """Steps per second for each of `repeats` batches of `runs` chains of `steps` over `workers` processes."""
    common.redis_flush(common.CELERY_REDIS_DB)
    results = []
    try:
        with common.celery_workers(celery_app.app, APP_PATH, workers, env=_env(), name="celery-b"):
            _chains(workers * 2, min(steps, 10))  # warm-up every worker
            for _ in range(repeats):
                results.append(runs * steps / _chains(runs, steps))
    finally:
        common.redis_flush(common.CELERY_REDIS_DB)
    return results


def _group(items: int) -> tuple[float, float]:
    """Send one `celery.group` of `items` no-op tasks, wait until every one is done; seconds from the send to the
    last done, and seconds the send itself took (one publish per task, from this one process)."""
    from celery import group

    r = celery_app._done_list()
    done_key = f"bench:done:{uuid.uuid4().hex}"
    started = time.perf_counter()
    # hop with n=1 is one no-op task that reports on a Redis list, as the chains' last link does.
    group(celery_app.hop.s(f"i{k}", 0, 1, done_key) for k in range(items)).apply_async()
    sent = time.perf_counter() - started
    finished = 0
    deadline = time.monotonic() + WAIT_LIMIT
    while finished < items:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"only {finished}/{items} group tasks finished within {WAIT_LIMIT:.0f}s")
        if r.blpop([done_key], timeout=max(1, min(5, int(left)))):
            finished += 1
    elapsed = time.perf_counter() - started
    r.delete(done_key)
    return elapsed, sent


def group_fan_out(items: int, workers: int, repeats: int = 1) -> dict:
    """G: tasks per second for each of `repeats` groups of `items` no-op tasks over `workers` processes."""
    common.redis_flush(common.CELERY_REDIS_DB)
    results, sends = [], []
    try:
        with common.celery_workers(celery_app.app, APP_PATH, workers, env=_env(), name="celery-g"):
            _group(workers * 10)  # warm-up every worker
            for _ in range(repeats):
                elapsed, sent = _group(items)
                results.append(items / elapsed)
                sends.append(round(sent, 3))
    finally:
        common.redis_flush(common.CELERY_REDIS_DB)
    print(f"celery group: tasks/s {[round(x) for x in results]}; seconds spent sending {sends}")
    return {"values": results, "details": {"send_seconds": sends}}
