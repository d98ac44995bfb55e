"""GET /runs/{id}/events/stream on a real uvicorn serving pal.asgi against the test database: replay from a
seq, live events of a run a real Celery worker walks, keep-alives, and the end of the stream with the run."""

import json
import os
import time

import httpx
import pytest

from journal.models import JournalEvent
from runs.models import Run
from tests.helpers import drive, drive_to_end, echo_step, make_run, make_workflow
from tests.support import workers as worker_support
from tests.support.web import uvicorn_server

from .conftest import make_user, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class LiveApi(str):
    """The base URL of the API (a str), with the pid of the uvicorn serving it."""

    pid: int


@pytest.fixture(scope="module")
def live_api(django_db_setup, django_db_blocker, tmp_path_factory):
    """uvicorn serving pal.asgi:application on the test database, for the whole module."""
    with django_db_blocker.unblock():
        database = worker_support.database_url()
    env = {"PAL_STREAM_KEEPALIVE": "1", "PAL_STREAM_POLL_INTERVAL": "0.2"}
    with uvicorn_server(database_url=database, env=env, log_dir=tmp_path_factory.mktemp("uvicorn")) as server:
        base = LiveApi(f"{server}/api/v1")
        base.pid = server.pid
        yield base


@pytest.fixture
def token(transactional_db):
    return token_for(make_user("otto", "runs.view_run", "runs.operate"))


def auth(token, **headers):
    return {"Authorization": f"Bearer {token}", **headers}


def read_stream(response, *, limit: float = 30.0):
    """Parse server-sent events until the server closes the stream. Returns (events, comments), each event a
    dict {id, event, data, at} (at: when it arrived)."""
    events, comments, current = [], [], {}
    deadline = time.monotonic() + limit
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise AssertionError(f"the stream did not end within {limit}s; got {[e['event'] for e in events]}")
        if line == "":
            if "data" in current:
                current["at"] = time.time()
                events.append(current)
            current = {}
        elif line.startswith(":"):
            comments.append(line)
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            current[field] = json.loads(value) if field == "data" else value
    return events, comments


def test_the_stream_replays_after_last_event_id_and_ends_with_the_run(live_api, token):
    run = make_run(steps=[echo_step("a"), echo_step("b")])
    drive_to_end(run)
    seqs = list(JournalEvent.objects.filter(run_id=run.id).order_by("seq").values_list("seq", "kind"))
    with httpx.stream(
        "GET", f"{live_api}/runs/{run.id}/events/stream", headers=auth(token, **{"Last-Event-ID": "2"}), timeout=10
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events, _ = read_stream(response)
    assert [(int(e["id"]), e["event"]) for e in events] == seqs[2:]
    assert events[-1]["event"] == "run_succeeded"
    last = events[-1]["data"]
    assert set(last) == {"seq", "kind", "step_id", "attempt", "payload", "created_at"}
    assert last["payload"]["output"] == {}


def test_after_seq_replays_too_and_a_reconnect_after_the_end_closes_at_once(live_api, token):
    run = make_run()
    drive_to_end(run)
    total = JournalEvent.objects.filter(run_id=run.id).count()
    url = f"{live_api}/runs/{run.id}/events/stream"
    with httpx.stream("GET", url, params={"after_seq": 1}, headers=auth(token), timeout=10) as response:
        events, _ = read_stream(response)
    assert [int(e["id"]) for e in events] == list(range(2, total + 1))
    with httpx.stream("GET", url, headers=auth(token, **{"Last-Event-ID": str(total)}), timeout=10) as response:
        events, _ = read_stream(response)
    assert events == []  # closed at once (204): the read's timeout bounds the wait


def test_the_stream_follows_a_run_a_worker_walks_live(live_api, token, celery_workers):
    make_workflow(
        name="napper",
        steps=[
            {"id": "nap", "kind": "tool_call", "tool": "sleep", "args": {"seconds": 4}},
            echo_step("after", done=True),
        ],
    )
    celery_workers()
    created = httpx.post(f"{live_api}/runs", json={"workflow": "napper"}, headers=auth(token), timeout=10)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    with httpx.stream("GET", f"{live_api}/runs/{run_id}/events/stream", headers=auth(token), timeout=30) as response:
        events, _ = read_stream(response, limit=60)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_created" and kinds[-1] == "run_succeeded"
    assert kinds.count("step_started") == 2 and kinds.count("step_completed") == 2
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    # Live: the nap's step_started reached us while the nap went on, before its step_completed was written (and
    # that one came after it was written, not as a replay at the end: the stream ended with the run).
    from django.utils.dateparse import parse_datetime

    started = next(e for e in events if e["event"] == "step_started")
    completed = next(e for e in events if e["event"] == "step_completed")
    completed_written = parse_datetime(completed["data"]["created_at"]).timestamp()
    assert started["at"] < completed_written, "step_started reached the stream only after the nap had ended"
    assert completed["at"] >= started["at"]
    written = Run.objects.get(id=run_id)
    assert written.status == "succeeded"


def test_an_idle_stream_sends_keep_alives_and_ends_when_the_run_is_cancelled(live_api, token):
    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(run)
    assert run.status == "waiting"
    url = f"{live_api}/runs/{run.id}/events/stream"
    with httpx.stream("GET", url, headers=auth(token), timeout=10) as response:
        lines = response.iter_lines()
        comments = []
        for line in lines:  # the replay, then keep-alives (PAL_STREAM_KEEPALIVE=1 here)
            if line.startswith(": keep-alive"):
                comments.append(line)
                if len(comments) == 2:
                    break
        cancelled = httpx.post(
            f"{live_api}/runs/{run.id}/cancel", json={"reason": "enough"}, headers=auth(token), timeout=10
        )
        assert cancelled.status_code == 202
        rest = [line for line in lines]  # ends: the server closes the stream after run_cancelled
    assert "event: run_cancelled" in rest


def test_the_stream_needs_a_token_and_a_known_run(live_api, token):
    run = make_run()
    response = httpx.get(f"{live_api}/runs/{run.id}/events/stream", timeout=10)
    assert response.status_code == 401 and response.json()["code"] == "not_authenticated"
    viewerless = token_for(make_user("nora"))
    response = httpx.get(f"{live_api}/runs/{run.id}/events/stream", headers=auth(viewerless), timeout=10)
    assert response.status_code == 403 and response.json()["code"] == "forbidden"
    response = httpx.get(f"{live_api}/runs/{Run().id}/events/stream", headers=auth(token), timeout=10)
    assert response.status_code == 404 and response.json()["code"] == "run_not_found"
    response = httpx.get(
        f"{live_api}/runs/{run.id}/events/stream", headers=auth(token, **{"Last-Event-ID": "x"}), timeout=10
    )
    assert response.status_code == 422 and response.json()["code"] == "invalid_last_event_id"


def test_a_chunked_body_over_the_limit_is_413_under_uvicorn(live_api, token):
    def chunks():
        for _ in range(3000):
            yield b"x" * 1024  # 3 MB, no Content-Length

    response = httpx.post(f"{live_api}/workflows", content=chunks(), headers=auth(token), timeout=30)
    assert response.status_code == 413 and response.json()["code"] == "body_too_large"


def test_open_streams_hold_no_thread_each(live_api, token):
    """Twenty streams held open on a waiting run: the server's threads stay a handful (the shared database
    threads), not one per stream; cancelling the run ends all twenty."""
    import asyncio

    run = make_run(steps=[{"id": "review", "kind": "approval", "prompt": "ok?"}])
    drive(run)

    def threads() -> int:
        return len(os.listdir(f"/proc/{live_api.pid}/task"))

    async def follow(client, opened):
        async with client.stream("GET", f"{live_api}/runs/{run.id}/events/stream", headers=auth(token)) as response:
            kinds = []
            async for line in response.aiter_lines():
                if line.startswith("event: "):
                    kinds.append(line.removeprefix("event: "))
                    if len(kinds) == 1:
                        opened.append(1)
            return kinds

    async def scenario():
        opened: list = []
        async with httpx.AsyncClient(timeout=30) as client:
            streams = [asyncio.create_task(follow(client, opened)) for _ in range(20)]
            for _ in range(100):
                if len(opened) == 20:
                    break
                await asyncio.sleep(0.1)
            held = threads()
            cancelled = await client.post(
                f"{live_api}/runs/{run.id}/cancel", json={"reason": "done"}, headers=auth(token)
            )
            assert cancelled.status_code == 202
            return held, await asyncio.wait_for(asyncio.gather(*streams), 20)

    before = threads()
    held, results = asyncio.run(scenario())
    assert held <= before + 8, f"{held} threads with 20 open streams (started with {before})"
    assert all(kinds[-1] == "run_cancelled" for kinds in results)
