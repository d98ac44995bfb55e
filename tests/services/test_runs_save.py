"""The runs' INSERT of runs.services.ingest._runs_insert (issue 15 section 1): on Postgres one prebuilt statement
instead of bulk_create. Its rows must be the rows bulk_create writes, column for column, JSON encoded by each field's
encoder, and the objects must come back saved, as bulk_create leaves them."""

import json
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runs.models import Run, RunStatus
from runs.services.ingest import _runs_save
from tests.helpers import echo_step, make_run, make_workflow

pytestmark = pytest.mark.django_db

STAMPS = ("created_at", "updated_at")


def _row(run_id) -> dict:
    """The row as the database holds it, every column (JSON as the database gives its text)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT to_jsonb(r)::text FROM runs r WHERE id = %s", [run_id])
        else:
            cursor.execute("SELECT * FROM runs WHERE id = %s", [uuid.UUID(str(run_id)).hex])
        if connection.vendor == "postgresql":
            return json.loads(cursor.fetchone()[0])
        names = [column[0] for column in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def test_a_prebuilt_insert_writes_the_row_bulk_create_writes_column_for_column():
    workflow = make_workflow(steps=[echo_step("only")])
    parent = make_run(workflow=workflow)
    when = timezone.now()
    fields = {
        "workflow": workflow,
        "status": RunStatus.RUNNING,
        "input": {"text": "naïve ✓", "n": 1.5, "big": 10**20, "deep": {"list": [1, None, "x", True]}, "": 0},
        "output": None,
        "error": {"code": "x", "why": "a NUL \x00 and a lone \udc80"},  # a peer's text: the encoder escapes it
        "parent_run": parent,
        "parent_step_id": "step[3]",
        "parent_attempt": 2,
        "forked_from_id": parent.id,
        "depth": 1,
        "trigger_meta": {"trace_id": "abc"},
        "request_hash": "h" * 64,
        "waiting_on": ["a", {"b": 2}],
        "wake_at": when,
        "created_by": "otto",
        "started_at": when,
        "journal_head_seq": 7,
        "journal_head_hash": "f" * 64,
        "concurrency_key": "group:1",
    }
    # Twins but for the attempt: a parent's step attempt has one child (a unique constraint).
    by_orm, prebuilt = Run(**fields), Run(**{**fields, "parent_attempt": 3})

    Run.objects.bulk_create([by_orm])
    _runs_save([prebuilt])

    expected, written = _row(by_orm.id), _row(prebuilt.id)
    for column in ("id", *STAMPS):
        expected.pop(column), written.pop(column)
    assert (expected.pop("parent_attempt"), written.pop("parent_attempt")) == (2, 3)
    assert written == expected
    again = Run.objects.get(id=prebuilt.id)
    assert again.error == fields["error"] and again.input == fields["input"]  # read back as it came
    assert again.created_at == prebuilt.created_at and again.updated_at == prebuilt.updated_at  # to the microsecond
    assert again.created_at >= when


def test_the_saved_runs_are_stamped_in_order_and_behave_as_saved_objects():
    workflow = make_workflow(steps=[echo_step("only")])
    runs = [Run(workflow=workflow, input={"n": n}) for n in range(5)]

    _runs_save(runs)

    stamps = [run.created_at for run in runs]
    assert stamps == sorted(stamps) and all(stamp is not None for stamp in stamps)
    assert [r.created_at for r in Run.objects.filter(workflow=workflow).order_by("created_at", "input__n")] == stamps
    assert not runs[0]._state.adding
    runs[0].created_by = "changed"
    runs[0].save(update_fields=["created_by"])  # an UPDATE of the row, not a second INSERT
    assert Run.objects.get(id=runs[0].id).created_by == "changed"


def test_a_key_already_taken_refuses_the_whole_insert_with_an_integrity_error():
    workflow = make_workflow(steps=[echo_step("only")])
    Run.objects.create(workflow=workflow, idempotency_key="taken")

    with pytest.raises(IntegrityError), transaction.atomic():
        _runs_save([Run(workflow=workflow, idempotency_key="free"), Run(workflow=workflow, idempotency_key="taken")])
    assert not Run.objects.filter(idempotency_key="free").exists()
