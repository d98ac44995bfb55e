"""What moving a run to another version of its workflow would do (docs/reference/workflows.md, "Versions"), and
which recent runs a new definition would strand: the one rule both read, from each run's journal, calling nothing."""

# A step of the new version is judged by what the run's journal holds for it (runs.replay), in the new graph's
# order, so that a step reading one that runs again is known to run again too:
# - carried over (reused): it completed, was skipped or waits (or had started), with the same id and kind, and its
#   fields rendered by the new version from the run's input and the outputs journaled so far equal the input its
#   step_started journaled (a for_each step: its items too); a skipped step whose `when` is still false. Its outcome
#   stays: nothing is called or sent again, and a step that had started goes on under the same attempt and key.
# - run again (rerun): such a step whose kind or rendered input differs (or cannot be rendered), whose `when` now
#   holds, or that reads a step that runs again. It goes on under attempt + 1, a new key (one definition_moved row
#   a step or item, journaled by runs.services.move); a failed step goes on as its retry would, no row needed.
# - new: an id the run's version did not have; pending: a step both versions have that has not begun.
# Diverging (pal_check_definition, POST /workflows?dry_run=true): a completed or waiting step whose id is gone, whose
# kind changed, or whose rendered input differs from the journaled one (or cannot be rendered, or a for_each step
# whose items differ). Reading a step that runs again follows from those and is not named on its own.

import re
from dataclasses import dataclass
from typing import Any

from journal.models import JournalEvent
from journal.selectors import replay_rows_for_run
from journal.services import dumps
from pal.clock import db_now

from .. import leases
from ..code import is_code
from ..errors import StepError, outcome_unknown
from ..expressions import when_true
from ..graph import needs_of, order
from ..models import FINAL_STATUSES, Run
from ..replay import MISSING, StepState, item_id, replay, step_key
from ..secrets import redact
from ..workflows import for_each_items, step_fields
from .lists import lease_of
from .redrive import redrive_effects

# Why a step runs again, and whether that is a divergence (the journal holds what the new version would not do).
WHY = {
    "kind_changed": "its kind changed",
    "input_changed": "its input as the new version renders it differs from the journaled one",
    "unrenderable": "the new version's fields read what the run does not have",
    "items_changed": "its for_each items differ",
    "when_true": "it was skipped and its `when` now holds (or it has none)",
    "reads_rerun": "it reads a step that runs again",
    "failed": "it failed: it goes on as its retry would",
    "resumes": "it had started: it goes on under the same attempt and key",
}
DIVERGING = frozenset({"kind_changed", "input_changed", "unrenderable", "items_changed"})
STEP_REFERENCE = re.compile(r"steps\.([A-Za-z0-9_-]+)")


@dataclass(frozen=True)
class MovePlan:
    """What a move journals, a definition_moved row each: (step or item id, the attempt it goes on with, the one it
    had, why); whether a waiting run goes on at once (its wait is not carried over); the diverging steps; and the
    preview the API and the pages show."""

    rows: list[tuple[str, int, int, str]]
    wakes: bool
    diverging: list[dict]
    preview: dict


@dataclass
class _Journal:
    """One run's journal as the plan reads it: each step's state, and what its starts recorded."""

    states: dict[str, StepState]
    inputs: dict[tuple[str, int], Any]  # (step or item id, attempt) -> the input its first start journaled
    kinds: dict[str, str]  # step id -> the kind its last start journaled
    items: dict[tuple[str, int], int]  # (for_each step id, attempt) -> its number of items

    @classmethod
    def of(cls, run: Run) -> "_Journal":
        journal = cls(replay(replay_rows_for_run(run_id=run.id)), {}, {}, {})
        starts = JournalEvent.objects.filter(run_id=run.id, kind="step_started").order_by("seq")
        for sid, attempt, payload in starts.values_list("step_id", "attempt", "payload"):
            payload = payload if isinstance(payload, dict) else {}
            if sid is None or attempt is None:
                continue
            if "input" in payload:
                journal.inputs.setdefault((sid, attempt), payload["input"])
            if isinstance(payload.get("kind"), str) and "[" not in sid:
                journal.kinds[sid] = payload["kind"]
            if isinstance(payload.get("items"), int) and not isinstance(payload["items"], bool):
                journal.items[(sid, attempt)] = payload["items"]
        return journal


def phase(state: StepState | None) -> str:
    """Where a step's current attempt is: none (not begun), completed, skipped, waiting, failed or started."""
    if state is None:
        return "none"
    if state.output is not MISSING:
        return "skipped" if state.skipped else "completed"
    if state.waiting:
        return "waiting"
    if state.failure is not None:
        return "failed"
    return "started" if state.started else "none"


def _same(a: Any, b: Any) -> bool:
    return dumps(a) == dumps(b)  # as the journal stores them: key order and 1 / 1.0 / true told apart alike


def _reads(step: dict) -> set[str]:
    """The steps a step's fields, for_each and when read."""
    return set(STEP_REFERENCE.findall(dumps({k: v for k, v in step.items() if k not in ("id", "kind", "needs")})))


class _Judge:
    """move_plan's walk over the new version's steps, for one run."""

    def __init__(self, run: Run, definition: dict):
        self.run, self.definition = run, definition
        self.old = {s["id"]: s for s in (run.workflow.definition or {}).get("steps") or []}
        self.journal = _Journal.of(run)
        self.context: dict[str, Any] = {
            "input": run.input,
            "steps": {
                sid: {"output": state.output}
                for sid, state in self.journal.states.items()
                if "[" not in sid and state.output is not MISSING
            },
        }
        self.again: set[str] = set()  # steps that run again with a row: what reads them runs again too

    def input_differs(self, step: dict, sid: str, attempt: int, item: tuple[int, Any] | None = None) -> str | None:
        """None when the new version renders the input the journal holds for this attempt; else why not."""
        context = self.context if item is None else {**self.context, "index": item[0], "item": item[1]}
        try:
            fields = redact(step_fields(step, context=context))
        except StepError:
            return "unrenderable"
        journaled = self.journal.inputs.get((sid, attempt), MISSING)
        if journaled is MISSING:  # a fork's reused step, or rows from before inputs were journaled
            old = self.old.get(step["id"])
            try:
                journaled = redact(step_fields(old, context=context)) if old is not None else MISSING
            except StepError:
                journaled = MISSING
        return None if journaled is not MISSING and _same(fields, journaled) else "input_changed"

    def judge(self, step: dict, state: StepState) -> str | None:
        """Why a step that has an outcome, waits or had started runs again on the new version; None: carried over."""
        sid = step["id"]
        had_kind = self.journal.kinds.get(sid) or (self.old.get(sid) or {}).get("kind")
        if had_kind is not None and had_kind != step["kind"]:
            return "kind_changed"
        why: str | None = None
        if state.skipped:
            try:
                why = "when_true" if "when" not in step or when_true(step["when"], self.context)[0] else None
            except StepError:
                why = "unrenderable"
        elif "for_each" in step:
            why = self.items_differ(step, state)
        else:
            why = self.input_differs(step, sid, state.attempt)
        if why is None and _reads(step) & self.again:
            why = "reads_rerun"
        return why

    def items_differ(self, step: dict, state: StepState) -> str | None:
        sid = step["id"]
        try:
            items = for_each_items(step, self.context)
        except StepError:
            return "unrenderable"
        had = self.journal.items.get((sid, state.attempt))
        if had is not None and had != len(items):
            return "items_changed"
        for index, value in enumerate(items):
            item = self.journal.states.get(item_id(sid, index))
            if phase(item) in ("completed", "waiting", "started"):
                assert item is not None
                if self.input_differs(step, item_id(sid, index), item.attempt, (index, value)) is not None:
                    return "items_changed"
        return None

    def begun(self, sid: str) -> list[tuple[str, StepState]]:
        """The step's own state and its items' (a for_each step's, an agent loop's tool calls) that have begun."""
        prefix = f"{sid}["
        return [
            (other, state)
            for other, state in self.journal.states.items()
            if (other == sid or other.startswith(prefix)) and phase(state) != "none"
        ]


def _next(state: StepState) -> int:
    """The attempt a step that runs again goes on with: + 1 (a new key); a skipped one never used its attempt."""
    return state.attempt if state.skipped else state.attempt + 1


class _Plan:
    """move_plan's lists, filled step by step."""

    def __init__(self, judge: _Judge, rid: str):
        self.judge, self.rid, self.states = judge, rid, judge.journal.states
        self.reused: list[dict] = []
        self.rerun: list[dict] = []
        self.new: list[dict] = []
        self.pending: list[dict] = []
        self.removed: list[dict] = []
        self.claims: list[dict] = []
        self.rows: list[tuple[str, int, int, str]] = []
        self.diverging: list[dict] = []

    def claim(self, step: dict, sid: str, attempt: int, why: str) -> None:
        """The keys a deliver step will claim: one, or one an item (an item not begun yet under attempt 1)."""
        if step.get("kind") != "deliver":
            return
        entry = {"step_id": sid, "channel": step.get("channel"), "why": why}
        if "for_each" not in step:
            self.claims.append({"key": step_key(self.rid, sid, attempt), **entry})
            return
        try:
            count = len(for_each_items(step, self.judge.context))
        except StepError:  # its items read steps that have not run yet: one line for them all
            self.claims.append({"key": step_key(self.rid, f"{sid}[INDEX]", 1), **entry, "items": None})
            return
        for index in range(count):
            item = self.states.get(item_id(sid, index))
            again = item is not None and phase(item) != "none" and why not in ("pending", "new")
            number = _next(item) if again and item is not None else (item.attempt if item is not None else 1)
            self.claims.append({"key": step_key(self.rid, item_id(sid, index), number), **entry})

    def run_again(self, step: dict, sid: str, why: str, where: str) -> None:
        """A step that runs again under a new attempt: a row for it and for each of its items that began."""
        state = self.states[sid]
        self.judge.again.add(sid)
        self.rows += [(other, _next(begun), begun.attempt, why) for other, begun in self.judge.begun(sid)]
        entry = {"step_id": sid, "kind": step.get("kind"), "attempt": _next(state), "had": state.attempt}
        self.rerun.append({**entry, "why": why, "same_key": False, "phase": where})
        self.claim(step, sid, _next(state), why)
        if why in DIVERGING and where != "started":
            self.diverging.append({"step_id": sid, "code": why, "why": WHY[why]})

    def step(self, step: dict) -> None:
        sid = step["id"]
        state = self.states.get(sid)
        where = phase(state)
        entry = {"step_id": sid, "kind": step.get("kind")}
        if state is None or where == "none":
            attempt = state.attempt if state is not None else 1
            what = "pending" if sid in self.judge.old else "new"
            (self.pending if what == "pending" else self.new).append({**entry, "attempt": attempt})
            self.claim(step, sid, attempt, what)
        elif where == "failed":
            attempt = state.attempt if outcome_unknown(state.failure) else state.attempt + 1
            self.rerun.append({**entry, "attempt": attempt, "had": state.attempt, "why": "failed", "same_key": False})
            self.claim(step, sid, attempt, "failed")
        elif (why := self.judge.judge(step, state)) is not None:
            self.run_again(step, sid, why, where)
        elif where == "started":
            resumes = {"attempt": state.attempt, "had": state.attempt, "why": "resumes", "same_key": True}
            self.rerun.append({**entry, **resumes})
            self.claim(step, sid, state.attempt, "resumes")
        else:
            self.reused.append({**entry, "attempt": None if state.skipped else state.attempt, "phase": where})

    def gone(self, sid: str) -> None:
        """A step the new version does not have: listed; its outcome stays, what it waited on or did is dropped."""
        where = phase(self.states.get(sid))
        kind = self.judge.journal.kinds.get(sid) or self.judge.old.get(sid, {}).get("kind")
        self.removed.append({"step_id": sid, "kind": kind, "phase": where})
        if where in ("completed", "skipped", "waiting"):
            self.diverging.append({"step_id": sid, "code": "gone", "why": "the new version has no step of that id"})
        if where in ("waiting", "started"):
            self.rows += [(other, _next(begun), begun.attempt, "gone") for other, begun in self.judge.begun(sid)]


def move_plan(run: Run, definition: dict, *, version: int | None = None) -> MovePlan:
    """What moving `run` onto `definition` (the version `version` of its workflow) would do, from its journal alone:
    each step of the new version carried over, run again (with why and the attempt), new or pending; the steps it
    no longer has; the side effects that will be claimed; the diverging steps (module comment)."""
    judge = _Judge(run, definition)
    steps = definition.get("steps") or []
    by_id = {step["id"]: step for step in steps}
    plan = _Plan(judge, str(run.id))
    for sid in order(steps):
        plan.step(by_id[sid])
    for sid in sorted({sid.split("[", 1)[0] for sid in plan.states} | set(judge.old)):
        if sid not in by_id:
            plan.gone(sid)
    wakes = run.status == "waiting" and _wakes(run.waiting_on, plan, needs_of(steps))
    preview = {
        "run_id": plan.rid,
        "workflow": run.workflow.name,
        "status": run.status,
        "from_version": run.workflow.version,
        "to_version": version,
        "reused": plan.reused,
        "rerun": plan.rerun,
        "new": plan.new,
        "pending": plan.pending,
        "removed": plan.removed,
        "side_effects": plan.claims,
        "open_side_effects": redrive_effects(run),
        "diverging": plan.diverging,
        "wakes": wakes,
    }
    return MovePlan(rows=plan.rows, wakes=wakes, diverging=plan.diverging, preview=preview)


def _wakes(waiting_on: Any, plan: _Plan, needs: dict[str, list[str]]) -> bool:
    """A run parked on a step goes on at once when the move drops what it waits on (the step runs again or is gone)
    or gives it a step it can run now (all its needs carried over with an outcome); its walk parks again on a wait
    that carried over. One held by a pause or its budget stays held."""
    if not isinstance(waiting_on, dict):
        return False
    waits = [waiting_on, *(w for w in waiting_on.get("waits") or [] if isinstance(w, dict))]
    on_steps = {str(w["step_id"]).split("[", 1)[0] for w in waits if w.get("step_id") and w.get("kind") != "paused"}
    dropped = {row[0].split("[", 1)[0] for row in plan.rows}
    done = {entry["step_id"] for entry in plan.reused if entry["phase"] in ("completed", "skipped")}
    todo = {entry["step_id"] for entry in plan.new + plan.pending} | (dropped & set(needs))
    ready = any(all(need in done for need in needs[sid]) for sid in todo)
    return bool(on_steps) and (bool(on_steps & dropped) or ready)


def move_held(run: Run) -> dict | None:
    """The lease of a run that a worker walks now (a move is refused until it parks or ends); else None."""
    lease = lease_of(run)
    if lease is None or str(lease["owner"]).startswith("task:"):
        return None
    return lease if leases.lease_live(lease["expires_at"], now=db_now()) else None


CHECK_RUNS = 100


def definition_divergence(*, definition: dict, runs: int = CHECK_RUNS, ended: bool = False) -> dict:
    """Replay the journals of the most recent `runs` runs of the definition's workflow that have not ended (with
    ended, any) against it, calling nothing: {checked, diverging: [{run_id, version, step_id, code, why}]}."""
    found = Run.objects.filter(workflow__name=definition.get("name")).select_related("workflow")
    if not ended:
        found = found.exclude(status__in=FINAL_STATUSES)
    checked, diverging = 0, []
    for run in found.order_by("-created_at", "-id")[:runs]:
        if is_code(run.workflow.definition):
            continue
        checked += 1
        for entry in move_plan(run, definition).diverging:
            diverging.append({"run_id": str(run.id), "version": run.workflow.version, **entry})
    return {"checked": checked, "diverging": diverging}
