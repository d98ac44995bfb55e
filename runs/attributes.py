"""A run's attributes (a workflow's "attributes": NAME -> template, docs/reference/workflows.md): their values, set
when the run is created (the templates that read only its input) or in the commit of the step they read, and the
index that GET /runs?attr.NAME=VALUE, the runs page and saved views walk (run_attributes)."""

# A value keeps its JSON type (the pages show it so); a filter compares its text: a string as it is, any other value
# as compact JSON (3, true, {"a":1}), escaped as journal.text stores text Postgres cannot hold and cut to MAX_TEXT
# characters, the filter's value the same way, so the two never disagree. The filter index is (name, text,
# created_at, run_id), created_at the run's: one value's runs are one range of it, newest first, so a filter's first
# page costs the page and not the number of runs that match (bench J), as run_input_terms does for `input`.

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from journal.text import StorableJSONEncoder, escape, escape_text

from .errors import StepError
from .models import RunAttribute
from .search import InvalidFilter
from .workflows import ATTRIBUTE_NAME_RE, TEMPLATE_RE, render

MAX_TEXT = 200  # characters of an attribute's text that a filter compares
MAX_FILTERS = 10  # attr.NAME filters of one list
RARE_ENOUGH = 1000  # rows of a value counted when weighing which of several filters to walk
PREFIX = "attr."


def text_of(value: Any) -> str:
    """What a filter compares of a value: a string as it is, any other value as compact JSON; stored escaped
    (journal.text) and cut to MAX_TEXT characters."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return escape_text(text)[:MAX_TEXT]


# --- setting them ------------------------------------------------------------------------------------


def declared(definition: Mapping) -> dict[str, str]:
    attributes = definition.get("attributes") if isinstance(definition, Mapping) else None
    return attributes if isinstance(attributes, dict) else {}


def steps_read(template: str) -> set[str]:
    """The step ids a template reads (steps.ID.output...)."""
    paths = (match.group(1).split(".") for match in TEMPLATE_RE.finditer(template))
    return {parts[1] for parts in paths if len(parts) > 1 and parts[0] == "steps"}


def _values(definition: Mapping, context: dict, wanted) -> dict[str, Any]:
    values = {}
    for name, template in declared(definition).items():
        if not wanted(steps_read(template)):
            continue
        try:
            values[name] = render(template, context, field=f"attributes.{name}")
        except StepError:
            continue  # it reads what is not there (a field the output lacks, a skipped step's): left unset
    return values


def values_at_creation(definition: Mapping, input: Any, steps: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The attributes a new run has at once: those that read only its input, or steps it starts with (a fork's
    reused steps: {step id: output})."""
    done = dict(steps or {})
    context = {"input": input, "steps": {sid: {"output": output} for sid, output in done.items()}}
    return _values(definition, context, lambda reads: reads <= done.keys())


def values_after_step(definition: Mapping, step_id: str, context: dict) -> dict[str, Any]:
    """The attributes that read this step, rendered once it has ended (context: the walk's {input, steps})."""
    return _values(definition, context, lambda reads: step_id in reads)


def reads_steps(definition: Mapping) -> set[str]:
    """Every step some attribute of the definition reads: the walk looks for no others."""
    return {sid for template in declared(definition).values() for sid in steps_read(template)}


def _rows(found: Iterable[tuple[Any, datetime, Mapping[str, Any]]]) -> list[RunAttribute]:
    return [
        RunAttribute(run_id=run_id, name=name, value=value, text=text_of(value), created_at=created_at)
        for run_id, created_at, values in found
        for name, value in values.items()
    ]


def attributes_add(found: Iterable[tuple[Any, datetime, Mapping[str, Any]]]) -> None:
    """New runs' attributes: (run_id, created_at, {name: value}) each, in the caller's transaction (one statement)."""
    rows = _rows(found)
    if rows:
        RunAttribute.objects.bulk_create(rows)


# attributes_part's INSERT: the rows as one JSON text of records (the same statement for any number of them).
_PART = (
    "INSERT INTO run_attributes (run_id, name, value, text, created_at) "
    "SELECT t.run_id, t.name, t.value, t.text, t.created_at FROM jsonb_to_recordset(%s::jsonb) AS t(run_id uuid, "
    "name text, value jsonb, text text, created_at timestamptz)"
)


def attributes_part(found: Iterable[tuple[Any, datetime, Mapping[str, Any]]]) -> tuple[str, list] | None:
    """attributes_add's rows as an INSERT (sql, params) for Postgres, a part of the statement that inserts the runs
    (runs.services.ingest); None when they have none. Values go escaped, as the JSON column stores them."""
    records = [
        {
            "run_id": str(row.run_id),
            "name": row.name,
            "value": escape(row.value),
            "text": row.text,
            "created_at": row.created_at.isoformat(),
        }
        for row in _rows(found)
    ]
    return (_PART, [json.dumps(records, cls=StorableJSONEncoder)]) if records else None


def attributes_set(*, run_id: Any, created_at: datetime, values: Mapping[str, Any]) -> None:
    """Set (or set again) attributes of a run, in the caller's transaction: the walk's, with the step they read."""
    RunAttribute.objects.bulk_create(
        _rows([(run_id, created_at, values)]),
        update_conflicts=True,
        unique_fields=["run", "name"],
        update_fields=["value", "text"],
    )


def attributes_of(run_ids: Iterable[Any]) -> dict[Any, dict[str, Any]]:
    """{run id: {name: value}} of these runs, names in order: one read (the primary key's run prefix)."""
    found: dict[Any, dict[str, Any]] = {}
    for row in RunAttribute.objects.filter(run_id__in=list(run_ids)).order_by("run_id", "name"):
        found.setdefault(row.run_id, {})[row.name] = row.value
    return found


# --- filtering by them ---------------------------------------------------------------------------------


def filter_value(name: str, value: Any, *, field: str) -> str:
    """The text an attr.NAME filter compares; InvalidFilter naming the field when the name or value is bad."""
    if not ATTRIBUTE_NAME_RE.match(name):
        raise InvalidFilter(
            f"{field}: an attribute's name is 1-40 characters of a-z 0-9 _, starting with a letter",
            code="invalid_filter",
        )
    if isinstance(value, (dict, list)) or value is None:
        raise InvalidFilter(f"{field}: give the value as text, a number or a boolean", code="invalid_filter")
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        raise InvalidFilter(f"{field}: a number JSON can carry", code="invalid_filter")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        raise InvalidFilter(f"{field}: at most {MAX_TEXT} characters", code="invalid_filter")
    return text_of(value)


def filters_of(params: Iterable[tuple[str, Any]], *, prefix: str = "") -> dict[str, str]:
    """The attr.NAME=VALUE pairs among params (a query string's, a saved filter's) as {name: text}; others are
    left alone. InvalidFilter names the first bad one (prefix: where it sits, e.g. "filter.")."""
    found: dict[str, str] = {}
    for key, value in params:
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX) :]
        found[name] = filter_value(name, value, field=f"{prefix}{key}")
    if len(found) > MAX_FILTERS:
        raise InvalidFilter(f"{prefix}attr: at most {MAX_FILTERS} attribute filters", code="invalid_filter")
    return found


def _rarest(wanted: dict[str, str]) -> str:
    """Of several filters, the name whose value fewest runs have (counted up to RARE_ENOUGH each, one read)."""
    if len(wanted) == 1:
        return next(iter(wanted))
    count = (
        f"(SELECT count(*) FROM (SELECT 1 FROM {RunAttribute._meta.db_table} WHERE name = %s AND text = %s "
        f"LIMIT {RARE_ENOUGH}) AS t)"
    )
    names = list(wanted)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join([count] * len(names)), [p for n in names for p in (n, wanted[n])])
        counts = cursor.fetchone()
    return min(zip(counts, range(len(names)), names, strict=True))[2]


def narrowed[Runs: QuerySet](qs: Runs, wanted: dict[str, str], *, after: tuple[datetime, Any] | None = None) -> Runs:
    """qs joined to the runs of the rarest filter's value (one join: (run, name) is the key, so no run twice), the
    others as a look each by the key; a list orders by ORDER. after: a cursor's (created_at, id), said on the
    attribute's created_at too, where the walk starts."""
    walked = _rarest(wanted)
    where = Q(attributes__name=walked, attributes__text=wanted[walked])
    if after is not None:
        created_at, run_id = after
        at = "attributes__created_at"
        where &= Q(**{f"{at}__lte": created_at}) & (
            Q(**{f"{at}__lt": created_at}) | Q(**{at: created_at, "id__lt": run_id})
        )
    qs = qs.filter(where)  # one filter call: Django joins a many-valued relation again at each call
    for name, text in wanted.items():
        if name != walked:
            qs = qs.filter(Exists(RunAttribute.objects.filter(run_id=OuterRef("pk"), name=name, text=text)))
    return qs


# The list's order for a narrowed query, created_at said on the attribute's column (the run's own): the planner walks
# that value's range of the filter index newest first and stops at the page's end (as runs.input_terms.ORDER).
ORDER = ("-attributes__created_at", "-id")


# The names some run has with a text: a skip over the filter index's leading column (one probe a name: a workflow
# declares at most MAX_ATTRIBUTES, so the names are few), then a look of (name, text) each.
_NAMES_WITH_TEXT = f"""
WITH RECURSIVE names(name) AS (
    SELECT min(name) FROM {RunAttribute._meta.db_table}
    UNION ALL
    SELECT (SELECT min(a.name) FROM {RunAttribute._meta.db_table} a WHERE a.name > n.name)
    FROM names n WHERE n.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL
AND EXISTS (SELECT 1 FROM {RunAttribute._meta.db_table} a WHERE a.name = names.name AND a.text = %s)
"""


def names_with_text(text: str) -> list[str]:
    """The attribute names that some run has with this text (the search box), by name."""
    with connection.cursor() as cursor:
        cursor.execute(_NAMES_WITH_TEXT, [text_of(text)])
        return [row[0] for row in cursor.fetchall()]


def with_text(text: str, names: list[str]) -> QuerySet:
    """The run ids with one of these attributes of this text: the filter index, a range a name."""
    return RunAttribute.objects.filter(name__in=names, text=text_of(text)).values("run_id")
