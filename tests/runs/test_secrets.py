"""runs.secrets: every configured secret value, masked out of what the engine journals from tools (and agents,
tests/runs/test_agents.py) as a last line of defence (docs/reference/journal.md, issue 10 section 3)."""

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runs.errors import StepError
from runs.models import RunStatus
from runs.secrets import REDACTED, mask, secret_values
from runs.steps.tools import tool
from tests.helpers import LOGIN_OUTBOX_MAIL, drive, events, mailer, make_run, step_events, tool_step

LEAKED = "hook-secret-leaked-123456"


@pytest.fixture
def configured(settings):
    """Every kind of secret configured, with values long enough to be masked."""
    settings.PAL_LLM_API_KEY = "sk-provider-123456"
    settings.PAL_WEBHOOK_SECRET = LEAKED
    settings.MAILERS = mailer(LOGIN_OUTBOX_MAIL, username="pal", password="smtp-pass-123456")
    settings.SECRET_KEY = "django-secret-123456"
    settings.DATABASE_URL = "postgres://pal:db%2Fpass-123@db.internal:5432/pal"
    settings.CELERY_BROKER_URL = "redis://:broker-pass-123@redis.internal:6379/0"
    settings.PAL_RECEIPT_PRIVATE_KEY = Ed25519PrivateKey.generate()
    settings.PAL_RECEIPT_PRIVATE_KEY_FILE = "/etc/pal/receipt-key.pem"
    return settings


def pem_of(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


# --- the values ------------------------------------------------------------------------------------


def test_secret_values_holds_every_configured_secret(configured):
    values = set(secret_values())

    assert {"sk-provider-123456", LEAKED, "smtp-pass-123456", "django-secret-123456"} <= values
    assert {"db/pass-123", "db%2Fpass-123", "broker-pass-123"} <= values  # the URLs' passwords, raw and quoted
    assert "/etc/pal/receipt-key.pem" in values
    pem = pem_of(configured.PAL_RECEIPT_PRIVATE_KEY)
    assert pem.strip() in values
    assert pem.splitlines()[1] in values  # the key's base64 line, whatever wrapping a leak gives it


def test_short_and_empty_values_are_not_secrets_to_mask(settings):
    settings.PAL_LLM_API_KEY = ""
    settings.PAL_WEBHOOK_SECRET = "abc"
    settings.DATABASE_URL = "postgres://pal:pal@127.0.0.1:5432/pal"

    assert not {"", "abc", "pal"} & set(secret_values())
    assert mask({"text": "PAL Ops talks to pal"}) == {"text": "PAL Ops talks to pal"}


def test_a_changed_setting_is_seen_at_once(settings):
    settings.PAL_LLM_API_KEY = "sk-first-123456"
    assert "sk-first-123456" in secret_values()

    settings.PAL_LLM_API_KEY = "sk-second-123456"

    assert "sk-second-123456" in secret_values()
    assert "sk-first-123456" not in secret_values()


# --- mask ------------------------------------------------------------------------------------------


def test_mask_walks_a_json_value_and_redacts_every_occurrence_in_strings_and_keys(configured):
    value = {"a": [f"x{LEAKED}y{LEAKED}", {"deep": "db/pass-123"}], LEAKED: 1, "n": 3, "ok": True, "none": None}

    masked = mask(value)

    assert masked == {
        "a": [f"x{REDACTED}y{REDACTED}", {"deep": REDACTED}],
        REDACTED: 1,
        "n": 3,
        "ok": True,
        "none": None,
    }
    assert value["a"][0] == f"x{LEAKED}y{LEAKED}"  # not changed in place


def test_a_leaked_receipt_key_is_masked_whole(configured):
    pem = pem_of(configured.PAL_RECEIPT_PRIVATE_KEY)

    masked = mask({"file": pem, "one_line": pem.replace("\n", "")})

    assert masked["file"].strip() == REDACTED
    assert pem.splitlines()[1] not in json.dumps(masked)


# --- tools -----------------------------------------------------------------------------------------


@tool("test_leak_output")
def leak_output_tool(args, ctx):
    ctx.emit("secret_seen", {"value": LEAKED, "list": [LEAKED]})
    return {"echo": LEAKED, "text": f"signed with {LEAKED}"}


@tool("test_leak_error")
def leak_error_tool(args, ctx):
    raise StepError(f"the peer refused {LEAKED}", code="test_refused", details={"header": LEAKED})


@tool("test_leak_bug")
def leak_bug_tool(args, ctx):
    raise ValueError(f"bad secret {LEAKED}")


def journal_text(run) -> str:
    return json.dumps([[e.kind, e.payload] for e in events(run)])


@pytest.mark.django_db
def test_a_tools_output_and_events_are_journaled_with_secrets_redacted(configured):
    run = make_run(steps=[tool_step("leak", "test_leak_output")])

    drive(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert LEAKED not in journal_text(run)
    assert run.output == {"echo": REDACTED, "text": f"signed with {REDACTED}"}
    (event,) = step_events(run, "secret_seen", "leak")
    assert event.payload == {"value": REDACTED, "list": [REDACTED]}


@pytest.mark.django_db
def test_a_tools_step_error_is_journaled_with_secrets_redacted_in_message_and_details(configured):
    run = make_run(steps=[tool_step("leak", "test_leak_error")])

    drive(run)

    assert run.status == RunStatus.FAILED
    assert LEAKED not in journal_text(run)
    (failed,) = step_events(run, "step_failed", "leak")
    assert (failed.payload["code"], failed.payload["message"]) == ("test_refused", f"the peer refused {REDACTED}")
    assert failed.payload["details"] == {"header": REDACTED}


@pytest.mark.django_db
def test_a_tools_unexpected_exception_is_an_internal_error_with_secrets_redacted(configured, caplog):
    run = make_run(steps=[tool_step("leak", "test_leak_bug")])

    drive(run)

    assert run.status == RunStatus.FAILED
    (failed,) = step_events(run, "step_failed", "leak")
    assert (failed.payload["code"], failed.payload["message"]) == (
        "internal_error",
        f"ValueError: bad secret {REDACTED}",
    )
    assert LEAKED not in journal_text(run)
    assert LEAKED not in caplog.text
