"""Python workflows by replay, in-process (tests/helpers.drive): ids, reuse, values, maps, waits, failures."""

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import transaction

from journal.models import JournalEvent
from runs.code import WORKFLOWS
from runs.errors import Conflict, ServiceError
from runs.explain import run_why
from runs.models import Run, RunStatus
from runs.services import approval_decide, run_redrive, signal_send, workflow_create
from tests.code import sample_workflows
from tests.code.sample_workflows import CALLS
from tests.helpers import drive_to_end, events, kinds

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def calls_forgotten():
    CALLS.clear()


def start(name: str, input: dict | None = None) -> Run:
    run_id = WORKFLOWS_BY_NAME[name].start(input or {})
    return Run.objects.get(id=run_id)


WORKFLOWS_BY_NAME = {
    handle.name: handle
    for handle in vars(sample_workflows).values()
    if getattr(handle, "code", None) is not None and hasattr(handle, "start")
}


def started(run) -> list[tuple[str, str]]:
    rows = JournalEvent.objects.filter(run_id=run.id, kind="step_started").order_by("seq")
    return [(e.step_id, e.payload.get("kind")) for e in rows]


def test_each_call_is_a_step_with_its_name_then_a_number_in_call_order():
    run = start("py-sum", {"xs": [1, 2, 3]})
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"total": 6}
    assert started(run) == [("add", "python"), ("add#2", "python"), ("add#3", "python")]
    completed = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="add#2")
    assert completed.payload["output"] == 3
    first = JournalEvent.objects.get(run_id=run.id, kind="step_started", step_id="add")
    assert first.payload["input"] == {"function": "tests.code.sample_workflows.add", "args": [0, 1], "kwargs": {}}
    assert [key for _, key in CALLS] == [f"{run.id}:add:1", f"{run.id}:add#2:1", f"{run.id}:add#3:1"]
    assert run.workflow.definition["code"] == "tests.code.sample_workflows.py_sum"


def test_a_parked_run_replays_its_function_and_calls_no_completed_step_again():
    run = start("py-everything", {"sleep": 0})
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "approval", run.waiting_on
    before = list(CALLS)
    assert sorted(fn for fn, _ in before) == ["add", "double", "double", "double"]
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run.waiting_on)
    output = run.output
    assert output["first"] == 3 and output["doubled"] == [2, 4, 6] and output["approved"] is True
    assert output["echoed"] == {"said": "first 3"}
    assert output["child"] == {"total": 7}
    # The replay after the decision reused every output before it: only the child's own steps called add again.
    assert CALLS[: len(before)] == before
    assert [fn for fn, _ in CALLS[len(before) :]] == ["add", "add"]
    # ctx.now / uuid / random are journaled steps: the run's output holds what the first walk got.
    now = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="now").payload["output"]
    token = JournalEvent.objects.get(run_id=run.id, kind="step_completed", step_id="uuid").payload["output"]
    assert output["when"] == now and output["token"] == token
    items = JournalEvent.objects.filter(run_id=run.id, kind="step_completed", step_id__startswith="map[")
    assert sorted(e.step_id for e in items) == ["map[0]", "map[1]", "map[2]"]


def test_a_step_failure_the_code_catches_lets_the_run_go_on():
    run = start("py-catches")
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"caught": "step_error", "step": "refuse"}
    assert [fn for fn, _ in CALLS] == ["refuse", "refuse"]  # retry max_attempts 2: a new key each
    assert [key for _, key in CALLS] == [f"{run.id}:refuse:1", f"{run.id}:refuse:2"]


def test_a_step_failure_the_code_does_not_catch_fails_the_run_on_that_step():
    run = start("py-refuses")
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["step_id"] == "refuse" and run.error["attempt"] == 2 and run.error["code"] == "step_error"
    assert "ValueError: refused: always" in run.error["message"]


def test_an_exception_of_the_workflows_own_code_fails_the_run_naming_it():
    run = start("py-raises")
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "workflow_error", run.error
    assert "KeyError" in run.error["message"] and "no such invoice" in run.error["message"]
    assert any("sample_workflows.py" in line for line in run.error["details"]["traceback"])


def test_arguments_that_are_not_json_fail_the_run_with_the_step_named():
    run = start("py-bad-args")
    drive_to_end(run)
    assert run.status == RunStatus.FAILED
    assert "add: its arguments must be JSON" in run.error["message"], run.error
    assert CALLS == []


def test_a_changed_function_parks_the_run_on_nondeterminism_and_calls_nothing(monkeypatch):
    run = start("py-everything", {"sleep": 0})
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    calls_before = list(CALLS)

    def changed(ctx, input):  # a deploy that put a step before the ones the journal holds
        sample_workflows.double(5)
        return sample_workflows.py_everything.code.fn(ctx, input)

    monkeypatch.setattr(WORKFLOWS["py-everything"], "fn", changed)
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    assert run.waiting_on == {
        "kind": "nondeterminism",
        "journal": {"step_id": "add", "kind": "python"},
        "code": {"step_id": "double", "kind": "python"},
    }
    assert CALLS == calls_before  # nothing was called
    assert "asks double (python) where the journal holds add (python)" in run_why(run)
    assert kinds(run)[-1] == "run_waiting"
    # The code mended, a re-drive goes on where the journal is.
    monkeypatch.undo()
    run_redrive(run_id=run.id, by="alice", reason="code fixed")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run.waiting_on)


def test_a_json_workflow_may_not_take_a_python_workflows_name():
    with pytest.raises(Conflict) as caught:
        workflow_create(definition={"name": "py-sum", "steps": [{"id": "a", "kind": "tool_call", "tool": "echo"}]})
    assert caught.value.code == "code_workflow" and "tests.code.sample_workflows.py_sum" in caught.value.detail


def test_start_inside_a_rolled_back_atomic_makes_no_run():
    with transaction.atomic():
        run_id = sample_workflows.py_sum.start({"xs": [1]})
        transaction.set_rollback(True)
    assert not Run.objects.filter(id=run_id).exists()


def test_start_with_the_same_idempotency_key_twice_returns_the_same_run():
    first = sample_workflows.py_sum.start({"xs": [1, 2]}, idempotency_key="refund-7")
    again = sample_workflows.py_sum.start({"xs": [1, 2]}, idempotency_key="refund-7")
    assert again == first
    assert Run.objects.filter(workflow__name="py-sum").count() == 1
    with pytest.raises(Conflict) as caught:  # the same key with another input
        sample_workflows.py_sum.start({"xs": [3]}, idempotency_key="refund-7")
    assert caught.value.code == "idempotency_conflict"


def test_ctx_task_runs_a_django_task_as_a_journaled_step_called_once():
    run = start("py-task")
    drive_to_end(run)
    assert run.status == RunStatus.WAITING and run.waiting_on["kind"] == "approval", run.waiting_on
    approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"total": 5, "again": 6, "approved": True}
    assert started(run) == [("add", "django_task"), ("approval", "approval"), ("add#2", "django_task")]
    first = JournalEvent.objects.get(run_id=run.id, kind="step_started", step_id="add")
    assert first.payload["input"] == {"task": "tests.tasks.sample_tasks.add", "args": {"args": [2], "kwargs": {"b": 3}}}
    # The replay after the decision took add's journaled output: each task was called once.
    assert [e.step_id for e in events(run, "task_called")] == ["add", "add#2"]


def test_ctx_signal_parks_the_run_until_the_signal_arrives_and_returns_its_payload():
    run = start("py-signal")
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    assert run.waiting_on == {"kind": "signal", "step_id": "signal", "attempt": 1, "name": "go"}
    signal_send(run_id=run.id, name="go", payload={"ship": "now"}, by="bob")
    run.refresh_from_db()
    drive_to_end(run)
    assert run.status == RunStatus.SUCCEEDED, (run.error, run.waiting_on)
    assert run.output == {"first": 2, "got": {"ship": "now"}}
    assert [fn for fn, _ in CALLS] == ["add"]  # the step before the wait was not called again
    (received,) = events(run, "signal_received")
    assert received.step_id == "signal" and received.payload["payload"] == {"ship": "now"}, received.payload


def test_a_new_module_source_is_a_new_version_and_a_run_keeps_its_own(monkeypatch):
    run = start("py-sum", {"xs": [1]})
    monkeypatch.setattr(WORKFLOWS["py-sum"], "version", "v-next")
    second = start("py-sum", {"xs": [1]})
    assert second.workflow.version == run.workflow.version + 1
    assert second.workflow.definition["code_version"] == "v-next"
    assert start("py-sum", {"xs": [2]}).workflow_id == second.workflow_id


def test_pal_check_workflows_fails_naming_each_live_run_that_would_diverge(monkeypatch, capsys):
    live = start("py-everything", {"sleep": 0})
    drive_to_end(live)
    assert live.status == RunStatus.WAITING
    ended = start("py-sum", {"xs": [1, 2]})
    drive_to_end(ended)
    assert exit_status("pal_check_workflows", "py-everything", "py-sum") == 0
    assert "OK: 1 runs of 2 Python workflows checked" in capsys.readouterr().out  # the live run only
    calls_before = list(CALLS)

    def changed(ctx, input):  # a deploy that put a step before the ones the journal holds
        sample_workflows.double(5)
        return sample_workflows.py_everything.code.fn(ctx, input)

    monkeypatch.setattr(WORKFLOWS["py-everything"], "fn", changed)
    monkeypatch.setattr(WORKFLOWS["py-sum"], "fn", changed)
    assert exit_status("pal_check_workflows") == 1
    out = capsys.readouterr()
    assert out.out.splitlines() == [
        f"{live.id} py-everything: the journal holds add (python) where the code asks double (python)"
    ]
    assert "1 of 1 runs checked are live and would diverge" in out.err
    assert CALLS == calls_before  # the check called nothing
    # --recent N looks at the N latest ended runs too: listed, marked ended, the exit status still the live runs'.
    assert exit_status("pal_check_workflows", "--recent", "5") == 1
    out = capsys.readouterr().out
    assert f"{ended.id} py-sum: the journal holds add (python) where the code asks double (python) (ended " in out
    assert f"{live.id} py-everything" in out


def test_pal_check_workflows_lists_ended_runs_that_diverge_without_failing(monkeypatch, capsys):
    ended = start("py-sum", {"xs": [1, 2]})
    drive_to_end(ended)
    monkeypatch.setattr(WORKFLOWS["py-sum"], "fn", lambda ctx, input: sample_workflows.double(1))
    assert exit_status("pal_check_workflows", "py-sum") == 0
    assert str(ended.id) not in capsys.readouterr().out  # an ended run is not checked by default
    assert exit_status("pal_check_workflows", "py-sum", "--all") == 0
    out = capsys.readouterr()
    assert f"{ended.id} py-sum: the journal holds add (python) where the code asks double (python)" in out.out
    assert f"(ended succeeded on version {ended.workflow.version}: not an error)" in out.out
    assert "1 ended runs would diverge" in out.err
    with pytest.raises(CommandError):
        call_command("pal_check_workflows", "--all", "--recent", "3")


def test_pal_check_workflows_refuses_a_name_that_is_no_python_workflow():
    with pytest.raises(CommandError) as caught:
        call_command("pal_check_workflows", "nope")
    assert "not a Python workflow: nope" in str(caught.value) and "py-sum" in str(caught.value)


def call_command_exit(*args):
    """The command as the shell runs it: its exit status as SystemExit (0 when it returns)."""
    call_command(*args)
    raise SystemExit(0)


def test_a_typed_approval_from_code_is_checked_and_its_answer_returned():
    User.objects.create_user("alice")
    run = start("py-typed-approval", {"owner": "alice"})
    drive_to_end(run)
    assert run.status == RunStatus.WAITING
    assert (run.waiting_on["assign"], run.waiting_on["choices"]) == ({"user": "alice"}, ["refund", "hold"])
    with pytest.raises(ServiceError) as refused:
        approval_decide(run_id=run.id, step_id="approval", approved=True, by="alice", choice="refund")
    assert refused.value.detail.startswith("answer.amount")

    approval_decide(
        run_id=run.id, step_id="approval", approved=True, by="alice", choice="refund", answer={"amount": 30}
    )
    drive_to_end(run)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"refunded": 30}


def exit_status(*args) -> int:
    """The command's exit status as the shell would see it (0 when it returns)."""
    try:
        call_command(*args)
    except SystemExit as exited:
        return int(exited.code or 0)
    return 0
