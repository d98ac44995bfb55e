"""pal.web, the ASGI entry: a sync view is handled whole on the pool's threads and answers exactly as through
Django's own ASGI handler; the event streams (async views) still go to Django's handler.

The app is driven in this process through httpx's ASGI transport, on committed rows (its threads have their own
database connections and do not see a test's open transaction)."""

import asyncio
import json

import httpx
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.test import override_settings

from pal.web import Application
from runs import services
from tests.api.conftest import make_user, token_for

pytestmark = pytest.mark.django_db(transaction=True)

FLOW = {"name": "web-flow", "steps": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}]}


@pytest.fixture
def app():
    # Django's handler runs each request on a new thread: its connection must close at the request's end, as under
    # pal/asgi.py (CONN_MAX_AGE 0), not be left open on a thread that is gone.
    database = connections["default"].settings_dict
    kept, database["CONN_MAX_AGE"] = database["CONN_MAX_AGE"], 0
    with override_settings(PAL_WEB_THREADS=1):
        application = Application(ASGIHandler())
    yield application
    application.threads.submit(connections.close_all).result()
    application.threads.shutdown()
    database["CONN_MAX_AGE"] = kept


@pytest.fixture
def token():
    return token_for(make_user("wendy", superuser=True))


def call(app, method: str, path: str, *, sync_path: bool, **kwargs) -> httpx.Response:
    """One request through the app, on its sync path or (sync_path False) through Django's own handler."""

    async def go():
        app.sync_path = sync_path
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def both(app, method: str, path: str, **kwargs) -> tuple[httpx.Response, httpx.Response]:
    return call(app, method, path, sync_path=True, **kwargs), call(app, method, path, sync_path=False, **kwargs)


def test_a_run_read_through_the_sync_path_answers_exactly_as_through_djangos_handler(app, token):
    services.workflow_create(definition=FLOW)
    run, _ = services.run_create(workflow_name="web-flow")
    fast, stock = both(app, "GET", f"/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {token}"})
    assert fast.status_code == stock.status_code == 200
    assert fast.json() == stock.json()
    assert fast.json()["status"] == "queued" and fast.json()["why"].startswith("queued for task")
    assert fast.headers.multi_items() == stock.headers.multi_items()


def test_the_api_errors_are_the_same_json_on_the_sync_path(app, token):
    auth = {"Authorization": f"Bearer {token}"}
    for method, path, kwargs in [
        ("GET", "/api/v1/no-such-call", {"headers": auth}),  # Django's own 404, made JSON by the middleware
        ("GET", "/api/v1/runs/6f1c1f5e-0000-4000-8000-000000000000", {"headers": auth}),
        ("GET", "/api/v1/runs", {}),  # no token
        ("POST", "/api/v1/runs", {"headers": auth, "content": b"{not json", "params": {}}),
        ("POST", "/api/v1/runs", {"headers": {**auth, "Content-Length": "9999999"}, "content": b"{}"}),
    ]:
        fast, stock = both(app, method, path, **kwargs)
        assert (fast.status_code, fast.json()) == (stock.status_code, stock.json()), (method, path)
        assert fast.status_code >= 400 and fast.json()["code"], (method, path, fast.json())


def test_a_run_started_through_the_sync_path_is_committed_and_answered_201(app, token):
    services.workflow_create(definition=FLOW)
    response = call(
        app,
        "POST",
        "/api/v1/runs",
        sync_path=True,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        content=json.dumps({"workflow": "web-flow", "input": {"n": 1}}),
    )
    assert response.status_code == 201, response.text
    assert services.run_get(run_id=response.json()["id"]).input == {"n": 1}


def test_the_login_page_sets_its_csrf_cookie_on_the_sync_path(app):
    fast, stock = both(app, "GET", "/accounts/login/")
    assert fast.status_code == stock.status_code == 200
    assert "csrftoken" in fast.cookies and "csrftoken" in stock.cookies
    assert sorted(fast.headers.keys()) == sorted(stock.headers.keys())


# Django's async handler warns that it reads WhiteNoise's file whole; the sync path reads it on its thread.
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume synchronous iterators")
def test_a_static_file_is_served_whole_on_the_sync_path(app, settings):
    fast, stock = both(app, "GET", "/static/pal.css")
    assert fast.status_code == stock.status_code == 200
    assert fast.content == stock.content == (settings.BASE_DIR / "static" / "pal.css").read_bytes()


def test_the_event_streams_are_left_to_djangos_async_handler(app):
    run_id = "6f1c1f5e-0000-4000-8000-000000000000"
    assert app.view_is_async({"path": f"/api/v1/runs/{run_id}/events/stream"})
    assert app.view_is_async({"path": f"/runs/{run_id}/events/stream"})
    assert not app.view_is_async({"path": f"/api/v1/runs/{run_id}"})
    assert not app.view_is_async({"path": "/api/v1/no-such-call"})
    assert app.view_is_async({"path": f"/pal/api/v1/runs/{run_id}/events/stream", "root_path": "/pal"})
