"""The open decisions of every run (the inbox, /inbox/ and GET /decisions, and its counts on /ops/): each approval a
run waits on (a child run's too: the child waits on it), each tool call of an agent loop waiting for its approval,
each run waiting on its budget, each Python workflow's run parked on nondeterminism (or on its missing code)."""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils.dateparse import parse_datetime

from journal.selectors import replay_rows_for_step
from pal.clock import db_now

from .. import attributes as run_attributes
from ..decisions import assignee_text
from ..models import Run, RunStatus
from ..replay import MISSING, replay
from ..waiting import WaitsInclude, waits_of

# The kinds of decision, as the inbox names them: a run's wait of that kind (an approval of a tool call is a
# tool_call's decision), and what an operator does about it.
KINDS = ("approval", "tool_call", "budget", "nondeterminism")
RUN_PARKS = ("budget", "nondeterminism", "code_missing")  # a run parked on what an operator must mend
ORDERS = ("oldest", "newest")
INBOX_SCAN = 5000  # waiting runs read at most for one look at the inbox (oldest waiting first)


@dataclass(frozen=True)
class Decision:
    """One open decision: its run, the wait it is (step_id, attempt, prompt, form ...), its kind and since when."""

    kind: str
    run: Run
    wait: dict
    opened_at: datetime

    @property
    def step_id(self) -> str:
        return self.wait.get("step_id") or ""

    @property
    def attempt(self) -> int | None:
        return self.wait.get("attempt")

    @property
    def assignee(self) -> str:
        return assignee_text(self.wait)

    @property
    def deadline(self) -> datetime | None:
        return parse_datetime(self.wait["deadline"]) if self.wait.get("deadline") else None

    @property
    def row_id(self) -> str:
        """The id of its row on /inbox/ (an htmx target): `inbox-{run}-{step}` with an item's brackets as letters."""
        step = re.sub(r"[^A-Za-z0-9_-]", "-", self.step_id or self.kind)
        return f"inbox-{self.run.id}-{step}"


def approval_open(run: Run, step_id: str) -> dict | None:
    """The open approval of a step: the run's wait on it (with its attempt), or, while the run's other branches move,
    its journaled approval_requested not decided yet (with the attempt); None when there is none."""
    if run.status == RunStatus.WAITING:
        return next(
            (w for w in waits_of(run.waiting_on) if w.get("kind") == "approval" and w.get("step_id") == step_id), None
        )
    if run.status != RunStatus.RUNNING:
        return None
    state = replay(replay_rows_for_step(run_id=run.id, step_id=step_id)).get(step_id)  # that step's rows alone
    if (
        state is None
        or state.output is not MISSING
        or state.failure is not None
        or "approval_requested" not in state.events
        or "approval_decided" in state.events
    ):
        return None
    return {**state.events["approval_requested"], "kind": "approval", "step_id": step_id, "attempt": state.attempt}


def _kind_of(wait: dict) -> str | None:
    kind = wait.get("kind")
    if kind == "approval":
        return "tool_call" if wait.get("tool") else "approval"
    if kind == "code_missing":
        return "nondeterminism"  # mended the same way: the code, then a re-drive
    return kind if kind in KINDS else None


def _opened(run: Run, wait: dict) -> datetime:
    opened = parse_datetime(wait["opened_at"]) if wait.get("opened_at") else None
    return opened or run.updated_at


def _assigned_to(names: list[str]) -> Q:
    """Runs with a wait assigned to one of these user or group names (the flat assign_user / assign_group)."""
    found = Q(pk__in=[])
    for name in names:
        for key in ("assign_user", "assign_group"):
            found |= Q(**{f"waiting_on__{key}": name}) | Q(WaitsInclude("waiting_on", kind="approval", **{key: name}))
    return found


def assignee_names(assignee: str, user: Any = None) -> list[str] | None:
    """The user and group names an assignee filter matches: "me" is the user's name and groups; None: no filter."""
    if not assignee:
        return None
    if assignee == "me":
        if user is None:
            return []
        return [user.get_username(), *user.groups.values_list("name", flat=True)]
    return [assignee]


def decisions_open(
    *,
    workflow: str = "",
    assignee: str = "",
    user: Any = None,
    kind: str = "",
    older_than: timedelta | None = None,
    attributes: dict[str, str] | None = None,
    order: str = "oldest",
    limit: int | None = 200,
) -> list[Decision]:
    """Every open decision, oldest (or newest) opened first: of one workflow, of one kind, assigned to a user or group
    name (or "me": the user's name and groups), open longer than older_than (by the database's clock), of runs
    with these attributes ({name: text}, runs.attributes)."""
    asks = Q(waiting_on__kind__in=["approval", *RUN_PARKS]) | Q(WaitsInclude("waiting_on", kind="approval"))
    asks |= Q(WaitsInclude("waiting_on", kind="budget"))
    runs = Run.objects.select_related("workflow").filter(asks, status=RunStatus.WAITING)
    if workflow:
        runs = runs.filter(workflow__name=workflow)
    if attributes:
        runs = run_attributes.narrowed(runs, attributes)
    names = assignee_names(assignee, user)
    if names is not None:
        runs = runs.filter(_assigned_to(names))
    cutoff = db_now() - older_than if older_than else None
    found = []
    for run in runs.order_by("updated_at")[:INBOX_SCAN]:
        for wait in waits_of(run.waiting_on):
            wait_kind = _kind_of(wait)
            if wait_kind is None or (kind and wait_kind != kind):
                continue
            if names is not None and not ({wait.get("assign_user"), wait.get("assign_group")} & set(names)):
                continue
            decision = Decision(kind=wait_kind, run=run, wait=wait, opened_at=_opened(run, wait))
            if cutoff is None or decision.opened_at <= cutoff:
                found.append(decision)
    found.sort(key=lambda d: (d.opened_at, str(d.run.id), d.step_id), reverse=order == "newest")
    return found if limit is None else found[:limit]


def decisions_count(*, user: Any = None) -> dict[str, int]:
    """How many decisions are open, by kind, with the total and (for a user) how many are assigned to them."""
    every = decisions_open(limit=None)
    counts = {kind: sum(1 for d in every if d.kind == kind) for kind in KINDS}
    counts["total"] = len(every)
    if user is not None:
        names = set(assignee_names("me", user) or [])
        counts["mine"] = sum(1 for d in every if {d.wait.get("assign_user"), d.wait.get("assign_group")} & names)
    return counts
