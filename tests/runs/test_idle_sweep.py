"""An idle fleet's sweep (issue 29 section 4): with nothing to recover a pass is one transaction, its record's
times are the database's clock, and a pass with work still re-drives each run in a transaction of its own."""

import pytest
from django.db import connection

from pal.clock import db_now
from runs import recovery
from runs.models import Sweep
from runs.recovery import sweep_once
from tests.helpers import echo_step, make_run, sweep_after_expiry

pytestmark = pytest.mark.django_db(transaction=True)


class Transactions:
    """Counts the transactions this connection ends (commits of atomic blocks, and statements in autocommit)."""

    def __init__(self, monkeypatch):
        self.count = 0
        commit = connection.commit

        def counted_commit():
            self.count += 1
            return commit()

        monkeypatch.setattr(connection, "commit", counted_commit)

    def __call__(self, execute, sql, params, many, context):
        if not connection.in_atomic_block and not sql.startswith("BEGIN"):  # SQLite's atomic() sends its BEGIN
            self.count += 1  # a statement in autocommit is a transaction of its own
        return execute(sql, params, many, context)


@pytest.mark.parametrize("housekeeping", [True, False], ids=["with-housekeeping", "without"])
def test_an_idle_sweep_is_one_transaction(monkeypatch, housekeeping):
    sweep_once(who="warm")  # the connection's first use (its set-up) is not the pass's
    monkeypatch.setattr(recovery, "_housekept_at", [-recovery.HOUSEKEEPING_EVERY if housekeeping else 1e12])
    transactions = Transactions(monkeypatch)
    with connection.execute_wrapper(transactions):
        record = sweep_once(who="idle")
    assert transactions.count == 1
    assert record.examined == 0 and record.redriven == [] and record.who == "idle"
    assert record.started_at <= record.finished_at <= db_now()


def test_a_sweep_with_a_stuck_run_redrives_it_and_records_the_pass():
    run = make_run(steps=[echo_step("a")])  # booked for its first task, which never comes
    sweep_after_expiry(run)
    record = Sweep.objects.order_by("-started_at").first()
    assert record is not None and str(run.id) in record.redriven
    assert record.started_at <= record.finished_at
