"""One step of a run as an operator reads it: every attempt (and every item of a for_each step) with its input,
output, error, timing, tokens, cost, key, side effects and child run. GET /runs/{id}/steps/{step_id} answers it
and the run page's step panel (runs.pages.step) draws it."""

# Three reads: the step's journal rows (its own and its items', "{step}[{index}]", by run_id and step id prefix,
# only the kinds a step's story is made of), its side_effects rows and its child runs. What comes out goes through
# runs.secrets.mask, so a secret value that reached a payload anyway is never shown.
#
# An attempt's input is its first step_started's payload.input (the step's rendered input, secret-named keys
# already redacted; a re-execution after a crash, resumed=true, does not journal it again; rows from before step
# inputs have none: null). `executions` counts the step_started rows of the attempt (more than one after a crash).

import re
from datetime import datetime
from typing import Any

from django.db.models import Q

from journal.models import JournalEvent
from journal.receipts import ITEM_ID, USAGE_KINDS, redact_target

from .code import steps_of
from .errors import NotFound
from .graph import needs_of
from .models import FINAL_STATUSES, Run, RunStatus, SideEffect
from .replay import step_key
from .secrets import mask
from .spend import attempt_spend
from .waiting import waits_of

# The journal kinds a step's attempts are folded from (every other kind of the step's rows is left unread).
STEP_KINDS = (
    "step_started",
    "step_completed",
    "step_failed",
    "step_skipped",
    "step_retrying",
    "run_waiting",
    "run_resumed",
    "child_created",
    "child_adopted",
)


def on_step(field: str, step_id: str, *, with_items: bool) -> Q:
    """Rows of this step id, and of its items ("{step}[...]") too when with_items."""
    exact = Q(**{field: step_id})
    return exact | Q(**{f"{field}__startswith": f"{step_id}["}) if with_items else exact


# A tool call of an agent loop (an llm_call with tools): "{step}[{turn}.{n}]" (runs.steps.llm_loop).
TOOL_CALL_ID = re.compile(r"^(?P<step>.+)\[(?P<turn>[0-9]{1,3})\.(?P<n>[0-9]{1,4})\]$")
TOOL_CALL_KINDS = ("step_started", "step_completed", "step_failed", "approval_decided")


def split_item(step_id: str) -> tuple[str, int | None]:
    """("read", 3) for the item id "read[3]"; (step_id, None) for a step's own id."""
    match = ITEM_ID.match(step_id)
    return (match["step"], int(match["index"])) if match else (step_id, None)


def step_detail(*, run: Run, step_id: str) -> dict:
    """The contract's answer for one step (or one item "read[3]") of the run: {run_id, step_id, kind, needs,
    items, attempts}. A for_each step lists its own attempt (item null; its output is the list of its items'
    outputs, its tokens and cost are counted on the items) and then each item's attempts (item = index); a
    skipped step has one entry with status "skipped". NotFound names a step the workflow does not have."""
    steps = steps_of(run)
    by_id = {s["id"]: s for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)}
    base, index = split_item(step_id)
    step = by_id.get(base)
    call = TOOL_CALL_ID.match(step_id)
    if step is None and call and (by_id.get(call["step"]) or {}).get("kind") == "llm_call":
        step = {"id": step_id, "kind": "tool_call"}  # a tool call of an agent loop: an attempt of its own
    if step is None:
        raise NotFound(f"run {run.id} has no step {step_id!r} (its steps: {', '.join(by_id)})", code="step_not_found")
    fan_out = "for_each" in step
    if index is not None and not fan_out:
        raise NotFound(f"step {base!r} of run {run.id} has no items (it is not a for_each step)", code="step_not_found")
    if index is not None:
        step_id = f"{base}[{index}]"  # as the journal writes it: "read[007]" is read[7]

    with_items = fan_out and index is None
    rows_of = on_step("step_id", step_id, with_items=with_items)
    if index is not None:  # of an item's step, only the step_started that says how many items there are
        rows_of |= Q(step_id=base, kind="step_started")
    rows = (
        JournalEvent.objects.filter(run_id=run.id, kind__in=STEP_KINDS)
        .filter(rows_of)
        .order_by("seq")
        .values_list("seq", "kind", "step_id", "attempt", "payload", "created_at")
    )
    attempts, items = fold_attempts(run, rows, step=step, only=step_id)
    if index is not None and not attempts and (items is None or index >= items):
        counted = f"{base} has {items} items" if items is not None else f"{base} has not started its items"
        raise NotFound(f"run {run.id} has no item {step_id!r} ({counted})", code="step_not_found")

    if step.get("kind") == "llm_call":  # an agent loop's turns (a Python workflow's steps do not say their fields)
        attach_turns(run, attempts, step_id)
    side_effects = side_effects_of(run, on_step("step_id", step_id, with_items=with_items))
    children = children_of(run, on_step("parent_step_id", step_id, with_items=with_items))
    for entry in attempts:
        where = (entry["step_id"], entry["attempt"])
        entry["side_effects"] = side_effects.get(where, [])
        child = children.get(where)
        if child is not None:
            entry["child_run_id"] = entry["child_run_id"] or child["id"]
            entry["child_status"] = child["status"]
    return mask(
        {
            "run_id": run.id,
            "step_id": step_id,
            "kind": step["kind"],
            "needs": needs_of(steps).get(base, []),
            "items": items,
            "attempts": attempts,
        }
    )


def new_attempt(run: Run, step_id: str, attempt: int | None, item: int | None) -> dict[str, Any]:
    return {
        "step_id": step_id,
        "attempt": attempt,
        "item": item,
        "key": step_key(run.id, step_id, attempt) if attempt is not None else None,
        "status": "running",
        "input": None,
        "output": None,
        "error": None,
        "started_at": None,
        "ended_at": None,
        "ms": None,
        "tokens": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "model": None,
        "executions": 0,
        "tries": [],
        "waiting_on": None,
        "reused_from": None,
        "skipped": None,
        "side_effects": [],
        "child_run_id": None,
        "child_status": None,
        "turns": None,
    }


def fold_attempts(run: Run, rows, *, step: dict, only: str) -> tuple[list[dict], int | None]:
    """The attempts in order (the step's own, then its items' by index and attempt) and the for_each step's item
    count (None when it has not said). `only`: the step id asked for; the item count alone is read from others."""
    found: dict[tuple[str, int | None], dict] = {}
    items: int | None = None
    for _seq, kind, sid, attempt, payload, at in rows:
        payload = payload if isinstance(payload, dict) else {}
        if kind == "step_started" and isinstance(payload.get("items"), int):
            items = payload["items"]
        if sid != only and not sid.startswith(f"{only}["):
            continue
        item = split_item(sid)[1]
        if kind == "step_skipped":
            entry = found.setdefault((sid, None), new_attempt(run, sid, None, item))
            entry.update(status="skipped", started_at=at, ended_at=at, ms=0.0)
            entry["skipped"] = {"when": payload.get("when"), "value": payload.get("value")}
            continue
        if (sid, attempt) not in found:
            found[(sid, attempt)] = new_attempt(run, sid, attempt, item)
        entry = found[(sid, attempt)]
        apply_row(entry, kind, payload, at)
    for entry in found.values():
        finish(entry, run, step=step)
    ordered = sorted(found.values(), key=lambda e: (e["item"] is not None, e["item"] or 0, e["attempt"] or 0))
    return ordered, items


def apply_row(entry: dict, kind: str, payload: dict, at: datetime) -> None:
    """One journal row of an attempt, folded into its entry."""
    if kind == "step_started":
        entry["executions"] += 1
        entry["started_at"] = entry["started_at"] or at
        entry["key"] = payload.get("key") or entry["key"]
        if entry["input"] is None and "input" in payload:
            entry["input"] = payload["input"]
        if entry["status"] not in ("completed", "failed"):
            entry["status"] = "running"
    elif kind == "step_completed":
        entry.update(status="completed", ended_at=at, output=payload.get("output"), ms=payload.get("ms"))
        entry["reused_from"] = payload.get("reused_from")
        entry["child_run_id"] = payload.get("child_run_id") or entry["child_run_id"]
    elif kind == "step_failed":
        entry.update(status="failed", ended_at=at, ms=payload.get("ms"))
        entry["error"] = {k: v for k, v in payload.items() if k != "ms"}
    elif kind == "step_retrying":  # an outcome we could not know: the same attempt and key tried again
        entry["tries"].append({"at": at, "message": payload.get("message"), "code": payload.get("code")})
    elif kind == "run_waiting" and entry["status"] == "running":
        entry["status"], entry["waiting_on"] = "waiting", payload.get("waiting_on")
    elif kind == "run_resumed" and entry["status"] == "waiting":
        entry["status"] = "running"
    elif kind in ("child_created", "child_adopted"):
        entry["child_run_id"] = payload.get("child_run_id") or payload.get("run_id") or entry["child_run_id"]


def finish(entry: dict, run: Run, *, step: dict) -> None:
    """What the rows leave to work out: an attempt the run's end stopped, its duration, its tokens and cost."""
    if entry["status"] in ("running", "waiting") and run.status in FINAL_STATUSES:
        entry["status"] = "cancelled" if run.status == RunStatus.CANCELLED else "interrupted"
    if entry["ms"] is None and entry["started_at"] and entry["ended_at"]:
        entry["ms"] = round((entry["ended_at"] - entry["started_at"]).total_seconds() * 1000, 3)
    if entry["status"] == "completed":  # by the one rule of spend (runs.spend): a fork's reused step spent nothing
        entry.update(attempt_spend(step, entry["output"], reused=isinstance(entry["reused_from"], dict)).as_dict())
        if (
            step.get("kind") in USAGE_KINDS
            and isinstance(entry["output"], dict)
            and isinstance(entry["output"].get("model"), str)
        ):
            entry["model"] = entry["output"]["model"]


def attach_turns(run: Run, attempts: list[dict], step_id: str) -> None:
    """An agent loop's turns on each of its attempts, as its journal has them so far (llm_turn rows), each tool call
    with its item's status, key, arguments (and the model's, when an operator edited them), result or error."""
    rows = (
        JournalEvent.objects.filter(run_id=run.id)
        .filter(Q(step_id=step_id, kind="llm_turn") | Q(step_id__startswith=f"{step_id}[", kind__in=TOOL_CALL_KINDS))
        .order_by("seq")
        .values_list("kind", "step_id", "attempt", "payload")
    )
    turns: dict[int | None, dict[int, dict]] = {}  # attempt -> turn -> the turn
    calls: dict[tuple[int | None, str | None], dict] = {}  # (attempt, call step id) -> what its rows say
    for kind, sid, attempt, payload in rows:
        payload = payload if isinstance(payload, dict) else {}
        if kind == "llm_turn":
            if isinstance(payload.get("turn"), int):
                turns.setdefault(attempt, {})[payload["turn"]] = payload
            continue
        call = calls.setdefault((attempt, sid), {"status": "running"})
        if kind == "step_started":
            call.setdefault("key", payload.get("key"))
            call.setdefault("input", payload.get("input"))
        elif kind == "step_completed":
            call.update(status="completed", result=payload.get("output"))
        elif kind == "step_failed":
            call.update(status="failed", error={k: v for k, v in payload.items() if k != "ms"})
        elif kind == "approval_decided":
            call["decision"] = payload
    waits = {w.get("step_id") for w in waits_of(run.waiting_on) if w.get("kind") == "approval"}
    for entry in attempts:
        if entry["step_id"] != step_id or entry["attempt"] not in turns:
            continue
        entry["turns"] = []
        for number, turn in sorted(turns[entry["attempt"]].items()):
            usage: dict = turn["usage"] if isinstance(turn.get("usage"), dict) else {}
            shown = []
            for n, asked in enumerate(turn.get("tool_calls") or []):
                sid = f"{step_id}[{number}.{n}]"
                found: dict = calls.get((entry["attempt"], sid)) or {
                    "status": "waiting" if sid in waits else "not started"
                }
                given = found["input"] if isinstance(found.get("input"), dict) else {}
                shown.append(
                    {
                        "step_id": sid,
                        "name": asked.get("name"),
                        "arguments": given.get("args", asked.get("arguments")),
                        "asked": given.get("asked"),
                        "key": found.get("key") or f"{run.id}:{sid}:{entry['attempt']}",
                        "status": found["status"],
                        "result": found.get("result"),
                        "error": found.get("error"),
                        "decision": found.get("decision"),
                    }
                )
            entry["turns"].append(
                {
                    "turn": number,
                    "key": turn.get("key"),
                    "message": turn.get("message"),
                    "tool_calls": shown,
                    "prompt_tokens": int(usage.get("prompt_tokens") or 0),
                    "completion_tokens": int(usage.get("completion_tokens") or 0),
                    "cost_usd": float(turn.get("cost_usd") or 0.0),
                }
            )


def side_effects_of(run: Run, on: Q) -> dict[tuple[str, int], list[dict]]:
    """The step's side effects by (step_id, attempt), oldest claim first; a webhook URL without credentials."""
    found: dict[tuple[str, int], list[dict]] = {}
    effects = (
        SideEffect.objects.filter(run_id=run.id)
        .filter(on)
        .order_by("claimed_at", "id")
        .values("key", "step_id", "attempt", "channel", "target", "status", "claimed_at", "delivered_at", "response")
    )
    for row in effects:
        effect: dict[str, Any] = dict(row)
        where = (effect.pop("step_id"), effect.pop("attempt"))
        effect["target"] = redact_target(effect["target"])
        found.setdefault(where, []).append(effect)
    return found


def children_of(run: Run, on: Q) -> dict[tuple[str | None, int | None], dict]:
    """The step's child runs (a child_run step; one per item of a for_each child_run) by (step_id, attempt)."""
    rows = (
        Run.objects.filter(parent_run_id=run.id).filter(on).values("id", "parent_step_id", "parent_attempt", "status")
    )
    return {(row["parent_step_id"], row["parent_attempt"]): dict(row) for row in rows}
