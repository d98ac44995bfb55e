"""Fixtures for the whole suite: local peers, real Celery workers, and the integration gate.

Integration tests (``@pytest.mark.integration``) run real worker processes against Postgres and Redis.
Without them such a test FAILS with a message saying what is missing; it never skips, because a skipped
durability test proves nothing. ``make test`` starts both (throwaway servers) and exports DATABASE_URL and
CELERY_BROKER_URL.
"""

from __future__ import annotations

import os

import pytest

from tests.support import workers as worker_support
from tests.support.peers import LLMProvider, SMTPSink, WebhookReceiver

WEBHOOK_SECRET = "test-webhook-secret"


# --- what the suite runs on ------------------------------------------------------------------------


def _database_engine() -> str:
    from django.conf import settings

    return settings.DATABASES["default"]["ENGINE"]


def _redis_problem(url: str) -> str | None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2).ping()
    except Exception as exc:
        return f"Redis at {url} does not answer ({exc.__class__.__name__}: {exc})"
    return None


def _integration_problem(config) -> str | None:
    """Why integration tests cannot run here, or None. Checked once per session."""
    key = "_pal_integration_problem"
    if not hasattr(config, key):
        setattr(config, key, _find_integration_problem())
    return getattr(config, key)


def _find_integration_problem() -> str | None:
    try:
        engine = _database_engine()
    except Exception as exc:
        return f"Django settings are not loaded ({exc})"
    if "postgresql" not in engine:
        return (
            f"the database is {engine}, not Postgres. Set DATABASE_URL=postgres://pal:pal@127.0.0.1:5432/pal "
            "(make test starts a throwaway one and sets it)"
        )
    broker = worker_support.broker_url()
    if not broker.startswith(("redis://", "rediss://")):
        return (
            f"the Celery broker is {broker!r}, not Redis. Set CELERY_BROKER_URL=redis://127.0.0.1:6379/0 "
            "(make test starts a throwaway one and sets it)"
        )
    return _redis_problem(broker)


def pytest_report_header(config):
    try:
        from django.conf import settings

        db = settings.DATABASES["default"]
        broker = worker_support.broker_url()
    except Exception:
        return None
    where = f"{db.get('HOST') or ''}:{db.get('PORT') or ''}" if db.get("HOST") else ""
    return [f"pal: database {db['ENGINE'].rsplit('.', 1)[-1]} {where} {db['NAME']}; broker {broker.split('@')[-1]}"]


def pytest_sessionstart(session):
    # DATABASE_URL=postgres://... must mean the suite runs on Postgres, never silently on something else.
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith("postgres"):
        try:
            engine = _database_engine()
        except Exception:
            return
        if "postgresql" not in engine:
            raise pytest.UsageError(f"DATABASE_URL is {url.split('@')[-1]!r} but Django's database is {engine}")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """One Postgres test database per checkout (test_pal_<hash of the repo path>), so two checkouts
    testing against the same server at once (a developer's tree and a clone) do not drop each other's."""
    import hashlib

    from django.conf import settings

    # PAL_TEST_DB_SUFFIX separates concurrent sessions in one checkout (several people testing at once).
    suffix = (
        os.environ.get("PAL_TEST_DB_SUFFIX") or hashlib.sha1(str(worker_support.REPO_ROOT).encode()).hexdigest()[:8]
    )
    for db in settings.DATABASES.values():
        if "postgresql" in db["ENGINE"]:
            test = db.setdefault("TEST", {})
            test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{suffix}"


@pytest.fixture(scope="session", autouse=True)
def _no_session_outlives_the_tests(django_db_setup, django_db_blocker):
    """Before the test database is dropped, end every other session on it: a thread's kept connection (the
    event stream's shared database threads keep theirs for good, by design) would make the drop fail."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("integration") is None:
        return
    problem = _integration_problem(item.config)
    if problem:
        pytest.fail(
            f"integration test needs Postgres and Redis (it runs real worker processes): {problem}",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _integration_broker(request):
    """Every integration test starts with an empty broker: no task left over from another test."""
    if request.node.get_closest_marker("integration") is not None:
        request.getfixturevalue("redis_broker")


@pytest.fixture(autouse=True)
def _no_workflow_known_from_another_test():
    """run_create's known workflows (runs.services.workflows._Known) start empty in every test, as in a new process: one
    known from an earlier test's rolled-back rows would be checked, found gone and read again, which is right but
    would make a statement count depend on the order of the tests."""
    from runs.services import workflows as services

    services._known.workflows.clear()


# --- peers -----------------------------------------------------------------------------------------


@pytest.fixture
def llm_provider():
    """An OpenAI-compatible provider on 127.0.0.1 that bills each Idempotency-Key once."""
    with LLMProvider() as provider:
        yield provider


@pytest.fixture
def webhook_receiver():
    """A webhook receiver on 127.0.0.1 checking X-PAL-Signature against WEBHOOK_SECRET."""
    with WebhookReceiver(secret=WEBHOOK_SECRET) as receiver:
        yield receiver


@pytest.fixture
def smtp_sink():
    """An SMTP server on 127.0.0.1 that keeps every message."""
    with SMTPSink() as sink:
        yield sink


# --- broker and workers ----------------------------------------------------------------------------


@pytest.fixture
def redis_broker():
    """The Redis broker database, flushed before (and after) the test. Yields a ``redis.Redis`` client."""
    import redis

    url = worker_support.broker_url()
    if not url.startswith(("redis://", "rediss://")):
        pytest.fail(f"this test needs a Redis broker; CELERY_BROKER_URL is {url!r}", pytrace=False)
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
    client.flushdb()
    yield client
    try:
        client.flushdb()
    finally:
        client.close()


@pytest.fixture
def worker_env(transactional_db, redis_broker):
    """The environment worker processes need to share this test's database and broker.

    Requesting it makes the test transactional (workers only see committed rows)."""
    return {
        "DATABASE_URL": worker_support.database_url(),
        "CELERY_BROKER_URL": worker_support.broker_url(),
        "DJANGO_SECRET_KEY": os.environ.get("DJANGO_SECRET_KEY") or "test-only-insecure-key",
        "DJANGO_SETTINGS_MODULE": "pal.settings",
        "PAL_LEASE_TTL": "2",
        "PAL_RECOVERY_INTERVAL": "1",
    }


@pytest.fixture
def celery_workers(worker_env, tmp_path):
    """Factory: ``celery_workers(env_overrides=None, concurrency=1, name=None, **kw) -> Worker``.

    Workers start from ``worker_env`` plus the overrides, are ready when returned, log to
    ``tmp_path/workers/NAME.log``, and are SIGKILLed (whole process group) at teardown whatever happened.
    """
    started: list[worker_support.Worker] = []

    def start(env_overrides=None, *, concurrency=1, name=None, **kwargs):
        kwargs.setdefault("log_dir", tmp_path / "workers")
        worker = worker_support.start_worker(
            env_overrides, concurrency=concurrency, name=name, base_env=worker_env, wait=False, **kwargs
        )
        started.append(worker)
        worker.wait_ready(kwargs.get("ready_timeout", 60.0))
        return worker

    yield start

    errors = []
    for worker in started:
        try:
            worker.kill()
        except Exception as exc:
            errors.append(exc)
        # Captured, so pytest shows it only when the test fails.
        print(f"----- log of {worker.name} ({worker.log_path}) -----\n{worker.log_tail(200)}")
    if errors:
        raise errors[0]


@pytest.fixture(autouse=True)
def _heartbeat_sees_the_test_transaction(request, monkeypatch):
    """In a test wrapped in one transaction, the heartbeat thread's own connection cannot see the leases the
    test holds (uncommitted) and would report them lost at its first beat. There, the beat answers from what
    this process holds; transactional tests and real workers keep the real heartbeat."""
    marker = request.node.get_closest_marker("django_db")
    transactional = bool(marker and (marker.kwargs.get("transaction") or (marker.args and marker.args[0])))
    if marker is None or transactional or "worker_env" in request.fixturenames:
        return
    from runs import leases

    monkeypatch.setattr(leases.heartbeat, "beat", lambda owner=None: [str(r) for r in list(leases.heartbeat._held)])


# --- seconds per test file, for make test's shards (tests/support/shards.py) -------------------------------------

_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    """With PAL_TEST_DURATIONS=FILE, merge this session's seconds per test file into FILE (a JSON object)."""
    out = os.environ.get("PAL_TEST_DURATIONS")
    if not out or not _file_seconds:
        return
    import fcntl
    import json

    with open(out, "a+") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # shards end at different times, each merging its own files
        file.seek(0)
        known = json.loads(file.read() or "{}")
        known.update({path: round(seconds, 1) for path, seconds in _file_seconds.items()})
        file.seek(0)
        file.truncate()
        file.write(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
