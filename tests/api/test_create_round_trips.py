"""POST /runs on Postgres outside any transaction (as the web server runs it): three round trips to Postgres, the
token, the workflow and ONE statement that writes the run, its lease booking, its input's terms and its journal's
first row (runs.services.ingest._runs_insert), with no BEGIN and no COMMIT of its own. Counted from libpq's own trace of
the connection (every message to and from the server), not from Django's log, which shows neither BEGIN nor COMMIT.
One statement is all or nothing: a key that another request took first writes nothing and answers that run."""

import tempfile

import pytest
from django.db import connection
from psycopg import pq

from journal.chain import chain_verify
from journal.models import JournalEvent
from runs import services
from runs.models import Run, RunInputTerm, RunLock
from runs.services import ingest
from runs.services import workflows as service_workflows
from tests.helpers import echo_step, make_workflow

from .conftest import Api, make_user, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _traced(call) -> tuple[object, list[str]]:
    """(call's result, the messages libpq exchanged with the server meanwhile, one a line)."""
    assert connection.vendor == "postgresql"
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            result = call()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return result, trace.read().decode().splitlines()


def _trips(said: list[str]) -> int:
    return sum("ReadyForQuery" in line for line in said)


def test_a_new_run_costs_three_round_trips_then_two_and_no_transaction_of_its_own(db):
    make_workflow(name="trips", steps=[echo_step("only")])
    api = Api(token_for(make_user("otto", "runs.view_run", "runs.operate")))
    api.get("/runs?limit=1")  # the token's first use writes last_used_at (once a minute)

    first, said_first = _traced(lambda: api.post("/runs", {"workflow": "trips"}))
    response, said = _traced(lambda: api.post("/runs", {"workflow": "trips", "input": {"tag": "naïve ✓"}}))

    assert (first.status_code, response.status_code) == (201, 201), (first.content, response.content)
    assert _trips(said_first) == 3, said_first  # the token, the workflow, the create
    assert _trips(said) == 2, said  # the token, the create (the workflow known, checked inside the statement)
    sent = [line for line in said_first + said if line.startswith("F")]
    assert not any(word in line for line in sent for word in ('"BEGIN"', '"COMMIT"', "SAVEPOINT")), sent
    run_id = response.json()["id"]
    assert RunLock.objects.get(run_id=run_id).owner == response.json()["lease"]["owner"]
    assert [e.kind for e in JournalEvent.objects.filter(run_id=run_id)] == ["run_created"]
    assert RunInputTerm.objects.filter(run_id=run_id).count() == 1
    assert chain_verify(run_id=run_id, exact=False).ok


def test_a_key_another_request_took_first_writes_nothing_and_answers_that_run(db, monkeypatch):
    make_workflow(name="raced", steps=[echo_step("only")])
    first, created = services.run_create(workflow_name="raced", input={"n": 1}, idempotency_key="k")
    assert created
    real = ingest._run_for_key
    reads = []

    def read_before_the_other_commit(key, request_hash):
        reads.append(key)
        return None if len(reads) == 1 else real(key, request_hash)  # the first read came before the other's commit

    monkeypatch.setattr(ingest, "_run_for_key", read_before_the_other_commit)
    again, created = services.run_create(workflow_name="raced", input={"n": 1}, idempotency_key="k")

    assert not created and again.id == first.id and reads == ["k", "k"]
    assert Run.objects.count() == 1 and RunLock.objects.count() == 1
    assert JournalEvent.objects.count() == 1 and RunInputTerm.objects.count() == 1
    assert not connection.in_atomic_block and connection.get_autocommit()
    with connection.cursor() as cursor:  # the connection is fine after the refused statement
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def test_a_version_posted_after_the_workflow_was_known_is_the_one_the_next_run_gets(db):
    make_workflow(name="moving", steps=[echo_step("only", said="v1")])
    api = Api(token_for(make_user("otto", "runs.view_run", "runs.operate")))
    assert api.post("/runs", {"workflow": "moving"}).json()["version"] == 1  # now known to this process
    # A new version, as another web process would post it (this one's known workflows are not told).
    make_workflow(name="moving", steps=[echo_step("only", said="v2")])

    response, said = _traced(lambda: api.post("/runs", {"workflow": "moving"}))

    assert response.status_code == 201, response.content
    assert response.json()["version"] == 2
    # The token, the create that found v1 no longer the latest and wrote nothing, the workflow's read, the create.
    assert _trips(said) == 4, said
    assert sorted(Run.objects.values_list("workflow__version", flat=True)) == [1, 2]
    assert RunLock.objects.count() == 2 and JournalEvent.objects.count() == 2 and RunInputTerm.objects.count() == 0
    assert api.post("/runs", {"workflow": "moving", "version": 1}).json()["version"] == 1  # a version asked for


def test_a_known_workflow_whose_row_is_gone_is_read_again_and_never_used(db):
    from django.db import transaction

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():  # a workflow and its run, rolled back: the row never was
        gone = make_workflow(name="again", steps=[echo_step("only")])
        services.run_create(workflow_name="again", input={})
        raise Undo
    assert service_workflows._known.get("again", None).pk == gone.pk  # still known to this process
    kept = make_workflow(name="again", steps=[echo_step("only")])  # the same name and version 1, a new row

    run, created = services.run_create(workflow_name="again", input={})

    assert created and run.workflow_id == kept.pk != gone.pk
    assert Run.objects.get(id=run.id).workflow_id == kept.pk
    assert service_workflows._known.get("again", None).pk == kept.pk
