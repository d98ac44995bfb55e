"""No configured secret leaves a real run through our own surfaces (issue 13, "Step inputs, journaled and safe";
CONTRACT section 5).

A real worker holds the provider key, the webhook secret and the SMTP password, and runs one workflow with every
kind of step, each with a secret planted where an author would plant one by mistake: in a prompt, in tool args
(under "api_key", in a nested "Authorization" header, inside a plain string), in a webhook body, in an email body,
in a child run's input and in an agent's output. The values do reach the peers (that is their job); they must
reach none of ours: the journal, the receipt, the event API, the run page and its step panels, the admin, the
worker's log and this process's log.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from runs.models import Run, RunStatus
from runs.receipts import run_receipt
from runs.secrets import REDACTED
from runs.services import workflow_create
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import (
    LOGIN_OUTBOX_MAIL,
    QUICK,
    describe,
    email,
    events,
    llm,
    mailer,
    start_run,
    wait_for_end,
    webhook,
)
from tokens.services import token_create

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PROVIDER_KEY = "sk-everywhere-" + uuid.uuid4().hex[:12]
# The receiver checks X-PAL-Signature against this one, so the worker must sign with it.
HOOK_SECRET = WEBHOOK_SECRET
SMTP_PASSWORD = "smtp-everywhere-" + uuid.uuid4().hex[:12]
SECRETS = {"provider key": PROVIDER_KEY, "webhook secret": HOOK_SECRET, "SMTP password": SMTP_PASSWORD}

# The agent got hold of the provider key (its own copy, AGENT_COPY) and prints it in its output and on stderr.
LEAKY_AGENT = (
    "import json, os, sys; sys.stdin.read(); secret = os.environ['AGENT_COPY']; "
    "print('agent stderr ' + secret, file=sys.stderr, flush=True); "
    "print(json.dumps({'said': 'the key is ' + secret, 'api_key': secret}))"
)


def steps(hook_url: str, child: str) -> list[dict]:
    return [
        llm("ask", f"Summarise, and never mind the key {PROVIDER_KEY}"),
        {
            "id": "tool",
            "kind": "tool_call",
            "tool": "echo",
            "args": {
                "api_key": PROVIDER_KEY,
                "request": {"headers": {"Authorization": f"Bearer {PROVIDER_KEY}", "Accept": "text/plain"}},
                "note": f"call it with {PROVIDER_KEY} please",
            },
        },
        webhook("hook", hook_url, {"event": "done", "leak": f"signed with {HOOK_SECRET}"}),
        email("mail", "ops@example.com", "Report", f"the SMTP password is {SMTP_PASSWORD}"),
        {"id": "sub", "kind": "child_run", "workflow": child, "input": {"note": f"use {PROVIDER_KEY}"}},
        {"id": "code", "kind": "agent", "agent": "leaky", "input": {"hint": f"the key {PROVIDER_KEY}"}},
    ]


def operator_client() -> Client:
    user = User.objects.create_user(username="otto-secrets", is_staff=True)
    for codename in ("view_run", "operate"):
        user.user_permissions.add(Permission.objects.get(content_type__app_label="runs", codename=codename))
    client = Client()
    client.force_login(user)
    return client


def admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser(username="ada-secrets", email="ada@example.com"))
    return client


def api_get(path: str, token: str):
    return Client().get(f"/api/v1{path}", headers={"Authorization": f"Bearer {token}"})


def leaked_in(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def excerpt(text: str, around: int = 80) -> str:
    """The text around the first secret in it, for a failure message."""
    at = min(text.find(value) for value in SECRETS.values() if value in text)
    return repr(text[max(0, at - around) : at + around])


@pytest.fixture
def configured(settings, monkeypatch):
    """This process as the web server would be: the same secrets, the same agents (it validates the workflow)."""
    agents = {"leaky": [sys.executable, "-c", LEAKY_AGENT]}
    settings.PAL_LLM_API_KEY = PROVIDER_KEY
    settings.PAL_WEBHOOK_SECRET = HOOK_SECRET
    settings.MAILERS = mailer(LOGIN_OUTBOX_MAIL, password=SMTP_PASSWORD)
    settings.PAL_AGENTS = agents
    settings.PAL_AGENT_ENV = ["AGENT_COPY"]
    monkeypatch.setenv("AGENT_COPY", PROVIDER_KEY)
    return agents


def test_secrets_planted_in_every_kind_of_step_appear_on_none_of_our_surfaces(
    configured, celery_workers, llm_provider, webhook_receiver, smtp_sink, caplog
):
    caplog.set_level(logging.DEBUG)
    llm_provider.api_key = PROVIDER_KEY  # the provider refuses a call without the real key: it was sent
    worker = celery_workers(
        {
            **llm_provider.env(),
            **webhook_receiver.env(),
            **smtp_sink.env(),
            # No EMAIL_HOST_USER: Django then does not log in (the sink offers no AUTH), yet the password is a
            # configured secret value the engine must mask.
            "EMAIL_HOST_PASSWORD": SMTP_PASSWORD,
            "PAL_AGENTS": json.dumps(configured),
            "PAL_AGENT_ENV": "AGENT_COPY",
            "AGENT_COPY": PROVIDER_KEY,
        },
        name="secrets-everywhere",
        **QUICK,
    )
    child_name = f"secrets-child-{uuid.uuid4().hex[:8]}"
    workflow_create(
        definition={
            "name": child_name,
            "steps": [{"id": "echo", "kind": "tool_call", "tool": "echo", "args": {"got": "{{ input.note }}"}}],
        }
    )

    run = start_run(*steps(webhook_receiver.url, child_name))
    run = wait_for_end(run, timeout=90)

    assert run.status == RunStatus.SUCCEEDED, describe(run)
    # The secrets did their work at the peers (which may hold them: they are not ours).
    assert llm_provider.calls and PROVIDER_KEY in llm_provider.calls[0].body.decode()
    assert webhook_receiver.requests[0].signature_valid is True
    assert SMTP_PASSWORD in smtp_sink.wait_for_messages(1)[0].get_content()

    child = Run.objects.get(parent_run_id=run.id)
    # Every surface's text, by name; every leak is gathered before the test fails, so one run names them all.
    surfaces: dict[str, str] = {}
    for one in (run, child):
        which = "parent" if one is run else "child"
        for row in events(one):
            surfaces[f"{which} journal row {row.seq} {row.kind} {row.step_id or ''}"] = json.dumps(row.payload)
        one.refresh_from_db()
        surfaces[f"{which} runs row (input, output, error)"] = json.dumps([one.input, one.output, one.error])

    # Secret-named keys read "[redacted]" in the step's journaled input; configured values are masked elsewhere.
    (tool_started,) = events(run, "step_started", "tool")
    tool_input = tool_started.payload["input"]
    assert tool_input["args"]["api_key"] == REDACTED
    assert tool_input["args"]["request"]["headers"]["Authorization"] == REDACTED
    assert tool_input["args"]["request"]["headers"]["Accept"] == "text/plain"
    assert tool_input["args"]["note"] == f"call it with {REDACTED} please"
    (ask_started,) = events(run, "step_started", "ask")
    assert REDACTED in json.dumps(ask_started.payload["input"])
    (hook_started,) = events(run, "step_started", "hook")
    assert hook_started.payload["input"]["body"]["leak"] == f"signed with {REDACTED}"
    (mail_started,) = events(run, "step_started", "mail")
    assert mail_started.payload["input"]["body"] == f"the SMTP password is {REDACTED}"
    (code_completed,) = events(run, "step_completed", "code")
    assert code_completed.payload["output"]["said"] == f"the key is {REDACTED}"

    token = token_create(user=User.objects.create_user(username="vera-secrets", is_superuser=True), name="t")[1]
    operator, admin = operator_client(), admin_client()
    surfaces["runs.receipts.run_receipt"] = json.dumps(run_receipt(run_id=run.id, sign=False))
    for one in (run, child):
        api = {
            f"GET /runs/{one.id}": api_get(f"/runs/{one.id}", token),
            f"GET /runs/{one.id}/receipt": api_get(f"/runs/{one.id}/receipt", token),
            f"GET /runs/{one.id}/events": api_get(f"/runs/{one.id}/events", token),
            f"/runs/{one.id}/": operator.get(f"/runs/{one.id}/"),
            f"/admin/runs/run/{one.id}/change/": admin.get(f"/admin/runs/run/{one.id}/change/"),
        }
        step_ids = {e.step_id for e in events(one) if e.step_id}
        for step_id in step_ids:
            api[f"GET /runs/{one.id}/steps/{step_id}"] = api_get(f"/runs/{one.id}/steps/{step_id}", token)
            api[f"/runs/{one.id}/steps/{step_id}/"] = operator.get(f"/runs/{one.id}/steps/{step_id}/")
        for name, response in api.items():
            assert response.status_code == 200, f"{name}: {response.status_code} {response.content[:300]!r}"
            surfaces[name] = response.content.decode()
    assert len(json.loads(surfaces[f"GET /runs/{run.id}/events"])["items"]) == len(events(run))
    assert "ask" in surfaces[f"/runs/{run.id}/"] and "code" in surfaces[f"/runs/{run.id}/"]
    assert REDACTED in surfaces[f"/runs/{run.id}/steps/tool/"]  # the panel does show the (redacted) input

    worker_log = worker.log_path.read_text(errors="replace")
    assert "secrets-everywhere" in worker_log  # the log is the worker's, and it wrote to it
    surfaces[f"the worker's log {worker.log_path}"] = worker_log
    # Ours only: the peers (aiosmtpd's mail.log) run in this process and log what they were sent.
    surfaces["this process's log"] = "\n".join(
        f"{record.name}: {record.getMessage()}" for record in caplog.records if not record.name.startswith("mail.")
    )

    leaks = [f"{leaked_in(text)} on {name}: {excerpt(text)}" for name, text in surfaces.items() if leaked_in(text)]
    assert not leaks, "configured secrets reached our own surfaces:\n" + "\n".join(leaks)
