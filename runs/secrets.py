"""The engine's configured secret values, and mask(): the last line of defence between them and the journal.

The step kinds that run someone else's code (runs/steps/agent.py, runs/steps/tools.py) pass everything they hand
to the journal (outputs, errors, custom events) through mask(), so a secret an agent or a tool got hold of
anyway is journaled as "[redacted]". Keeping secrets from agents in the first place is agent.py's allowlist.
"""

import functools
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings

REDACTED = "[redacted]"
# Shorter values are not masked: "pal" or "test" would redact ordinary words everywhere. A value this short is
# no secret worth the name; `manage.py check --deploy` already warns about a short DJANGO_SECRET_KEY.
MIN_SECRET_LENGTH = 6


def _url_password(url: str) -> list[str]:
    try:
        password = urlsplit(url or "").password
    except ValueError:
        return []
    return [password, unquote(password)] if password else []


def _pem_texts(key) -> list[str]:
    """The receipt key as PEM, and each base64 line of it: the lines are what a leak would contain whatever
    its wrapping."""
    if key is None:
        return []
    from cryptography.hazmat.primitives import serialization  # only when a key is configured

    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return [pem.strip(), *(line for line in pem.splitlines() if line and not line.startswith("-----"))]


@functools.lru_cache(maxsize=8)
def _derive(raw: tuple) -> tuple[str, ...]:
    """From the settings' raw values to the strings to mask, longest first (so a value that contains another
    is masked whole). Cached on the raw values: settings do not change at runtime, and a test that overrides
    one gets a new entry rather than a stale answer."""
    plain, urls, key = raw
    values = list(plain)
    for url in urls:
        values += _url_password(url)
    values += _pem_texts(key)
    unique = {v for v in values if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_LENGTH}
    return tuple(sorted(unique, key=lambda v: (-len(v), v)))


def secret_values() -> tuple[str, ...]:
    """Every configured secret value: the provider key, the webhook secret, the SMTP password, the Django
    secret key, the passwords inside DATABASE_URL and CELERY_BROKER_URL, the receipt private key (PEM) and its
    file's path. Cheap: reads a few settings and answers from a cache keyed on them."""
    database = settings.DATABASES.get("default", {})
    plain = (
        getattr(settings, "PAL_LLM_API_KEY", ""),
        getattr(settings, "PAL_WEBHOOK_SECRET", ""),
        getattr(settings, "PAL_METRICS_TOKEN", ""),
        getattr(settings, "EMAIL_HOST_PASSWORD", ""),
        getattr(settings, "SECRET_KEY", ""),
        database.get("PASSWORD") or "",
        getattr(settings, "PAL_RECEIPT_PRIVATE_KEY_FILE", ""),
    )
    urls = (getattr(settings, "DATABASE_URL", ""), getattr(settings, "CELERY_BROKER_URL", ""))
    return _derive((plain, urls, getattr(settings, "PAL_RECEIPT_PRIVATE_KEY", None)))


@functools.lru_cache(maxsize=8)
def _pattern(values: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(v) for v in values))


def mask(value: Any) -> Any:
    """value (a JSON value) with every occurrence of a secret value in its strings, keys included, replaced
    by "[redacted]". Other values come back as they are; nothing is changed in place."""
    values = secret_values()
    if not values:
        return value
    return _walk(value, _pattern(values))


def _walk(value: Any, pattern: re.Pattern) -> Any:
    if isinstance(value, str):
        return pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {(_walk(k, pattern) if isinstance(k, str) else k): _walk(v, pattern) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, pattern) for v in value]
    return value


# A value under a key named like one of these is never journaled or shown (docs/reference/journal.md).
SECRET_KEY_PARTS = ("authorization", "api_key", "apikey", "password", "secret", "token")


def _secret_named(key: Any) -> bool:
    return isinstance(key, str) and any(part in key.lower() for part in SECRET_KEY_PARTS)


def redact(value: Any) -> Any:
    """value (a JSON value) with what sits under a secret-named key replaced by REDACTED, and every configured
    secret value masked in what is left (mask): a step's input as the journal, the pages and the receipts keep it."""
    return mask(_redact_keys(value))


def _redact_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if _secret_named(k) else _redact_keys(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_keys(v) for v in value]
    return value
