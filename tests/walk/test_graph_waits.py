"""Every wait of a graph's run that waits on several (issue 12): the sweep's rule for a parent parked on a child that
moved looks at each child it waits on, not only the first; the approvals pending are every approval of every waiting
run, its own ones behind a wait on a child too; and the probe of the waits matches exactly."""

import pytest

from runs.explain import run_why
from runs.models import Run, RunStatus
from runs.recovery import sweep_once
from runs.selectors import approvals_pending, parents_of_moved_children, stuck_runs
from runs.services import workflow_create
from runs.waiting import WaitsInclude, waits_of
from tests.helpers import drive_to_end, make_run, step_events, tool_step

pytestmark = pytest.mark.django_db


def asks(name: str) -> None:
    workflow_create(definition={"name": name, "steps": [{"id": "ok", "kind": "approval", "prompt": f"{name}?"}]})


def two_children_waiting() -> tuple[Run, Run, Run]:
    """A parent whose two branches each parked on a child that waits on an approval: (parent, first, second) in the
    order the parent lists its waits."""
    asks("legal")
    asks("money")
    parent = make_run(
        steps=[
            {"id": "a", "kind": "child_run", "workflow": "legal", "input": {}, "needs": []},
            {"id": "b", "kind": "child_run", "workflow": "money", "input": {}, "needs": []},
            tool_step("end", "echo", {"done": True}, needs=["a", "b"]),
        ]
    )
    drive_to_end(parent)
    assert parent.status == RunStatus.WAITING
    waits = waits_of(parent.waiting_on)
    assert [w["kind"] for w in waits] == ["child", "child"]
    first, second = (Run.objects.get(id=w["child_run_id"]) for w in waits)
    assert first.status == second.status == RunStatus.WAITING
    return parent, first, second


def test_a_parent_parked_on_two_children_is_stuck_when_the_second_one_moved_and_the_sweep_wakes_it():
    parent, first, second = two_children_waiting()
    assert parents_of_moved_children() == []

    # The second child ended and the wake-up of its parent was lost (a crash between the two).
    Run.objects.filter(id=second.id).update(status=RunStatus.SUCCEEDED, output={"approved": True})

    assert parents_of_moved_children() == [(parent.id, second.id, RunStatus.SUCCEEDED, True)]
    assert parent.id in stuck_runs().values_list("id", flat=True)
    assert "nothing drives it, so this run is stuck" in run_why(parent)
    assert str(parent.id) in sweep_once().woken
    drive_to_end(parent)

    # It took the second child's ending and waits on the first alone.
    assert parent.status == RunStatus.WAITING
    assert (parent.waiting_on["kind"], parent.waiting_on["child_run_id"]) == ("child", str(first.id))
    assert "waits" not in parent.waiting_on
    assert step_events(parent, "step_completed", "b")[0].payload["output"] == {"approved": True}
    assert parents_of_moved_children() == []


def test_a_parent_is_not_stuck_on_a_child_it_does_not_wait_on():
    parent, _first, _second = two_children_waiting()
    other = make_run(steps=[tool_step("x", "echo", {})])
    # A run of the same parent under a step attempt that the parent does not wait on (as after a retry).
    Run.objects.filter(id=other.id).update(parent_run=parent, parent_step_id="b", parent_attempt=2)
    Run.objects.filter(id=other.id).update(status=RunStatus.SUCCEEDED)

    assert parents_of_moved_children() == []


def test_the_approvals_pending_are_each_childs_and_a_parents_own_behind_its_wait_on_a_child():
    asks("legal")
    parent = make_run(
        steps=[
            {"id": "sub", "kind": "child_run", "workflow": "legal", "input": {}, "needs": []},
            {"id": "mine", "kind": "approval", "prompt": "mine?", "needs": []},
        ]
    )
    drive_to_end(parent)
    assert parent.waiting_on["kind"] == "child"  # the wait on a child comes first
    (child,) = Run.objects.filter(parent_run_id=parent.id)

    pending = {(item.run.id, item.step_id, item.wait["prompt"]) for item in approvals_pending()}

    assert pending == {(child.id, "ok", "legal?"), (parent.id, "mine", "mine?")}
    assert [item.step_id for item in approvals_pending(run_ids=[parent.id])] == ["mine"]


def test_the_probe_of_a_runs_waits_matches_every_key_it_names_and_nothing_else():
    waits = [
        {"kind": "child", "step_id": "a", "attempt": 1, "child_run_id": "c1"},
        {"kind": "approval", "step_id": "b[2]", "attempt": 3, "prompt": "go?"},
    ]
    several = make_run(steps=[tool_step("x", "echo", {})])
    Run.objects.filter(id=several.id).update(status=RunStatus.WAITING, waiting_on={**waits[0], "waits": waits})
    single = make_run(steps=[tool_step("x", "echo", {})])
    Run.objects.filter(id=single.id).update(status=RunStatus.WAITING, waiting_on=waits[1])

    def matching(**probe) -> set:
        return set(Run.objects.filter(WaitsInclude("waiting_on", **probe)).values_list("id", flat=True))

    assert matching(kind="approval") == {several.id}  # a single wait has no "waits": callers match it themselves
    assert matching(kind="approval", step_id="b[2]") == {several.id}
    assert matching(kind="approval", step_id="a") == set()
    assert matching(kind="child", child_run_id="c1") == {several.id}
    assert matching(kind="child", child_run_id="c2") == set()
