"""An index of runs by the top-level members of their input, so that the first page of an `input` containment
filter costs the page, not the number of matches (the GIN index finds a rare value's runs but cannot give them
newest first: docs/PERFORMANCE-code.md)."""

# Each top-level member whose value is a text of at most MAX_TEXT characters, a whole number or a boolean becomes a
# term: the first 8 bytes of md5(key, U+0001, a type letter, the value as text) as a signed bigint. run_input_terms
# holds (term, created_at, run_id), its primary key in that order, so a term's runs are one ordered range of an
# index, newest first. A probe's members of those kinds name terms every matching run has (a run contains
# {"customer": "c42"} only if its own top-level customer is that text), so the list joins them, in the list's order,
# and still checks `input @> probe`: a hash collision or a member the terms do not cover (an object, a list, a long
# text, a fraction, null) only widens what the check reads. A probe with no such member is answered by the GIN
# index alone, as before.
#
# The terms are computed in Python when a run is created (input_terms_add, in the run's transaction) and in SQL by
# TERMS_SQL (the migration that filled them for existing runs, the bench's fill); the two agree value for value
# (tests/runs/test_input_terms.py checks it on Postgres). Text Postgres cannot store as it came (runs' input holds
# it escaped: journal.text) and keys or values that begin like an escape are left out on both sides, so the stored
# form and the probe never disagree.

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet

from journal.text import escape_text

from .models import RunInputTerm

MAX_TEXT = 200  # characters of a text value that makes a term; longer ones are left to the GIN index
MAX_PROBE_TERMS = 4  # terms of one probe weighed for the walk
RARE_ENOUGH = 1000  # rows of a term counted when weighing it
_BOUND = 2**63  # whole numbers that fit a bigint on both sides; larger ones are left out


def _value_text(value: Any) -> str | None:
    """The typed text of a member's value, or None when it makes no term. jsonb's equality decides: 1 and 1.0
    are the same number, so a whole number is written without a fraction whichever way it came."""
    if isinstance(value, bool):
        return "btrue" if value else "bfalse"
    if isinstance(value, int):
        return f"n{value}" if -_BOUND < value < _BOUND else None
    if isinstance(value, float):
        return f"n{int(value)}" if value.is_integer() and -_BOUND < value < _BOUND else None
    if isinstance(value, str):
        return f"s{value}" if len(value) <= MAX_TEXT and escape_text(value) == value else None
    return None


def term_of(key: Any, value: Any) -> int | None:
    """The term of one top-level member, or None when the member makes none."""
    if not isinstance(key, str) or escape_text(key) != key:
        return None
    text = _value_text(value)
    if text is None:
        return None
    digest = hashlib.md5(f"{key}\x01{text}".encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def terms_of(input: Any) -> list[int]:
    """The distinct terms of an input (or a probe), in the order of its members."""
    if not isinstance(input, dict):
        return []
    found = (term_of(key, value) for key, value in input.items())
    return list(dict.fromkeys(term for term in found if term is not None))


def input_terms_add(rows: Iterable[tuple[Any, datetime, Any]]) -> None:
    """Index new runs: rows of (run_id, created_at, input), in the caller's transaction (one statement)."""
    terms = [
        RunInputTerm(term=term, created_at=created_at, run_id=run_id)
        for run_id, created_at, input in rows
        for term in terms_of(input)
    ]
    if terms:
        RunInputTerm.objects.bulk_create(terms)


# input_terms_part's INSERT: the terms as one JSON text of records (the same statement for any number).
_TERMS_PART = (
    "INSERT INTO run_input_terms (term, created_at, run_id) "
    "SELECT t.term, t.created_at, t.run_id FROM jsonb_to_recordset(%s::jsonb) AS t(term bigint, created_at "
    "timestamptz, run_id uuid)"
)


def input_terms_part(rows: Iterable[tuple[Any, datetime, Any]]) -> tuple[str, list] | None:
    """input_terms_add's rows as an INSERT (sql, params) for Postgres, to run as a part of the statement that
    inserts the runs (runs.services.ingest._runs_insert); None when the inputs have no term. A timestamp goes as its ISO
    text, to the microsecond with its offset, which timestamptz reads back the same."""
    records = [
        {"term": term, "created_at": created_at.isoformat(), "run_id": str(run_id)}
        for run_id, created_at, input in rows
        for term in terms_of(input)
    ]
    return (_TERMS_PART, [json.dumps(records)]) if records else None


def _rarest(terms: list[int]) -> int:
    """Of a probe's terms, the one fewest runs have (counted up to RARE_ENOUGH each, in one read of the index):
    its range is the walk's, the others are left to the containment check."""
    if len(terms) == 1:
        return terms[0]
    count = f"(SELECT count(*) FROM (SELECT 1 FROM run_input_terms WHERE term = %s LIMIT {RARE_ENOUGH}) AS t)"
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join([count] * len(terms)), terms)
        counts = cursor.fetchone()
    return min(zip(counts, range(len(terms)), terms, strict=True))[2]


def narrowed[Runs: QuerySet](qs: Runs, probe: dict, *, after: tuple[datetime, Any] | None = None) -> Runs:
    """qs joined to the rarest term of the probe (one join, on the run), or qs itself when the probe has no term.
    The caller still filters `input @> probe` (runs.search.input_contains with indexed=False) and a list orders
    by ORDER. after: a cursor's (created_at, id), said on the term's created_at too, where the walk starts."""
    # indexed=False: beside a term, the GIN index only misleads the planner, whose estimate of a containment's
    # matches is a guess. `after` on the term too: the planner does not carry a range from the run's created_at to
    # the term's. One filter call: Django joins a many-valued relation again at each call.
    terms = terms_of(probe)[:MAX_PROBE_TERMS]
    if not terms:
        return qs
    where = Q(input_terms__term=_rarest(terms))
    if after is not None:
        created_at, run_id = after
        at = "input_terms__created_at"
        where &= Q(**{f"{at}__lte": created_at}) & (
            Q(**{f"{at}__lt": created_at}) | Q(**{at: created_at, "id__lt": run_id})
        )
    return qs.filter(where)


# The list's order (created_at, id, newest first) for a narrowed query, created_at said on the term's column,
# which holds the run's own (the run's id is the term's run_id by the join): so the planner walks that term's
# range of the primary key newest first and stops at the page's end, where ordered by the run's columns it
# fetched every match and sorted them.
ORDER = ("-input_terms__created_at", "-id")


# The same terms in SQL, over a row source with columns id, created_at and input (`{source}`: a table or a
# parenthesised SELECT with an alias r). U+E000 'pal-escaped:' begins an escaped text (journal.text.ESCAPED).
TERMS_SQL = """
SELECT DISTINCT ('x' || left(md5(m.key || chr(1) || m.text), 16))::bit(64)::bigint AS term, r.created_at, r.id
FROM {source} CROSS JOIN LATERAL (
    SELECT e.key, CASE jsonb_typeof(e.value)
        WHEN 'boolean' THEN 'b' || (e.value #>> '{}')
        WHEN 'string' THEN CASE WHEN length(e.value #>> '{}') <= {max_text}
                                 AND NOT starts_with(e.value #>> '{}', chr(57344) || 'pal-escaped:')
                                THEN 's' || (e.value #>> '{}') END
        WHEN 'number' THEN CASE WHEN e.value::numeric = trunc(e.value::numeric)
                                 AND abs(e.value::numeric) < 9223372036854775808
                                THEN 'n' || trunc(e.value::numeric)::text END
    END AS text
    FROM jsonb_each(CASE WHEN jsonb_typeof(r.input) = 'object' THEN r.input ELSE '{}'::jsonb END) AS e
    WHERE NOT starts_with(e.key, chr(57344) || 'pal-escaped:')
) AS m
WHERE m.text IS NOT NULL
"""


def terms_sql(source: str = "runs r") -> str:
    """INSERT ... SELECT of the terms of the rows of `source` (runs already indexed are the caller's to leave out)."""
    select = TERMS_SQL.replace("{source}", source).replace("{max_text}", str(MAX_TEXT))
    return "INSERT INTO run_input_terms (term, created_at, run_id)" + select
