"""runs.secrets reads the settings once and walks a value once: mask() and redact() give exactly what they gave
when they read the settings at every call and redact() walked twice (the reference below, as it was written)."""

import random
import re

import pytest

from runs.secrets import REDACTED, SECRET_KEY_PARTS, mask, redact, secret_values
from tests.helpers import LOGIN_OUTBOX_MAIL, mailer

# --- the reference: mask() and redact() before they kept the settings' answer --------------------------------


def reference_mask(value, values):
    if not values:
        return value
    return _reference_walk(value, re.compile("|".join(re.escape(v) for v in values)))


def _reference_walk(value, pattern):
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {
            (_reference_walk(k, pattern) if isinstance(k, str) else k): _reference_walk(v, pattern)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_reference_walk(v, pattern) for v in value]
    return value


def reference_redact(value, values):
    return reference_mask(_reference_redact_keys(value), values)


def _reference_redact_keys(value):
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(k, str) and any(p in k.lower() for p in SECRET_KEY_PARTS)
                else _reference_redact_keys(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_reference_redact_keys(v) for v in value]
    return value


# --- values to compare them on ---------------------------------------------------------------------------------

SECRETS = ("sk-provider-123456", "hook-secret-leaked-123456", "redacted", "passw0rd!")


def a_string(rng: random.Random) -> str:
    pieces = ["", "a", "plain words", "redact", "[redacted]", "sk-provider-12345", "PASSWORD", "é\u2028", *SECRETS]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))


def a_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        return rng.choice([a_string(rng), a_string(rng), 7, 2.5, True, None])
    if roll < 0.65:
        keys = [a_string(rng), "api_key", "Authorization", "token_count", "ok", 3, "x-secret-" + a_string(rng)]
        return {rng.choice(keys): a_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if roll < 0.85:
        return [a_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return tuple(a_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))


@pytest.fixture
def configured(settings):
    settings.PAL_LLM_API_KEY, settings.PAL_WEBHOOK_SECRET = SECRETS[0], SECRETS[1]
    settings.MAILERS = mailer(LOGIN_OUTBOX_MAIL, username="pal", password=SECRETS[2])
    settings.SECRET_KEY = SECRETS[3]
    return settings


def test_mask_and_redact_give_what_the_reference_gives_on_a_thousand_values(configured):
    values, rng = secret_values(), random.Random(15)
    assert set(SECRETS) <= set(values)

    for _ in range(1000):
        value = a_value(rng)
        assert mask(value) == reference_mask(value, values), value
        assert redact(value) == reference_redact(value, values), value


def test_a_secret_inside_the_redacted_marker_is_masked_there_too(configured):
    # "redacted" is configured: redact() masks the marker it puts under a secret-named key, as mask() always did.
    assert redact({"api_key": "x", "note": "redacted"}) == reference_redact(
        {"api_key": "x", "note": "redacted"}, secret_values()
    )
    assert redact({"api_key": "x"}) == {"api_key": f"[{REDACTED}]"}


def test_strings_shorter_than_every_secret_come_back_as_they_are(configured):
    short = "x" * (min(len(v) for v in secret_values()) - 1)

    assert mask({short: [short, (short,)]}) == {short: [short, [short]]}


def test_without_any_secret_configured_redact_still_hides_secret_named_keys(settings):
    for name in ("PAL_LLM_API_KEY", "PAL_WEBHOOK_SECRET", "PAL_METRICS_TOKEN"):
        setattr(settings, name, "")
    settings.MAILERS = mailer(LOGIN_OUTBOX_MAIL, password="")
    settings.SECRET_KEY, settings.PAL_RECEIPT_PRIVATE_KEY_FILE, settings.PAL_RECEIPT_PRIVATE_KEY = "short", "", None
    settings.DATABASE_URL, settings.CELERY_BROKER_URL = "sqlite:///x", "memory://"
    # the test database's password ("pal") is too short to be one
    assert secret_values() == ()

    value = {"password": "hunter22", "args": [{"Token": 1}, ("token", {"secret": 2})]}
    assert (
        redact(value)
        == reference_redact(value, ())
        == {"password": REDACTED, "args": [{"Token": REDACTED}, ("token", {"secret": 2})]}
    )


def test_a_setting_changed_after_a_mask_is_masked_at_the_next_call(settings):
    settings.PAL_WEBHOOK_SECRET = "first-secret-123456"
    assert mask("a first-secret-123456") == f"a {REDACTED}"

    settings.PAL_WEBHOOK_SECRET = "second-secret-123456"

    assert mask("a first-secret-123456 and second-secret-123456") == f"a first-secret-123456 and {REDACTED}"
