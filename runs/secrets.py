"""The engine's configured secret values, and mask(): the last line of defence between them and the journal.

The step kinds that run someone else's code (runs/steps/agent.py, runs/steps/tools.py) pass everything they hand
to the journal (outputs, errors, custom events) through mask(), so a secret an agent or a tool got hold of
anyway is journaled as "[redacted]". Keeping secrets from agents in the first place is agent.py's allowlist.
"""

import functools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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
    file's path. Read from the settings once and kept until a setting changes (_forget)."""
    return _masker().values


@dataclass(frozen=True)
class _Masker:
    """What mask() needs of the settings, worked out once: the values, their pattern, and the length below which a
    string cannot hold any of them (so mask() leaves it as it is, unsearched)."""

    values: tuple[str, ...]
    pattern: re.Pattern | None
    shortest: int


_cached: _Masker | None = None


def _masker() -> _Masker:
    global _cached
    masker = _cached
    if masker is None:  # reading the settings costs more than masking a step's payload: once per process
        values = _derive(_raw_settings())
        pattern = _pattern(values) if values else None
        masker = _cached = _Masker(values, pattern, min((len(v) for v in values), default=0))
    return masker


@receiver(setting_changed)
def _forget(**kwargs) -> None:
    """A setting changed (override_settings, a test's `settings` fixture): read them again at the next mask()."""
    global _cached
    _cached = None


def _raw_settings() -> tuple:
    database = settings.DATABASES.get("default", {})
    plain = (
        getattr(settings, "PAL_LLM_API_KEY", ""),
        getattr(settings, "PAL_WEBHOOK_SECRET", ""),
        getattr(settings, "PAL_METRICS_TOKEN", ""),
        *(str(mailer.get("OPTIONS", {}).get("password") or "") for mailer in getattr(settings, "MAILERS", {}).values()),
        getattr(settings, "SECRET_KEY", ""),
        database.get("PASSWORD") or "",
        getattr(settings, "PAL_RECEIPT_PRIVATE_KEY_FILE", ""),
    )
    urls = (getattr(settings, "DATABASE_URL", ""), getattr(settings, "CELERY_BROKER_URL", ""))
    return (plain, urls, getattr(settings, "PAL_RECEIPT_PRIVATE_KEY", None))


@functools.lru_cache(maxsize=8)
def _pattern(values: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(v) for v in values))


def mask(value: Any) -> Any:
    """value (a JSON value) with every occurrence of a secret value in its strings, keys included, replaced
    by "[redacted]". Other values come back as they are; nothing is changed in place."""
    masker = _masker()
    if masker.pattern is None:
        return value
    return _walk(value, masker.pattern, masker.shortest, False)


def _walk(value: Any, pattern: re.Pattern, shortest: int, keys: bool) -> Any:
    """mask() of value; keys: redact() too (what sits under a secret-named key of a dict reached through dicts
    and lists only, as redact() has always looked, becomes REDACTED, itself masked)."""
    if isinstance(value, str):
        # A string shorter than the shortest secret value cannot hold one: sub() would give it back unchanged.
        return value if len(value) < shortest else pattern.sub(REDACTED, value)
    if isinstance(value, dict):
        return {
            (_walk(k, pattern, shortest, False) if isinstance(k, str) else k): (
                _walk(REDACTED, pattern, shortest, False)
                if keys and _secret_named(k)
                else _walk(v, pattern, shortest, keys)
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_walk(v, pattern, shortest, keys) for v in value]
    if isinstance(value, tuple):
        return [_walk(v, pattern, shortest, False) for v in value]
    return value


# A value under a key named like one of these is never journaled or shown (docs/reference/journal.md).
SECRET_KEY_PARTS = ("authorization", "api_key", "apikey", "password", "secret", "token")


_SECRET_NAME = re.compile("|".join(map(re.escape, SECRET_KEY_PARTS)))  # one search, not a generator over the parts


def _secret_named(key: Any) -> bool:
    return isinstance(key, str) and _SECRET_NAME.search(key.lower()) is not None


def redact(value: Any) -> Any:
    """value (a JSON value) with what sits under a secret-named key replaced by REDACTED, and every configured
    secret value masked in what is left (mask): a step's input as the journal, the pages and the receipts keep it.
    One walk over the value, not one for each."""
    masker = _masker()
    if masker.pattern is None:
        return _redact_keys(value)
    return _walk(value, masker.pattern, masker.shortest, True)


def _redact_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if _secret_named(k) else _redact_keys(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_keys(v) for v in value]
    return value
