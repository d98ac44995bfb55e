"""The bare-Celery peer's own tiny app (not pal's): no database, no journal, nothing durable.

Run by `celery -A bench.celery_app worker` subprocesses that bench.peers_celery starts. Its
settings copy pal's Celery settings that bear on speed (acks_late, prefetch 1, JSON, results
ignored unless asked for), so the difference measured is the engine, not the Celery tuning.
"""

import os

import redis
from celery import Celery

BROKER_URL = os.environ.get("BENCH_CELERY_URL", "redis://127.0.0.1:6379/15")

app = Celery("bench_celery", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_default_queue="bench",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    result_expires=600,
)

_redis = None


def _done_list():
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(BROKER_URL)
    return _redis


@app.task(name="bench.noop", ignore_result=False)
def noop():
    """One no-op step whose result the caller waits for: a full round trip through Redis."""
    return None


@app.task(name="bench.hop")
def hop(run: str, i: int, n: int, done_key: str):
    """Step `i` of a chain of `n` no-op steps: does nothing, then sends step i+1.

    This is what `celery.chain` does between links, without carrying the remaining signatures in
    every message (a 1,000-link canvas chain ships ~1,000 signatures in its first message and
    would measure JSON parsing rather than dispatch). The last step reports on a Redis list.
    """
    if i + 1 < n:
        hop.apply_async((run, i + 1, n, done_key))
    else:
        _done_list().rpush(done_key, run)
