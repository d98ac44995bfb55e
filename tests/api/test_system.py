"""GET /health and GET /receipts/public-key need no token; the OpenAPI document and the docs are served."""

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import override_settings

from runs.recovery import sweep_once

from .conftest import assert_error


def test_health_reports_database_broker_and_the_last_sweep(anonymous):
    body = anonymous.get("/health").json()
    assert body == {"database": "ok", "broker": "ok", "sweep": "none", "last_sweep_at": None}
    sweep = sweep_once(who="test")
    response = anonymous.get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["last_sweep_at"].startswith(sweep.finished_at.strftime("%Y-%m-%dT%H:%M:%S"))
    assert body["sweep"] == "ok"


def test_health_is_503_naming_the_sweep_when_the_last_one_is_older_than_three_intervals(anonymous, settings):
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Sweep

    settings.PAL_RECOVERY_INTERVAL = 30
    long_ago = timezone.now() - timedelta(seconds=3 * 30 + 11)
    Sweep.objects.create(started_at=long_ago, finished_at=long_ago, who="beat")
    response = anonymous.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert (body["database"], body["broker"], body["sweep"], body["code"]) == ("ok", "ok", "stale", "unhealthy")
    assert [p.split(":")[0] for p in body["problems"]] == ["sweep"]
    assert "PAL_RECOVERY_INTERVAL is 30s" in body["detail"]

    sweep_once(who="beat")
    assert anonymous.get("/health").json()["sweep"] == "ok"


@pytest.mark.integration  # Postgres only: it terminates the server backend of the kept connection
@pytest.mark.django_db(transaction=True)
def test_health_answers_from_a_fresh_connection_when_postgres_dropped_the_kept_one():
    import psycopg
    from django.db import connection
    from django.test import Client

    assert connection.vendor == "postgresql", "this test needs Postgres: a server backend to terminate"
    connection.ensure_connection()
    backend = connection.connection.info.backend_pid
    with psycopg.connect(
        connection.connection.info.dsn, password=connection.settings_dict["PASSWORD"], autocommit=True
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [backend])
    response = Client(HTTP_HOST="127.0.0.1").get("/api/v1/health")
    assert response.status_code == 200, response.content
    assert response.json()["database"] == "ok"
    assert connection.connection.info.backend_pid != backend


def test_health_is_503_when_the_broker_is_away(anonymous):
    with override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0"):
        response = anonymous.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert (body["database"], body["broker"], body["code"]) == ("ok", "error", "unhealthy")
    assert body["detail"].startswith("broker:")
    assert [p.split(":")[0] for p in body["problems"]] == ["broker"]


def test_health_is_503_when_the_database_is_away(anonymous, monkeypatch):
    from django.db import connection

    def refuse(*args, **kwargs):
        raise RuntimeError("connection refused")

    monkeypatch.setattr(connection, "cursor", refuse)
    response = anonymous.get("/health")
    monkeypatch.undo()
    assert response.status_code == 503
    assert response.json()["database"] == "error" and "connection refused" in response.json()["detail"]
    assert response.json()["sweep"] == "unknown"
    assert [p.split(":")[0] for p in response.json()["problems"]] == ["database"]


def test_the_public_key_is_404_until_one_is_configured(anonymous):
    assert_error(anonymous.get("/receipts/public-key"), 404, "not_configured")


def test_the_public_key_is_the_pem_of_the_signing_key(anonymous):
    key = Ed25519PrivateKey.generate()
    with override_settings(PAL_RECEIPT_PRIVATE_KEY=key):
        response = anonymous.get("/receipts/public-key")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-pem-file"
    loaded = serialization.load_pem_public_key(response.content)
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    assert loaded.public_bytes(*raw) == key.public_key().public_bytes(*raw)


def test_a_bad_signing_key_stops_start_up(monkeypatch, tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    from pal.settings import _receipt_key

    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY", "not a key")
    with pytest.raises(ImproperlyConfigured, match="PAL_RECEIPT_PRIVATE_KEY"):
        _receipt_key()
    monkeypatch.delenv("PAL_RECEIPT_PRIVATE_KEY")
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "key.pem").write_bytes(pem)
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY_FILE", str(tmp_path / "key.pem"))
    assert isinstance(_receipt_key(), Ed25519PrivateKey)
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ImproperlyConfigured, match="PAL_RECEIPT_PRIVATE_KEY_FILE"):
        _receipt_key()


CONTRACT = {
    ("post", "/api/v1/workflows"),
    ("get", "/api/v1/workflows"),
    ("get", "/api/v1/workflows/{name}"),
    ("post", "/api/v1/runs"),
    ("get", "/api/v1/runs"),
    ("get", "/api/v1/runs/{id}"),
    ("get", "/api/v1/runs/{id}/events"),
    ("get", "/api/v1/runs/{id}/events/stream"),
    ("post", "/api/v1/runs/{id}/events"),
    ("get", "/api/v1/runs/{id}/waterfall"),
    ("get", "/api/v1/runs/{id}/receipt"),
    ("get", "/api/v1/runs/{id}/redrive/preview"),
    ("post", "/api/v1/runs/{id}/redrive"),
    ("post", "/api/v1/runs/{id}/cancel"),
    ("post", "/api/v1/runs/{id}/retry"),
    ("post", "/api/v1/runs/{id}/approvals/{step_id}"),
    ("post", "/api/v1/runs/{id}/signals/{name}"),
    ("get", "/api/v1/receipts/public-key"),
    ("get", "/api/v1/health"),
    # Issues 13 and 14: the contract's later calls (GET /metrics is a plain view: Prometheus's text, no JSON).
    ("post", "/api/v1/runs/batch"),
    ("get", "/api/v1/runs/{id}/steps/{step_id}"),
    ("post", "/api/v1/runs/{id}/fork"),
    ("post", "/api/v1/runs/{id}/fork/preview"),  # ours: what a fork would reuse, before it is made
    ("get", "/api/v1/runs/{a}/compare/{b}"),
    ("post", "/api/v1/runs/{id}/budget"),
    ("post", "/api/v1/schedules"),
    ("get", "/api/v1/schedules"),
    ("get", "/api/v1/schedules/{id}"),
    ("patch", "/api/v1/schedules/{id}"),
    ("delete", "/api/v1/schedules/{id}"),
    # Issue 27: CONTRACT section 12's pauses.
    ("post", "/api/v1/pauses"),
    ("get", "/api/v1/pauses"),
    ("get", "/api/v1/pauses/{id}"),  # ours: one pause
    ("delete", "/api/v1/pauses/{id}"),
    # Issue 27: CONTRACT section 12's reruns.
    ("post", "/api/v1/reruns"),
    ("get", "/api/v1/reruns"),
    ("get", "/api/v1/reruns/{id}"),  # ours: one rerun and its progress
    ("post", "/api/v1/reruns/{id}/abort"),  # ours: stop it
    # Issue 27: CONTRACT section 12's saved views.
    ("post", "/api/v1/views"),
    ("get", "/api/v1/views"),
    ("get", "/api/v1/views/{id}"),  # ours: one view
    ("delete", "/api/v1/views/{id}"),  # ours
    ("get", "/api/v1/views/{id}/runs"),
    # Issue 27: CONTRACT section 12's move (POST /workflows?dry_run=true is a query of POST /workflows).
    ("post", "/api/v1/runs/{id}/move"),
    # Issue 28: CONTRACT section 12's inbox.
    ("get", "/api/v1/decisions"),
}


def test_the_openapi_document_has_every_call_of_the_contract(anonymous):
    schema = anonymous.get("/openapi.json").json()
    calls = {(method, path) for path, item in schema["paths"].items() for method in item}
    assert calls == CONTRACT
    assert schema["info"]["version"] == "1"
    assert schema["components"]["securitySchemes"]["TokenAuth"] == {"type": "http", "scheme": "bearer"}


def test_the_openapi_document_lists_error_answers(anonymous):
    paths = anonymous.get("/openapi.json").json()["paths"]
    create = paths["/api/v1/runs"]["post"]["responses"]
    assert {"200", "201", "401", "403", "404", "409", "413", "422"} <= set(create)
    assert create["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")
    stream = paths["/api/v1/runs/{id}/events/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    assert "security" not in paths["/api/v1/health"]["get"]


def test_the_docs_are_served(anonymous):
    response = anonymous.get("/docs")
    assert response.status_code == 200 and b"openapi.json" in response.content
