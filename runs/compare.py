"""Two runs side by side, step by step: GET /runs/{a}/compare/{b} and the page /runs/compare/?a=&b= (runs.
compare_pages). The typical pair is one workflow before and after a prompt change, or a run and its fork."""

# run_compare reads each run and its journal (the lean replay read: payloads of outcomes only); everything else here
# is pure shaping over those rows. Each step of either run's workflow (in the workflows' order, a step only one of
# them has where it stands in its own) and each item of a for_each step ("read[2]") gets a row with each run's side:
#
# - status: completed, failed, skipped, waiting, running, interrupted (the run ended around it), not_started; the
# side is null when that run's workflow version has no such step (or its for_each made no such item);
# - output (the current attempt's), ms (from the current attempt's first step_started to its outcome: a re-drive
# after a crash is inside it, earlier failed attempts and their back-off are not), tokens and cost_usd (the
# spend by the one rule, runs.spend, as the receipt counts it; a for_each step shows the sums of its items);
# - same_output (null when neither side has an output) and diff: the paths where the outputs differ.
#
# totals sum the steps' rows (a for_each step once, through its items) and give each run's own duration. Outputs and
# errors pass through runs.secrets.mask like every page, so a configured secret that reached one is never shown.

import difflib
import json
import re
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from journal.receipts import ITEM_ID
from journal.selectors import ReplayRow, replay_rows_for_run

from .models import FINAL_STATUSES, Run
from .replay import MISSING, StepState, replay
from .secrets import mask
from .services import run_get
from .spend import NOTHING, attempt_spend

MAX_DIFF = 100  # paths listed per step; past it the diff says it was cut
MAX_TEXT_DIFF = 20_000  # characters per side that text_diff compares word by word (it is quadratic at worst)


def run_compare(*, a, b) -> dict:
    """The contract's answer for runs a and b. Raises NotFound naming a run that does not exist."""
    first, second = run_get(run_id=a), run_get(run_id=b)
    return compare_shape(first, replay_rows_for_run(run_id=first.id), second, replay_rows_for_run(run_id=second.id))


# --- one run's steps ---------------------------------------------------------------------------------


def _declared(run: Run) -> list[dict]:
    steps = (run.workflow.definition or {}).get("steps") or []
    return [s for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)]


def _status(state: StepState | None, *, run_ended: bool) -> str:
    if state is None:
        return "not_started"
    if state.skipped:
        return "skipped"
    if state.output is not MISSING:
        return "completed"
    if state.failure is not None:
        return "failed"
    if state.waiting:
        return "waiting"
    if state.started:
        return "interrupted" if run_ended else "running"
    return "not_started"


def _timings(rows: list[ReplayRow]) -> tuple[dict, dict, dict]:
    """(first step_started, outcome time, reused_from) of each (step id, attempt) in the journal."""
    started: dict[tuple, Any] = {}
    ended: dict[tuple, Any] = {}
    reused: dict[tuple, Any] = {}
    for row in rows:
        if row.step_id is None:
            continue
        at = (row.step_id, row.attempt)
        if row.kind == "step_started":
            started.setdefault(at, row.created_at)
        elif row.kind in ("step_completed", "step_failed"):
            ended[at] = row.created_at
            payload = row.payload if isinstance(row.payload, dict) else {}
            if row.kind == "step_completed" and isinstance(payload.get("reused_from"), dict):
                reused[at] = payload["reused_from"]
    return started, ended, reused


def _side(step: dict, state: StepState | None, timings: tuple, *, run_ended: bool, sid: str) -> dict:
    started, ended, reused = timings
    status = _status(state, run_ended=run_ended)
    output = mask(state.output) if state is not None and state.output is not MISSING else None
    failure = mask(state.failure) if state is not None and state.failure is not None else None
    at = (sid, state.attempt) if state is not None and not state.skipped else None
    ms = None
    if at is not None and at in started and at in ended and status in ("completed", "failed"):
        ms = max(round((ended[at] - started[at]).total_seconds() * 1000), 0)
    spent = NOTHING
    if status == "completed" and state is not None:
        spent = attempt_spend(step, state.output, reused=at is not None and at in reused)
    return {
        "status": status,
        "attempt": None if state is None or state.skipped else state.attempt,
        "output": output,
        "error": {k: failure.get(k) for k in ("message", "code") if k in failure} if failure else None,
        "ms": ms,
        **spent.as_dict(),
        "reused_from": reused.get(at) if at is not None else None,
        "has_output": status in ("completed", "skipped"),
    }


def run_steps(run: Run, rows: list[ReplayRow]) -> dict[str, dict]:
    """step id -> its side, and for each item "{step}[{index}]" -> its side (with item_of and index)."""
    states = replay(rows)
    timings = _timings(rows)
    ended = run.status in FINAL_STATUSES
    sides: dict[str, dict] = {}
    for step in _declared(run):
        sid = step["id"]
        side = _side(step, states.get(sid), timings, run_ended=ended, sid=sid)
        if "for_each" in step:
            items = sorted(
                (int(m["index"]), key) for key in states if (m := ITEM_ID.match(key)) is not None and m["step"] == sid
            )
            for index, key in items:
                item = _side(step, states[key], timings, run_ended=ended, sid=key)
                sides[key] = {**item, "item_of": sid, "index": index}
                for total in ("prompt_tokens", "completion_tokens", "tokens"):
                    side[total] += item[total]
                side["cost_usd"] = round(side["cost_usd"] + item["cost_usd"], 10)
            side["items"] = len(items)
        sides[sid] = side
    return sides


# --- two runs -----------------------------------------------------------------------------------------


def step_order(first: list[str], second: list[str]) -> list[str]:
    """The first run's steps in order, each step only the second has placed after the step it follows there."""
    order = list(first)
    for position, sid in enumerate(second):
        if sid in order:
            continue
        before = next((order.index(p) for p in reversed(second[:position]) if p in order), -1)
        order.insert(before + 1, sid)
    return order


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, cls=DjangoJSONEncoder, ensure_ascii=False)


def output_diff(a, b, *, path: str = "", found: list | None = None) -> list[dict]:
    """Where two JSON values differ: [{path, change: changed | added | removed, a, b}] (path like
    "usage.prompt_tokens" or "items[2]"; "" is the whole value), at most MAX_DIFF entries."""
    found = [] if found is None else found
    if len(found) >= MAX_DIFF:
        return found
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in b:
                found.append({"path": sub, "change": "removed", "a": a[key], "b": None})
            elif key not in a:
                found.append({"path": sub, "change": "added", "a": None, "b": b[key]})
            else:
                output_diff(a[key], b[key], path=sub, found=found)
            if len(found) >= MAX_DIFF:
                break
    elif isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            sub = f"{path}[{index}]"
            if index >= len(b):
                found.append({"path": sub, "change": "removed", "a": a[index], "b": None})
            elif index >= len(a):
                found.append({"path": sub, "change": "added", "a": None, "b": b[index]})
            else:
                output_diff(a[index], b[index], path=sub, found=found)
            if len(found) >= MAX_DIFF:
                break
    elif _canonical(a) != _canonical(b):
        found.append({"path": path, "change": "changed", "a": a, "b": b})
    return found[:MAX_DIFF]


def _pair(sid: str, side_a: dict | None, side_b: dict | None, kind: str | None) -> dict:
    row: dict[str, Any] = {"step_id": sid, "kind": kind, "a": side_a, "b": side_b, "same_output": None, "diff": []}
    has_a, has_b = bool(side_a and side_a["has_output"]), bool(side_b and side_b["has_output"])
    out_a = side_a["output"] if side_a and has_a else None
    out_b = side_b["output"] if side_b and has_b else None
    if has_a and has_b:
        row["same_output"] = _canonical(out_a) == _canonical(out_b)
        row["diff"] = [] if row["same_output"] else output_diff(out_a, out_b)
    elif has_a or has_b:  # one run has an output where the other has none (failed, not run, not in its workflow)
        row["same_output"] = False
        row["diff"] = [{"path": "", "change": "removed" if has_a else "added", "a": out_a, "b": out_b}]
    row["diff_cut"] = len(row["diff"]) >= MAX_DIFF
    return row


def _totals(run: Run, sides: dict[str, dict]) -> dict:
    steps = [side for side in sides.values() if "item_of" not in side]
    ms = None
    if run.started_at and run.finished_at:
        ms = max(round((run.finished_at - run.started_at).total_seconds() * 1000), 0)
    return {
        "status": run.status,
        "ms": ms,
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
        "completion_tokens": sum(s["completion_tokens"] for s in steps),
        "tokens": sum(s["tokens"] for s in steps),
        "cost_usd": round(sum(s["cost_usd"] for s in steps), 10),
        "steps_completed": sum(1 for s in steps if s["status"] == "completed"),
        "steps_failed": sum(1 for s in steps if s["status"] == "failed"),
    }


def run_brief(run: Run) -> dict:
    """A run's identity and times, as the waterfall and a comparison show it (RunBriefOut)."""
    return {
        "id": run.id,
        "workflow": run.workflow.name,
        "version": run.workflow.version,
        "status": run.status,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def compare_shape(run_a: Run, rows_a: list[ReplayRow], run_b: Run, rows_b: list[ReplayRow]) -> dict:
    """{runs: {a, b}, steps: [...], totals: {a, b}} from the two runs and their journals' rows."""
    sides_a, sides_b = run_steps(run_a, rows_a), run_steps(run_b, rows_b)
    kinds = {s["id"]: s.get("kind") for s in [*_declared(run_b), *_declared(run_a)]}
    fan_outs = {s["id"] for s in [*_declared(run_a), *_declared(run_b)] if "for_each" in s}
    order = step_order([s["id"] for s in _declared(run_a)], [s["id"] for s in _declared(run_b)])
    rows = []
    for sid in order:
        rows.append(_pair(sid, sides_a.get(sid), sides_b.get(sid), kinds.get(sid)))
        if sid in fan_outs:
            indices = sorted({s["index"] for s in [*sides_a.values(), *sides_b.values()] if s.get("item_of") == sid})
            for index in indices:
                key = f"{sid}[{index}]"
                item = _pair(key, sides_a.get(key), sides_b.get(key), kinds.get(sid))
                rows.append({**item, "item_of": sid, "index": index})
    return {
        "runs": {"a": run_brief(run_a), "b": run_brief(run_b)},
        "same_workflow": run_a.workflow.name == run_b.workflow.name,
        "steps": rows,
        "totals": {"a": _totals(run_a, sides_a), "b": _totals(run_b, sides_b)},
    }


# --- a readable text diff (the page) -----------------------------------------------------------------

_WORDS = re.compile(r"\s+|\w+|[^\w\s]")


def text_diff(a: str, b: str) -> list[tuple[str, str]] | None:
    """Two texts word by word: [(same | del | add, text)], for a model's answer before and after a prompt change.
    None when either is longer than MAX_TEXT_DIFF characters (the page then shows both as they are)."""
    if len(a) > MAX_TEXT_DIFF or len(b) > MAX_TEXT_DIFF:
        return None
    words_a, words_b = _WORDS.findall(a), _WORDS.findall(b)
    segments: list[tuple[str, str]] = []

    def add(op: str, text: str) -> None:
        if not text:
            return
        if segments and segments[-1][0] == op:
            segments[-1] = (op, segments[-1][1] + text)
        else:
            segments.append((op, text))

    matcher = difflib.SequenceMatcher(None, words_a, words_b, autojunk=False)
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            add("same", "".join(words_a[a0:a1]))
        else:
            add("del", "".join(words_a[a0:a1]))
            add("add", "".join(words_b[b0:b1]))
    return segments
