"""Fork: a new run of the same version that reuses the original's steps before a point."""

from django.db import transaction

from journal.receipts import usage_of
from journal.selectors import ReplayRow, events_of_kind, replay_rows_for_run
from journal.services import (
    NewEvent,
    dumps,
    events_append,
)

from ..audit import Audit
from ..errors import ServiceError
from ..graph import ancestors_of
from ..models import (
    Run,
)
from ..replay import MISSING, replay
from .actions import journal_head_advance
from .ingest import _run_insert, run_get

# --- fork: a new run of the same version that reuses the original's steps before a point ---------

FORK_NOTE = (
    "Reused steps keep the outputs the original computed from its input: a reused step whose fields read input "
    "that you changed is not run again (reusing is your choice; fork from an earlier step to run it anew)."
)


def _fork_plan(run: Run, *, from_step: str, input: dict | None) -> dict:
    """What a fork from `from_step` reuses and what it runs, from the original's journal.

    Runs anew: from_step and every step after it in the graph (its descendants through needs), and any other
    step that has no outcome in the original. Reused: every other step, with the journal row that holds its
    outcome (a step_completed, or a step_skipped whose `when` was false)."""
    steps = run.workflow.definition.get("steps", [])
    by_id = {step["id"]: step for step in steps}
    if not isinstance(from_step, str) or from_step not in by_id:
        raise ServiceError(
            f"from_step: {run.workflow} has no step {from_step!r} (its steps: {', '.join(by_id)})",
            code="unknown_step",
            status=422,
        )
    if input is not None and not isinstance(input, dict):
        raise ServiceError("input: must be a JSON object", code="invalid_input", status=422)
    after = {sid for sid, ancestors in ancestors_of(steps).items() if from_step in ancestors}
    rows = replay_rows_for_run(run_id=run.id)
    states = replay(rows)
    outcome_rows: dict[str, ReplayRow] = {}  # step id -> the row holding its current attempt's outcome
    for event in rows:
        sid, state = event.step_id, states.get(event.step_id or "")
        if sid is not None and sid in by_id and state is not None:
            if (event.kind == "step_completed" and event.attempt == state.attempt) or event.kind == "step_skipped":
                outcome_rows[sid] = event
    new_input = run.input if input is None else input
    changed = sorted(key for key in {*run.input, *new_input} if run.input.get(key) != new_input.get(key))
    reused, rerun = [], []
    for step in steps:
        sid, state, row = step["id"], states.get(step["id"]), outcome_rows.get(step["id"])
        if sid == from_step or sid in after:
            rerun.append(
                {
                    "step_id": sid,
                    "kind": step.get("kind"),
                    "why": "from_step" if sid == from_step else f"after {from_step}",
                }
            )
        elif state is None or state.output is MISSING or row is None:
            rerun.append({"step_id": sid, "kind": step.get("kind"), "why": "no outcome in the original"})
        else:
            prompt, completion, cost = usage_of(state.output) if not state.skipped else (0, 0, 0.0)
            text = dumps({k: v for k, v in step.items() if k != "id"})
            reused.append(
                {
                    "step_id": sid,
                    "kind": step.get("kind"),
                    "skipped": state.skipped,
                    "attempt": None if state.skipped else state.attempt,
                    "seq": row.seq,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "cost_usd": cost,
                    "reads_changed_input": [key for key in changed if f"input.{key}" in text],
                }
            )
    return {
        "run_id": run.id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "from_step": from_step,
        "input": new_input,
        "input_changed": changed,
        "reused": reused,
        "rerun": rerun,
        "saved": {
            "prompt_tokens": sum(r["prompt_tokens"] for r in reused),
            "completion_tokens": sum(r["completion_tokens"] for r in reused),
            "cost_usd": round(sum(r["cost_usd"] for r in reused), 10),
        },
        "note": FORK_NOTE,
    }


def run_fork_preview(*, run_id, from_step: str, input: dict | None = None) -> dict:
    """What run_fork would reuse (step, the original's row, tokens and cost saved) and what it would run anew;
    with the top-level input fields that change and, per reused step, those of them its fields read."""
    return _fork_plan(run_get(run_id=run_id), from_step=from_step, input=input)


def run_fork(
    *, run_id, from_step: str, reason: str, by: str, input: dict | None = None, rerun_job: dict | None = None
) -> Run:
    """A new run of the original's workflow version, from `from_step` on (docs/reference/api.md,
    POST /runs/{id}/fork); rerun_job ({id, name}) names the rerun that asked, in the original's run_forked."""
    # The steps it reuses are journaled in the new run, right after its run_created, as the original's outcome
    # rows with reused_from {run_id, seq}: its walk replays them as completed (runs.replay), so they call no
    # provider and send nothing; the rest run under the new run's keys. The original gets run_forked (who, why,
    # the new run's id) in the same commit; the new run's forked_from and run_created name the original.
    audit = Audit.of(by=by, reason=reason, action="a fork")
    original = run_get(run_id=run_id)
    plan = _fork_plan(original, from_step=from_step, input=input)
    completed = {
        row.seq: row
        for row in replay_rows_for_run(run_id=original.id)
        if row.seq in {r["seq"] for r in plan["reused"] if not r["skipped"]}
    }
    skipped = {
        event.seq: event
        for event in events_of_kind(
            run_id=original.id, kind="step_skipped", step_ids=[r["step_id"] for r in plan["reused"] if r["skipped"]]
        )
    }
    reused = []
    for entry in plan["reused"]:
        source = {"run_id": str(original.id), "seq": entry["seq"]}
        if entry["skipped"]:
            payload = skipped[entry["seq"]].payload or {}
            reused.append(NewEvent("step_skipped", entry["step_id"], None, {**payload, "reused_from": source}))
        else:
            payload = {k: v for k, v in (completed[entry["seq"]].payload or {}).items() if k != "ms"}
            payload.update(kind=entry["kind"], reused_from=source)
            reused.append(NewEvent("step_completed", entry["step_id"], 1, payload))
    link = {"run_id": str(original.id), "from_step": from_step, "by": by, "why": reason}
    with transaction.atomic():
        fork = _run_insert(
            workflow=original.workflow,
            input=plan["input"],
            created_by=by,
            forked_from=link,
            reused=reused,
            priority=original.priority,
        )
        events_append(
            run_id=original.id,
            events=[
                NewEvent(
                    "run_forked",
                    payload={
                        **audit.payload(),
                        "fork_run_id": str(fork.id),
                        "from_step": from_step,
                        "reused": [r["step_id"] for r in plan["reused"]],
                        "rerun": [r["step_id"] for r in plan["rerun"]],
                        "input_changed": plan["input_changed"],
                        **({"rerun_job": rerun_job} if rerun_job is not None else {}),
                    },
                )
            ],
            writer=by,
        )
        journal_head_advance(run_id=original.id)  # the original has usually ended: its recorded head moves
    return run_get(run_id=fork.id)
