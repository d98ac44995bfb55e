"""The run list's search filters (docs/reference/api.md, GET /runs): what a run's input contains, when it was created,
its error's code. Each filter is read from its text here, once, for the API, the runs page and bulk actions (which
store the text), and turned into the expression runs.selectors.runs_matching filters on."""

# Postgres answers the containment with `input @> probe` over a GIN index (jsonb_path_ops) and the error code with
# `error ->> 'code'` over an expression index, both ordered by (created_at, id) like the list (migration 0011).
# SQLite (the embedded default) has no jsonb: it asks pal_json_contains, a deterministic function registered on each
# of its connections (runs.apps) that is json_contains below, the same rule as Postgres's @>.

import json
import re
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import BooleanField, F, Func, JSONField, Q, TextField, Value
from django.db.models.functions import Cast
from django.db.models.lookups import Exact

from journal.text import StorableJSONEncoder, first_nonfinite, loads_marking_nonfinite

from .errors import ServiceError

SEARCH_FILTERS = ("input", "created_after", "created_before", "error_code")
MAX_INPUT_TEXT = 10_000  # characters of an input filter's JSON
MAX_ERROR_CODE = 100


class InvalidFilter(ServiceError):
    status = 422


# --- reading each filter's text ----------------------------------------------------------------------


def input_probe(text: str, *, field: str = "input") -> dict:
    """The input filter: a JSON object that a run's input must contain."""
    if len(text) > MAX_INPUT_TEXT:
        raise InvalidFilter(f"{field}: at most {MAX_INPUT_TEXT} characters of JSON", code="invalid_filter")
    try:
        probe = loads_marking_nonfinite(text)
    except ValueError as exc:
        raise InvalidFilter(f"{field}: not JSON ({exc})", code="invalid_filter") from None
    nonfinite = first_nonfinite(probe, field)
    if nonfinite is not None:
        raise InvalidFilter(f"{nonfinite[0]}: {nonfinite[1]}", code="invalid_filter")
    if not isinstance(probe, dict):
        raise InvalidFilter(
            f'{field}: must be a JSON object, such as {{"customer": "acme"}} (got {type(probe).__name__})',
            code="invalid_filter",
        )
    return probe


def moment(text: str, *, field: str) -> datetime:
    """An ISO 8601 date or date-time; without a zone it is UTC (the pages show UTC)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidFilter(
            f"{field}: {text!r} is not an ISO 8601 date-time, such as 2026-12-01T13:40:00Z", code="invalid_filter"
        ) from None
    try:
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-23:59 is past the last moment a date-time can hold, in UTC
        raise InvalidFilter(
            f"{field}: {text!r} is outside the date-times that can be compared (years 1 to 9999 in UTC)",
            code="invalid_filter",
        ) from None


def error_code_text(text: str, *, field: str = "error_code") -> str:
    code = text.strip()
    if len(code) > MAX_ERROR_CODE:
        raise InvalidFilter(f"{field}: at most {MAX_ERROR_CODE} characters", code="invalid_filter")
    return code


def search_filters(
    *,
    input: str | None = None,
    created_after: str | None = None,
    created_before: str | None = None,
    error_code: str | None = None,
) -> dict[str, Any]:
    """The filters' texts read into runs_matching's arguments; an empty one is left out. Raises InvalidFilter
    naming the first bad field."""
    texts = {"input": input, "created_after": created_after, "created_before": created_before, "error_code": error_code}
    found: dict[str, Any] = {}
    for field, text in texts.items():
        if text is None:
            continue
        if not isinstance(text, str):
            raise InvalidFilter(f"{field}: must be text", code="invalid_filter")
        if not text.strip():
            continue
        if field == "input":
            found[field] = input_probe(text)
        elif field == "error_code":
            found[field] = error_code_text(text)
        else:
            found[field] = moment(text, field=field)
    return found


# --- the expressions -------------------------------------------------------------------------------


class JsonKeyText(Func):
    """A top-level key of a JSON column as text (NULL when absent), with the key written into the SQL rather than
    bound as Django's KT binds it: an expression index serves only a query whose expression is the same, and a
    bound key is not (SQLite never, Postgres not in a generic plan)."""

    output_field = TextField()

    def __init__(self, column: str, key: str):
        if not re.fullmatch(r"[a-z_]{1,40}", key):
            raise ValueError(f"key {key!r}: a-z and _ only")  # it goes into the SQL as written
        super().__init__(F(column))
        self.key = key

    def as_postgresql(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template=f"(%(expressions)s ->> '{self.key}')", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return super().as_sql(compiler, connection, template=f"json_extract(%(expressions)s, '$.{self.key}')", **extra)


def error_code_is(code: str) -> Exact:
    """runs.error->>'code' = code, written as the index runs_error_code_idx is."""
    return Exact(JsonKeyText("error", "code"), code)


def input_contains(probe: dict, *, indexed: bool = True) -> Q | Func:
    """Runs whose input contains the probe (jsonb @>). The probe is encoded as the input column is (journal.text's
    escapes), so text Postgres cannot store compares the same way on both sides. indexed=False on Postgres: the
    same test as a call of jsonb_contains (the function behind @>), which no index answers, for a query that
    reaches its runs another way (runs.input_terms)."""
    if connection.vendor == "postgresql" and indexed:
        return Q(input__contains=probe)
    encoded = json.dumps(probe, cls=StorableJSONEncoder, ensure_ascii=False)
    if connection.vendor == "postgresql":
        return Func(
            F("input"), Cast(Value(encoded), JSONField()), function="jsonb_contains", output_field=BooleanField()
        )
    return Func(F("input"), Value(encoded), function="pal_json_contains", output_field=BooleanField())


# --- SQLite's containment --------------------------------------------------------------------------


def _scalar_equal(value, probe) -> bool:
    if isinstance(value, bool) or isinstance(probe, bool):
        return isinstance(value, bool) and isinstance(probe, bool) and value == probe
    if isinstance(value, (int, float)) and isinstance(probe, (int, float)):
        return value == probe  # jsonb numbers: 1 and 1.0 are equal
    return type(value) is type(probe) and value == probe


def json_contains(value, probe, *, top: bool = True) -> bool:
    """Postgres's jsonb `value @> probe`: an object contains an object whose every key it has with a contained
    value; an array contains an array each of whose elements some element contains (order and repeats do not
    matter); scalars are equal; and, at the top level only, an array contains a scalar it has as an element."""
    if isinstance(probe, dict):
        return isinstance(value, dict) and all(
            key in value and json_contains(value[key], sub, top=False) for key, sub in probe.items()
        )
    if isinstance(probe, list):
        return isinstance(value, list) and all(
            any(json_contains(element, wanted, top=False) for element in value) for wanted in probe
        )
    if isinstance(value, list) and top:
        return any(not isinstance(element, (dict, list)) and _scalar_equal(element, probe) for element in value)
    return not isinstance(value, (dict, list)) and _scalar_equal(value, probe)


def sqlite_json_contains(stored: str | None, probe: str | None) -> bool:
    """pal_json_contains(input, probe) on SQLite: both are JSON text as stored (escapes and all)."""
    if stored is None or probe is None:
        return False
    try:
        return json_contains(json.loads(stored), json.loads(probe))
    except ValueError:
        return False


def sqlite_functions_register(sender, connection, **kwargs) -> None:
    """connection_created: give each new SQLite connection pal_json_contains (Django registers its own the same
    way); other databases need nothing."""
    if connection.vendor == "sqlite":
        connection.connection.create_function("pal_json_contains", 2, sqlite_json_contains, deterministic=True)
