"""A run's waterfall and what a re-drive or a retry of it would do now."""

from dataclasses import dataclass

from journal.models import JournalEvent
from journal.selectors import replay_rows_for_run, waterfall_bars
from pal.clock import db_now

from .. import leases
from ..code import is_code, steps_of
from ..errors import ServiceError, outcome_unknown
from ..graph import ancestors_of
from ..models import (
    FINAL_STATUSES,
    Run,
    SideEffect,
    SideEffectStatus,
)
from ..replay import MISSING, item_id, replay
from ..spend import NOTHING, attempt_spend
from ..workflows import step_policy
from .lists import lease_of


def run_waterfall(run: Run) -> list[dict]:
    return waterfall_bars(run_id=run.id)


def redrive_preview(run: Run) -> dict:
    """What a re-drive would do now: the steps it reuses (with the tokens and cost that saves), the steps it
    runs (again, under the same attempt and key when one had started), and the side effects it would claim
    again (webhooks, sent again with the same Idempotency-Key) or leave to an operator (unconfirmed email)."""
    # A graph's steps the same way: a skipped step is reused (its `when` is not evaluated again), and each item of
    # a for_each step ("{step}[{index}]", with item_of and index) is reused or runs on its own; the for_each step
    # itself is reused once every item was, and saves nothing of its own (its output is its items' outputs).
    states = replay(replay_rows_for_run(run_id=run.id))
    steps = steps_of(run)
    fan_outs = [step["id"] for step in steps if "for_each" in step]
    counts = {}  # a for_each step's number of items, journaled when its items began (its step_started)
    if fan_outs:
        started = JournalEvent.objects.filter(run_id=run.id, kind="step_started", step_id__in=fan_outs)
        for step_id, count in started.order_by("seq").values_list("step_id", "payload__items"):
            counts[step_id] = count
    reused, rerun = [], []
    saved = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}

    def reuse(step, sid, state, *, usage=True, **extra):
        spent = attempt_spend(step, state.output) if usage else NOTHING  # the one rule of spend (runs.spend)
        prompt, completion, cost = spent.prompt_tokens, spent.completion_tokens, spent.cost_usd
        reused.append(
            {
                "step_id": sid,
                "kind": step.get("kind"),
                "attempt": None if state.skipped else state.attempt,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "cost_usd": cost,
                **({"skipped": True} if state.skipped else {}),
                **extra,
            }
        )
        saved["prompt_tokens"] += prompt
        saved["completion_tokens"] += completion
        saved["cost_usd"] = round(saved["cost_usd"] + cost, 10)

    def run_again(step, sid, state, **extra):
        attempt, resumes = 1, False
        if state is not None:
            attempt = state.attempt
            if state.failure is not None:
                max_attempts, _ = step_policy(step)
                attempt = state.attempt + 1 if state.attempt < max_attempts else state.attempt
            else:
                resumes = state.started
        rerun.append({"step_id": sid, "kind": step.get("kind"), "attempt": attempt, "resumes": resumes, **extra})

    def fan_out(step, state):
        """A for_each step, then each of its items on its own. The step saves nothing of its own: its output is
        the list of its items' outputs, whose usage the items count."""
        count = counts.get(step["id"])
        count = count if isinstance(count, int) and not isinstance(count, bool) else None  # None: not begun
        if state is not None and state.output is not MISSING:
            reuse(step, step["id"], state, usage=False, items=count)
        else:
            run_again(step, step["id"], state, items=count)
        for index in range(count or 0):
            sid = item_id(step["id"], index)
            item = states.get(sid)
            if item is not None and item.output is not MISSING:
                reuse(step, sid, item, item_of=step["id"], index=index)
            else:
                run_again(step, sid, item, item_of=step["id"], index=index)

    for step in steps:
        state = states.get(step["id"])
        if "for_each" in step and not (state is not None and state.skipped):
            fan_out(step, state)
        elif state is not None and state.output is not MISSING:
            reuse(step, step["id"], state)
        else:
            run_again(step, step["id"], state)
    effects = redrive_effects(run)
    lease = lease_of(run)
    live = lease is not None and leases.lease_live(lease["expires_at"], now=db_now())
    return {
        "run_id": run.id,
        "status": run.status,
        "can_redrive": run.status not in FINAL_STATUSES,
        "needs_force": live,
        "lease": lease,
        "reused": reused,
        "rerun": rerun,
        "side_effects": effects,
        "saved": saved,
    }


def redrive_effects(run: Run) -> list[dict]:
    """The run's open side effects (claimed or unconfirmed), oldest first, each with what a re-drive does to it."""
    effects = []
    open_statuses = (SideEffectStatus.CLAIMED, SideEffectStatus.UNCONFIRMED)
    for effect in SideEffect.objects.filter(run_id=run.id, status__in=open_statuses).order_by("claimed_at"):
        if effect.status == SideEffectStatus.UNCONFIRMED:
            action = "left to an operator: it may have been sent before a crash and is not sent again"
        elif effect.channel == "webhook":
            action = "claimed, never confirmed: sent again with the same Idempotency-Key (the receiver dedups)"
        else:
            action = "claimed, never confirmed: not sent again; marked unconfirmed for an operator"
        effects.append(
            {
                "key": effect.key,
                "step_id": effect.step_id,
                "attempt": effect.attempt,
                "channel": effect.channel,
                "target": effect.target,
                "status": effect.status,
                "on_redrive": action,
            }
        )
    return effects


@dataclass(frozen=True)
class RetryPlan:
    """What a retry journals, a run_retried row each: (step or item id, the attempt it goes on with, the attempt
    it had); and, for a preview, the steps it reuses and the steps it runs."""

    rows: list[tuple[str, int, int]]
    reused: list[dict]
    rerun: list[dict]


def retry_plan(run: Run, *, failed: tuple[str, int] | None, from_step: str | None = None) -> RetryPlan:
    """What run_retry does to a failed run: every failed step or item goes on (first `failed`, the step and attempt
    the run failed in), and with from_step that step and every step after it in the graph run again, items too; the rest
    are reused. A definite failure or an outcome goes on with attempt + 1 (a new key), an unknown outcome with the
    same attempt and key (docs/reference/keys.md). 422 unknown_step naming from_step when the workflow has none."""
    again: set[str] = set()
    if from_step is not None:
        definition = run.workflow.definition or {}
        steps = definition.get("steps") or []
        ids = [step["id"] for step in steps]
        if is_code(definition) or from_step not in ids:
            mine = "a Python workflow's steps come from its code" if is_code(definition) else ", ".join(ids)
            raise ServiceError(
                f"from_step: {run.workflow.name} has no step {from_step!r} ({mine})", code="unknown_step", status=422
            )
        again = {from_step} | {sid for sid, ancestors in ancestors_of(steps).items() if from_step in ancestors}
    states = replay(replay_rows_for_run(run_id=run.id))
    rows: list[tuple[str, int, int]] = []
    if failed is not None:  # as the run's error says: the step and attempt it failed in
        step_id, attempt = failed
        rows.append((step_id, attempt if outcome_unknown(run.error) else attempt + 1, attempt))
    for sid, state in states.items():
        if failed is not None and sid == failed[0]:
            continue
        if state.failure is not None and state.output is MISSING:
            rows.append((sid, state.attempt if outcome_unknown(state.failure) else state.attempt + 1, state.attempt))
        elif sid.split("[", 1)[0] in again and state.output is not MISSING:
            rows.append((sid, state.attempt + 1, state.attempt))  # completed or skipped: it runs again
    goes_on = {sid: (attempt, had) for sid, attempt, had in rows}
    reused, rerun = [], []
    for step in steps_of(run):
        sid, known = step["id"], states.get(step["id"])
        items = sum(1 for other in goes_on if other.startswith(f"{sid}["))
        if known is not None and known.output is not MISSING and sid not in goes_on and not items:
            spent = attempt_spend(step, known.output)
            reused.append(
                {
                    "step_id": sid,
                    "kind": step.get("kind"),
                    "attempt": None if known.skipped else known.attempt,
                    "prompt_tokens": spent.prompt_tokens,
                    "completion_tokens": spent.completion_tokens,
                    "cost_usd": spent.cost_usd,
                    **({"skipped": True} if known.skipped else {}),
                }
            )
            continue
        attempt, had = goes_on.get(sid, (known.attempt if known is not None else 1, None))
        if sid in goes_on:
            why = "from_step" if sid == from_step else ("failed" if sid not in again else f"after {from_step}")
        else:
            why = "its items" if items else "not run yet"
        entry = {"step_id": sid, "kind": step.get("kind"), "attempt": attempt, "why": why, "same_key": attempt == had}
        rerun.append({**entry, "items": items} if items else entry)
    return RetryPlan(rows=rows, reused=reused, rerun=rerun)
