"""Indexes for the run list's search filters (runs.search), each ordered newest first like the list, so the first
page of a filter reads a few index entries however many runs there are.

Postgres: a GIN index (jsonb_path_ops: containment only, smaller than the default) for `input @> probe`, and an
expression index on `error ->> 'code'` over the runs that have one, with statistics on that expression. Built CONCURRENTLY (so the migration does not
block writes to a big runs table: the migration is not atomic). SQLite, which has no GIN: the error code's index
alone (json_extract, as runs.search.JsonKeyText writes it); containment there scans, as the embedded database
may. The model does not declare them (a GIN index on SQLite, and the SQL each vendor needs, are this file's).
"""

from django.db import migrations

POSTGRES = [
    (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_input_gin_idx ON runs USING gin (input jsonb_path_ops)",
        "DROP INDEX CONCURRENTLY IF EXISTS runs_input_gin_idx",
    ),
    (
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS runs_error_code_idx ON runs ((error ->> 'code'), created_at DESC, "
        "id DESC) WHERE (error ->> 'code') IS NOT NULL",
        "DROP INDEX CONCURRENTLY IF EXISTS runs_error_code_idx",
    ),
    (
        # The planner ignores a partial index's statistics: without these it takes every code for a rare one and,
        # with status=failed beside it, sorts every failed run of the code instead of reading the index in order.
        "CREATE STATISTICS IF NOT EXISTS runs_error_code_stats ON ((error ->> 'code')) FROM runs",
        "DROP STATISTICS IF EXISTS runs_error_code_stats",
    ),
]
SQLITE = [
    (
        "CREATE INDEX IF NOT EXISTS runs_error_code_idx ON runs (json_extract(error, '$.code'), created_at DESC, "
        "id DESC) WHERE json_extract(error, '$.code') IS NOT NULL",
        "DROP INDEX IF EXISTS runs_error_code_idx",
    ),
]


def _statements(schema_editor, *, forward: bool) -> list[str]:
    vendor = schema_editor.connection.vendor
    pairs = POSTGRES if vendor == "postgresql" else SQLITE if vendor == "sqlite" else []
    return [create if forward else drop for create, drop in pairs]


def create(apps, schema_editor):
    for sql in _statements(schema_editor, forward=True):
        schema_editor.execute(sql)


def drop(apps, schema_editor):
    for sql in _statements(schema_editor, forward=False):
        schema_editor.execute(sql)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("runs", "0010_run_workflow_created_idx"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
