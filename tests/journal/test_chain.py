"""The journal's hash chain, and pal_verify catching rows changed behind the application's back.

Every tamper here is raw SQL on journal_events (or runs), never the application's code: an edited payload, a
deleted middle row, rows cut off the end, a forged row (made up, or with a correctly computed hash), two rows
swapped. pal_verify must exit 1 and name the first seq that does not hold.
"""

import io
import itertools
import json
import uuid
from datetime import UTC

import pytest
from django.core.management import call_command
from django.db import connection

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.services import GENESIS, event_append, row_hash
from runs.models import Run
from tests.helpers import drive_to_end, echo_step, make_run

pytestmark = pytest.mark.django_db


# --- helpers: tampering and verifying -------------------------------------------------------------


def finished_run(steps: int = 3) -> Run:
    run = make_run(steps=[echo_step(f"s{n}", n=n) for n in range(1, steps + 1)])
    drive_to_end(run)
    assert run.status == "succeeded"
    return run


def db_id(run_id):
    return run_id if connection.vendor == "postgresql" else uuid.UUID(str(run_id)).hex


def sql(statement: str, *params):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def jsonb() -> str:
    return "::jsonb" if connection.vendor == "postgresql" else ""


def last_seq(run) -> int:
    return JournalEvent.objects.filter(run_id=run.id).order_by("-seq").values_list("seq", flat=True).first()


def verify(*args) -> tuple[int, str]:
    """Run pal_verify; return (exit code, everything it wrote)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("pal_verify", *[str(a) for a in args], stdout=out, stderr=err)
    except SystemExit as exc:
        return exc.code, out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


def forge(run, seq: int, *, prev_hash: str, kind: str = "step_completed", payload=None, digest: str | None = None):
    """Insert a row by hand; its hash computed as the application would unless `digest` is given."""
    from django.utils import timezone

    now = timezone.now()
    payload = {"output": {"forged": True}} if payload is None else payload
    digest = digest or row_hash(
        prev_hash=prev_hash,
        run_id=run.id,
        seq=seq,
        kind=kind,
        step_id="s1",
        attempt=1,
        payload=payload,
        created_at=now,
        writer="mallory",
        epoch=None,
    )
    sql(
        "INSERT INTO journal_events (run_id, seq, kind, step_id, attempt, payload, created_at, writer, epoch, "
        f"prev_hash, hash) VALUES (%s, %s, %s, %s, %s, %s{jsonb()}, %s, %s, %s, %s, %s)",
        db_id(run.id),
        seq,
        kind,
        "s1",
        1,
        json.dumps(payload),
        now,
        "mallory",
        None,
        prev_hash,
        digest,
    )


def row(run, seq) -> JournalEvent:
    return JournalEvent.objects.get(run_id=run.id, seq=seq)


# --- the chain as the application writes it -------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {},
        {"output": {"text": 'héllo ✓ \u2028 "quoted"', "n": 1.5e-05, "big": 2**70, "list": [1, None, True]}},
        {"z": 1, "a": {"y": [], "b": "x"}},
        {"at": "2026-01-01T00:00:00Z", "ms": 812.345},
    ],
)
def test_the_row_hash_is_sha256_of_the_previous_hash_and_the_rows_canonical_json(payload):
    import hashlib
    from datetime import datetime

    from journal.services import dumps

    run_id, at = uuid.uuid4(), datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=UTC)
    content = dumps(
        [
            str(run_id),
            7,
            "step_completed",
            "draft",
            2,
            payload if payload is not None else {},
            "2026-11-30T01:02:03.456789+00:00",
            "host:1:abc",
            3,
        ]
    )
    expected = hashlib.sha256(f"{'a' * 64}\n{content}".encode()).hexdigest()
    args = dict(
        prev_hash="a" * 64,
        seq=7,
        kind="step_completed",
        step_id="draft",
        attempt=2,
        payload=payload,
        created_at=at,
        writer="host:1:abc",
        epoch=3,
    )
    assert row_hash(run_id=run_id, **args) == expected
    assert row_hash(run_id=str(run_id), payload_json=dumps(payload), **args) == expected
    assert row_hash(run_id=run_id, **{**args, "step_id": None, "attempt": None, "epoch": None}) != expected


def test_each_row_hashes_its_content_and_the_previous_rows_hash():
    run = finished_run()
    rows = list(JournalEvent.objects.filter(run_id=run.id).order_by("seq"))
    assert rows[0].prev_hash == GENESIS
    for before, after in itertools.pairwise(rows):
        assert after.prev_hash == before.hash
    report = chain_verify(run_id=run.id)
    assert (
        report.ok and report.count == len(rows) and (report.head_seq, report.head_hash) == (rows[-1].seq, rows[-1].hash)
    )


def test_a_run_that_ends_records_its_journal_head_on_its_row():
    run = finished_run()
    last = row(run, last_seq(run))
    assert last.kind == "run_succeeded"
    assert (run.journal_head_seq, run.journal_head_hash) == (last.seq, last.hash)


def test_a_failed_and_a_cancelled_run_record_their_heads_too():
    from runs.services import run_cancel
    from tests.helpers import tool_step

    failed = make_run(steps=[tool_step("no", "test_fail")])
    drive_to_end(failed)
    cancelled = make_run(steps=[{"id": "wait", "kind": "approval", "prompt": "ok?"}])
    drive_to_end(cancelled)
    run_cancel(run_id=cancelled.id, by="alice", reason="not needed")
    for run, kind in ((failed, "run_failed"), (cancelled, "run_cancelled")):
        run.refresh_from_db()
        last = row(run, last_seq(run))
        assert last.kind == kind and (run.journal_head_seq, run.journal_head_hash) == (last.seq, last.hash)


def test_an_untouched_run_verifies():
    run = finished_run()
    code, output = verify(run.id)
    assert code == 0, output
    assert output.startswith(f"OK run {run.id}") and output.count("\n") == 1


def test_an_event_added_after_the_end_moves_the_recorded_head():
    from runs.services import run_event_append

    run = finished_run()
    seq = run_event_append(run_id=run.id, kind="anomaly_detected", step_id=None, payload={"x": 1}, by="otto")
    run.refresh_from_db()
    assert (run.journal_head_seq, run.journal_head_hash) == (seq, row(run, seq).hash)
    assert verify(run.id)[0] == 0


# --- tampering -------------------------------------------------------------------------------------


def test_an_edited_payload_is_caught_at_its_seq():
    run = finished_run()
    sql(
        f"UPDATE journal_events SET payload = %s{jsonb()} WHERE run_id = %s AND seq = %s",
        json.dumps({"output": {"n": 999}, "ms": 1.0}),
        db_id(run.id),
        5,
    )
    assert chain_verify(run_id=run.id).first_bad_seq == 5
    code, output = verify(run.id)
    assert code == 1 and "seq 5 was changed" in output


def test_an_edited_writer_or_time_is_caught_too():
    run = finished_run()
    sql("UPDATE journal_events SET writer = 'someone-else' WHERE run_id = %s AND seq = %s", db_id(run.id), 3)
    code, output = verify(run.id)
    assert code == 1 and "seq 3 was changed" in output


def test_a_deleted_middle_row_is_caught_at_its_seq():
    run = finished_run()
    sql("DELETE FROM journal_events WHERE run_id = %s AND seq = %s", db_id(run.id), 4)
    code, output = verify(run.id)
    assert code == 1 and "seq 4 is missing" in output


def test_the_last_row_deleted_is_caught_by_the_recorded_head():
    run = finished_run()
    end = last_seq(run)
    sql("DELETE FROM journal_events WHERE run_id = %s AND seq = %s", db_id(run.id), end)
    assert chain_verify(run_id=run.id).ok  # what is left still chains: only the recorded head can tell
    code, output = verify(run.id)
    assert code == 1 and f"seq {end} is missing" in output


def test_several_rows_cut_off_the_end_are_caught_at_the_first_of_them():
    run = finished_run()
    end = last_seq(run)
    sql("DELETE FROM journal_events WHERE run_id = %s AND seq > %s", db_id(run.id), end - 3)
    code, output = verify(run.id)
    assert code == 1 and f"seq {end - 2} is missing" in output


def test_a_forged_row_with_a_made_up_hash_is_caught_at_its_seq():
    run = finished_run()
    end = last_seq(run)
    forge(run, end + 1, prev_hash=row(run, end).hash, digest="f" * 64)
    code, output = verify(run.id)
    assert code == 1 and f"seq {end + 1} was changed" in output


def test_a_forged_row_with_a_correct_hash_after_the_end_is_caught_by_the_recorded_head():
    run = finished_run()
    end = last_seq(run)
    forge(run, end + 1, prev_hash=row(run, end).hash)
    assert chain_verify(run_id=run.id).ok  # it chains: anyone can compute sha256
    code, output = verify(run.id)
    assert code == 1 and f"seq {end + 1} follows the recorded head" in output


def test_a_forged_row_slipped_into_the_middle_breaks_the_chain_at_the_row_after_it():
    run = finished_run()
    # Make room at seq 4 (move 4.. up by one), then insert a row that links to seq 3 correctly.
    sql("UPDATE journal_events SET seq = seq + 1000 WHERE run_id = %s AND seq >= 4", db_id(run.id))
    sql("UPDATE journal_events SET seq = seq - 999 WHERE run_id = %s AND seq >= 1004", db_id(run.id))
    forge(run, 4, prev_hash=row(run, 3).hash)
    code, output = verify(run.id)
    # The forged row itself chains; the first row that does not is the one it pushed along.
    assert code == 1 and "seq 5 does not follow seq 4" in output


def test_two_rows_swapped_are_caught_at_the_first_of_them():
    run = finished_run()
    sql("UPDATE journal_events SET seq = 1000 WHERE run_id = %s AND seq = 3", db_id(run.id))
    sql("UPDATE journal_events SET seq = 3 WHERE run_id = %s AND seq = 4", db_id(run.id))
    sql("UPDATE journal_events SET seq = 4 WHERE run_id = %s AND seq = 1000", db_id(run.id))
    code, output = verify(run.id)
    assert code == 1 and "seq 3 does not follow seq 2" in output


def test_a_recorded_head_removed_from_an_ended_run_is_caught():
    run = finished_run()
    sql("UPDATE runs SET journal_head_seq = NULL, journal_head_hash = '' WHERE id = %s", db_id(run.id))
    code, output = verify(run.id)
    assert code == 1 and "records no journal head" in output


def test_a_run_row_whose_status_disagrees_with_its_journal_is_caught():
    from tests.helpers import tool_step

    run = make_run(steps=[tool_step("no", "test_fail")])
    drive_to_end(run)
    sql("UPDATE runs SET status = 'succeeded' WHERE id = %s", db_id(run.id))
    code, output = verify(run.id)
    assert code == 1 and "the run row says succeeded but its journal says failed" in output
    assert f"seq {last_seq(run)}" in output


def test_a_run_row_whose_output_was_changed_is_caught():
    run = finished_run()
    sql(f"UPDATE runs SET output = %s{jsonb()} WHERE id = %s", json.dumps({"n": 42}), db_id(run.id))
    code, output = verify(run.id)
    assert code == 1 and f"output journaled at seq {last_seq(run)}" in output


def test_a_tampered_child_journal_is_caught_from_its_root():
    from tests.helpers import make_workflow

    make_workflow(name="leaf", steps=[echo_step("look", q=1), echo_step("more", q=2)])
    run = make_run(steps=[{"id": "sub", "kind": "child_run", "workflow": "leaf", "input": {}}])
    drive_to_end(run)
    child = Run.objects.get(parent_run=run)
    sql("DELETE FROM journal_events WHERE run_id = %s AND seq = %s", db_id(child.id), 3)
    code, output = verify(run.id)
    assert code == 1 and f"run {child.id} (in the tree of {run.id}): seq 3 is missing" in output


def test_a_run_still_going_verifies_its_chain_and_says_its_end_is_not_recorded_yet():
    run = make_run(steps=[{"id": "wait", "kind": "approval", "prompt": "ok?"}])
    drive_to_end(run)  # parks on the approval
    code, output = verify(run.id)
    assert code == 0 and "has not ended" in output
    sql("DELETE FROM journal_events WHERE run_id = %s AND seq = %s", db_id(run.id), 2)
    code, output = verify(run.id)
    assert code == 1 and "seq 2 is missing" in output


def test_a_retried_run_may_go_on_past_the_head_it_recorded_when_it_failed():
    from runs.services import run_retry
    from tests.helpers import tool_step

    run = make_run(steps=[tool_step("flaky", "test_fail_before", {"succeed_on": 2})])
    drive_to_end(run)
    failed_head = (Run.objects.get(id=run.id).journal_head_seq, Run.objects.get(id=run.id).journal_head_hash)
    run_retry(run_id=run.id, by="otto", reason="try again")
    assert verify(run.id)[0] == 0  # running again: the old head must still be in the chain, rows may follow
    drive_to_end(run)
    assert run.status == "succeeded" and run.journal_head_seq > failed_head[0]
    assert verify(run.id)[0] == 0


# --- clear errors ---------------------------------------------------------------------------------


def test_an_unknown_run_id_is_a_clear_error():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="does not exist"):
        call_command("pal_verify", str(uuid.uuid4()))
    with pytest.raises(CommandError, match="not a run id"):
        call_command("pal_verify", "nope")


def test_appends_on_an_empty_journal_start_from_the_genesis_hash():
    run_id = uuid.uuid4()
    event_append(run_id=run_id, kind="note")
    first = JournalEvent.objects.get(run_id=run_id, seq=1)
    assert first.prev_hash == GENESIS and chain_verify(run_id=run_id, expect_head=(1, first.hash)).ok
