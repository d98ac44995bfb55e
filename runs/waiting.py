"""A waiting run's waits, every one of them. A graph's run waits only when none of its branches can move, and then it
may wait on several things at once (runs.walk.walk.Walk.go_waiting): waiting_on is the first wait, with all of them
under waiting_on["waits"] (a wait on a child put first). Whatever reads a run's waits reads them all here: the
approvals pending on the run page and /ops/ (one form each, each decided on its own by
runs.services.approval_decide) and the sweep's rule for a parent parked on a child that moved (runs.selectors).
"""

import re
from dataclasses import dataclass
from typing import Any

from django.db.models import BooleanField, F, Func, TextField, Value
from django.db.models.functions import Cast

from .models import Run, RunStatus

_KEY = re.compile(r"^[a-z_]{1,32}$")


def waits_of(waiting_on: Any) -> list[dict]:
    """Every wait in a run's waiting_on: its "waits" when it lists several, else the one wait (none for no dict)."""
    if not isinstance(waiting_on, dict):
        return []
    waits = [wait for wait in waiting_on.get("waits") or [] if isinstance(wait, dict)]
    return waits or [waiting_on]


class WaitsInclude(Func):
    """True where a JSON column's "waits" (waiting_on of a run waiting on several things) lists a wait with these
    keys and values; a value is a constant or a column of the row (an F, an expression). The same rule as jsonb @>:
    Postgres asks `waits @> [{...}]`, SQLite its pal_json_contains (runs.search). A single wait has no "waits":
    callers match it on waiting_on's own keys beside this."""

    output_field = BooleanField()

    def __init__(self, column: str, **probe: Any):
        for key in probe:
            assert _KEY.match(key), f"a wait's key is a plain name, not {key!r}"  # written into the SQL as it is
        self.keys = list(probe)
        values = [value if hasattr(value, "resolve_expression") else _text(value) for value in probe.values()]
        super().__init__(F(column), *values)

    def _parts(self, compiler, connection) -> tuple[str, str, list]:
        (column, column_params), *values = [compiler.compile(e) for e in self.get_source_expressions()]
        pairs = ", ".join(f"'{key}', {sql}" for key, (sql, _params) in zip(self.keys, values, strict=True))
        return column, pairs, [*column_params, *(p for _sql, params in values for p in params)]

    def as_postgresql(self, compiler, connection, **extra):
        column, pairs, params = self._parts(compiler, connection)
        return f"(({column} -> 'waits') @> jsonb_build_array(jsonb_build_object({pairs})))", params

    def as_sqlite(self, compiler, connection, **extra):
        column, pairs, params = self._parts(compiler, connection)
        return f"pal_json_contains(json_extract({column}, '$.waits'), json_array(json_object({pairs})))", params


def _text(value: Any) -> Cast:
    """A constant of a probe, as typed text: jsonb_build_object refuses an untyped parameter (psycopg binds on the
    server). A number is matched on a column, whose type the database knows."""
    assert isinstance(value, str), f"a wait's constant is text, not {value!r}"
    return Cast(Value(value), output_field=TextField())


@dataclass(frozen=True)
class PendingApproval:
    """One approval a waiting run waits on: the run, the approval's own wait (step_id, attempt, prompt) and the id of
    its row on /ops/ (an htmx target)."""

    run: Run
    wait: dict
    row_id: str

    @property
    def step_id(self) -> str:
        return self.wait.get("step_id") or ""


def approval_row_id(run: Run, step_id: str) -> str:
    """The id of an approval's row on /ops/: `approval-{run}` for the run's first wait (a run waiting on one
    approval kept the id it always had), `approval-{run}-{step}` for another, an item's "[3]" as "-I3" (letters no
    step id has, and no CSS selector needs escaped)."""
    first = waits_of(run.waiting_on)[:1]
    if first and first[0].get("step_id") == step_id:
        return f"approval-{run.id}"
    step_id = re.sub(r"\[(\d+)\.(\d+)\]", r"-T\1-\2", step_id)  # an agent loop's tool call "[2.1]": "-T2-1"
    return f"approval-{run.id}-" + re.sub(r"\[(\d+)\]", r"-I\1", step_id)


def approvals_of(run: Run) -> list[PendingApproval]:
    """The approvals a waiting run waits on itself, in the order it lists them. (A parent waiting on a child that
    waits on an approval waits on a child: the approval is the child's.)"""
    if run.status != RunStatus.WAITING:
        return []
    return [
        PendingApproval(run=run, wait=wait, row_id=approval_row_id(run, wait.get("step_id") or ""))
        for wait in waits_of(run.waiting_on)
        if wait.get("kind") == "approval"
    ]


_ROW_ID = re.compile(r"^approval-[0-9a-f-]{32,36}(-[A-Za-z0-9_-]{1,80})?$")


def approval_row(run: Run, *, step_id: str, target: str) -> PendingApproval:
    """The row of /ops/ that an operator decided from, drawn again after the decision (the run read anew): the same
    id as the row it replaces (`target`, when it is one), and the approval's wait while the run still waits on it
    (a refused decision shows its form again), else what the operator decided on."""
    wait = next((item.wait for item in approvals_of(run) if item.step_id == step_id), None)
    return PendingApproval(
        run=run,
        wait=wait or {"kind": "approval", "step_id": step_id},
        row_id=target if _ROW_ID.match(target) else approval_row_id(run, step_id),
    )
