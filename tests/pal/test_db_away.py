"""pal.db_away in one process: while the database is known to be away every call, page and htmx request answers a
503 of its own kind at once, /health names the database, and a look that finds it back lets requests through.
(tests/durability/test_database_away.py stops a real Postgres under a real web process.)"""

import time

import pytest
from django.test import Client

from pal import db_away
from tests.api.conftest import make_user, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def away():
    """The database known away, with no look due for an hour."""
    db_away.state.why, db_away.state.looked_at = "connection refused (a test)", time.monotonic() + 3600
    yield db_away.state
    db_away.state.why, db_away.state.looked_at = None, 0.0


@pytest.fixture
def operator():
    user = make_user("otto", "runs.view_run", "runs.operate")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client, {"HTTP_AUTHORIZATION": f"Bearer {token_for(user)}"}


def test_every_call_page_and_htmx_request_answers_503_while_the_database_is_away(operator, away):
    client, token = operator

    api = client.post("/api/v1/runs", {"workflow": "w"}, content_type="application/json", **token)
    page = client.get("/runs/")
    htmx = client.get("/runs/", HTTP_HX_REQUEST="true")

    assert api.status_code == page.status_code == htmx.status_code == 503
    assert api["Retry-After"] == page["Retry-After"] == htmx["Retry-After"] == "1"
    body = api.json()
    assert body["code"] == "unavailable"
    assert body["detail"].startswith("the database is away (connection refused (a test))")
    assert "same Idempotency-Key is safe" in body["detail"]
    assert page["Content-Type"].startswith("text/html") and "503 · Unavailable" in page.content.decode()
    assert htmx.content.decode().startswith("Unavailable: the database is away")


def test_health_names_the_database_while_it_is_away(away):
    response = Client(HTTP_HOST="127.0.0.1").get("/api/v1/health")

    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "error" and body["code"] == "unhealthy"
    assert body["problems"][0] == "database: DatabaseAway: connection refused (a test)"


def test_a_look_that_finds_the_database_back_lets_the_request_through(operator, away):
    client, token = operator
    away.looked_at = 0.0  # a look is due

    response = client.get("/api/v1/runs", **token)

    assert response.status_code == 200, response.content
    assert away.why is None
