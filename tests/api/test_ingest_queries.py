"""The queries of the ingest and read paths (issue 15 section 1), counted so they do not creep back: a run's answer
to POST /runs and POST /runs/batch does not read back the journal it has just written, the token check is one
read, and a batch costs the same few statements whatever its number of runs (all in the one transaction).

The counts are what Django sees inside a test's transaction (a transaction.atomic is a SAVEPOINT here)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import selectors, services
from runs.api.runs import run_out
from runs.errors import NotFound
from runs.models import Run, RunLock
from tokens.models import ApiToken
from tokens.services import _live_token, token_authenticate, token_hash

from .conftest import Api, make_user, token_for

FLOW = {"name": "count-flow", "steps": [{"id": "s1", "kind": "tool_call", "tool": "echo", "args": {}}]}


@pytest.fixture
def api(db):
    services.workflow_create(definition=FLOW)
    client = Api(token_for(make_user("quinn", "runs.view_run", "runs.operate")))
    client.get("/runs?limit=1")  # the token's first use writes last_used_at (once a minute): not counted below
    return client


def _statements(queries) -> list[str]:
    return [q["sql"].split(None, 1)[0].upper() for q in queries.captured_queries]


def test_reading_a_queued_run_takes_the_token_and_the_run_with_its_lease_and_its_last_event_in_one_statement(
    api, django_assert_num_queries
):
    run, _ = services.run_create(workflow_name="count-flow")
    # The token with its user and the user's permissions (own and groups', for the role), and in the same statement
    # the run with its workflow, its lease and the journal's last row (a run booked for a task says whether it is
    # backing off).
    with django_assert_num_queries(1):
        response = api.get(f"/runs/{run.id}")
    assert response.status_code == 200
    assert response.json()["why"].startswith("queued for task")


def test_the_run_read_with_its_lease_makes_what_the_orm_makes(api, django_assert_num_queries):
    run, _ = services.run_create(workflow_name="count-flow", input={"deep": {"list": [1, "two"]}})
    orm = Run.objects.select_related("workflow", "lock").get(id=run.id)
    with django_assert_num_queries(1):
        read = selectors.run_with_lease(run_id=run.id)
        lease = selectors.lease_of(read)  # from the same read
    fields = lambda obj: {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}  # noqa: E731
    assert fields(read) == fields(orm) and fields(read.workflow) == fields(orm.workflow)
    assert fields(read.lock) == fields(orm.lock) and read.lock.run is read
    assert lease == selectors.lease_of(orm) and lease["owner"].startswith("task:")
    assert not read._state.adding and read._state.db == "default"

    RunLock.objects.filter(run_id=run.id).delete()
    without = selectors.run_with_lease(run_id=run.id)
    with django_assert_num_queries(0):
        assert selectors.lease_of(without) is None
    with pytest.raises(NotFound):
        selectors.run_with_lease(run_id="6f1c1f5e-0000-4000-8000-000000000000")
    with pytest.raises(NotFound):
        selectors.run_with_lease(run_id="not-a-run-id")


def test_starting_a_run_writes_in_one_transaction_and_reads_nothing_back(api, django_assert_num_queries):
    with CaptureQueriesContext(connection) as queries:
        response = api.post("/runs", {"workflow": "count-flow", "input": {"a": 1}})
    assert response.status_code == 201, response.content
    sql = [q["sql"] for q in queries.captured_queries]
    # token with the user's permissions, workflow; then the run, its lease booking, its input's terms and the
    # journal's run_created, on Postgres as the parts of ONE statement, elsewhere one INSERT each in a transaction
    # (runs.services.ingest._runs_insert). The answer's lease is the booking made (no read after the commit); no read of
    # the journal, and no savepoint but the transaction's (the test's own transaction makes it one here: outside a
    # transaction Postgres needs none, tests/api/test_create_round_trips.py).
    writes = ["WITH"] if connection.vendor == "postgresql" else ["INSERT", "INSERT", "INSERT", "WITH"]
    assert _statements(queries) == ["SELECT", "SELECT", "SAVEPOINT", *writes, "RELEASE"], sql
    assert not any(s.lstrip().upper().startswith("SELECT") and "run_locks" in s for s in sql), sql
    assert sum("run_input_terms" in s for s in sql) == 1, sql
    assert not any(s.lstrip().upper().startswith("SELECT") and "journal_events" in s for s in sql), sql


def test_a_new_runs_answer_is_what_reading_it_back_says(api):
    created = api.post("/runs", {"workflow": "count-flow", "input": {"b": 2}}).json()
    read = api.get(f"/runs/{created['id']}").json()
    assert created == read
    assert created["why"].startswith("queued for task") and created["lease"]["owner"].startswith("task:")


def test_an_answer_whose_booking_is_no_longer_its_own_reads_the_journal(api, django_assert_num_queries):
    run, _ = services.run_create(workflow_name="count-flow")
    with django_assert_num_queries(1):  # its own booking still holds: the lease only
        own = run_out(run, booked_owner=run.booked_owner)
    with django_assert_num_queries(2):  # someone else's: the lease, then the journal's last row
        other = run_out(run, booked_owner="task:someone-else")
    assert own == other == run_out(run)


def test_a_batch_costs_the_same_statements_whatever_its_runs_and_none_reads_the_journal(api):
    def batch(n: int) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            response = api.post("/runs/batch", {"runs": [{"workflow": "count-flow"} for _ in range(n)]})
        assert response.status_code == 201, response.content
        assert len(response.json()["items"]) == n
        return [q["sql"] for q in queries.captured_queries]

    one, ten, twenty = batch(1), batch(10), batch(20)
    # Whatever the number of runs: token with the user's permissions, workflow, the transaction's savepoint; one
    # INSERT of the runs, one of their lease bookings, one of their journals' run_created (on Postgres the parts of
    # one statement); the release; one read of every run's lease for the answer.
    assert len(one) == len(ten) == len(twenty) == (6 if connection.vendor == "postgresql" else 8), twenty
    assert not any(s.lstrip().upper().startswith("SELECT") and "journal_events" in s for s in twenty)


def test_the_token_check_is_one_read(api, django_assert_num_queries):
    user = make_user("tara", "runs.view_run")
    token = token_for(user)
    _live_token(token_hash(token))
    with django_assert_num_queries(1):
        found = _live_token(token_hash(token))
    assert found is not None and found.user.username == "tara"


def test_the_token_read_makes_the_same_token_and_user_as_the_orm(db):
    user = make_user("uma", "runs.view_run")
    token = token_for(user)
    digest = token_hash(token)
    orm = ApiToken.objects.active().select_related("user").get(token_hash=digest)
    raw = _live_token(digest)
    assert raw is not None and not raw._state.adding and raw._state.db == orm._state.db
    fields = lambda obj: {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}  # noqa: E731
    assert fields(raw) == fields(orm) and fields(raw.user) == fields(orm.user)
    assert raw.user.has_perm("runs.view_run") and not raw.user.has_perm("runs.operate")


def test_a_revoked_token_or_an_inactive_user_is_not_found_by_the_token_read(db):
    user = make_user("vic", "runs.view_run")
    revoked, kept = token_for(user), token_for(user)
    ApiToken.objects.filter(token_hash=token_hash(revoked)).update(revoked_at="2026-01-01T00:00:00Z")
    assert _live_token(token_hash(revoked)) is None
    assert _live_token(token_hash(kept)) is not None
    user.is_active = False
    user.save()
    assert _live_token(token_hash(kept)) is None
    assert _live_token(token_hash("pal_not-a-token")) is None


def test_the_role_check_reads_a_users_own_and_group_permissions_in_the_token_read(db, django_assert_num_queries):
    from django.contrib.auth.models import Group, Permission

    services.workflow_create(definition=FLOW)
    user = make_user("gil", "runs.view_run")
    operators = Group.objects.create(name="operators")
    operators.permissions.add(Permission.objects.get(codename="operate", content_type__app_label="runs"))
    client = Api(token_for(user))
    assert client.post("/runs", {"workflow": "count-flow"}).status_code == 403  # a viewer only, for now
    user.groups.add(operators)
    assert client.post("/runs", {"workflow": "count-flow"}).status_code == 201  # the group's permission, at once
    with django_assert_num_queries(1):  # the token with its user and every permission it has
        found = token_authenticate(client.token)
    assert found.has_perm("runs.operate") and found.has_perm("runs.view_run")
    assert found.get_all_permissions() == {"runs.operate", "runs.view_run"}
    user.groups.remove(operators)
    assert client.post("/runs", {"workflow": "count-flow"}).status_code == 403  # taken away: refused at once


def test_a_superusers_role_check_reads_no_permissions(db, django_assert_num_queries):
    client = Api(token_for(make_user("sue", superuser=True)))
    token_authenticate(client.token)
    with django_assert_num_queries(1):
        found = token_authenticate(client.token)
    assert found.has_perm("runs.operate")
