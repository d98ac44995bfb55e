"""Deciding an approval: by a person (the API, the pages), through a notification's signed link, or by the engine at
its deadline. A decision is for one run, step (or item) and attempt; it is checked (the assignee, the answer against
the form, the choice) before anything is journaled, and only one decision of an attempt counts."""

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils.dateparse import parse_datetime

from journal.models import JournalEvent
from journal.selectors import replay_rows_for_step
from journal.services import NewEvent, events_append
from pal.clock import db_now

from ..code import is_code
from ..decision_links import LinkExpired, LinkInvalid, link_hash, link_read
from ..decisions import TIMED_OUT, assignee_text, may_decide, timeout_decision, typed_answer
from ..errors import Conflict, NotFound, ServiceError
from ..models import Run, RunStatus
from ..replay import MISSING, StepState, replay
from ..selectors import approval_open
from ..steps.tools import TOOLS, ArgumentsInvalid
from ..waiting import waits_of
from .ingest import run_get
from .wakeups import run_wake

VIA = ("user", "link", "timeout")


def approval_decide(
    *,
    run_id,
    step_id: str,
    approved: bool,
    by: str,
    comment: str = "",
    attempt: int | None = None,
    arguments: dict | None = None,
    answer: dict | None = None,
    choice: str | None = None,
    user: Any = None,
    via: str = "user",
    link: str = "",
) -> Run:
    """Record a decision on an open approval; one decision of an attempt counts, even when two arrive at once.
    `attempt`: the one decided (else the one open now). A person (`via` "user": `user`, else the user named `by`)
    must be its assignee or a superuser (403 not_assignee); `answer` must fit its form and `choice` be one of its
    choices (422 invalid_answer); a tool call's edited `arguments` its tool's hints (422 invalid_arguments). Another
    attempt, a decided one, an unknown step: 409 not_waiting_on_approval, saying which."""
    assert via in VIA, via
    run = run_get(run_id=run_id)
    request = approval_open(run, step_id)
    if request is None or (attempt is not None and attempt != request.get("attempt")):
        raise _refusal(run, step_id, attempt)
    attempt = request.get("attempt")
    if (
        via == "user"
        and request.get("assign")
        and not may_decide(request, user if user is not None else _user_named(by))
    ):
        raise ServiceError(
            f"approval {step_id!r} of run {run_id} is assigned to {assignee_text(request)}: {by} may not decide it",
            code="not_assignee",
            status=403,
        )
    if arguments is not None:
        _arguments_check(request, step_id, arguments)
    decision: dict[str, Any] = {"approved": bool(approved), "by": by, "comment": comment or "", "attempt": attempt}
    decision.update(typed_answer(request, approved=bool(approved), answer=answer, choice=choice))
    if arguments is not None:
        decision["arguments"] = arguments
    if via != "user":
        decision["via"] = via
    if via == "timeout":
        decision["timed_out"] = True
    if link:
        decision["link"] = link  # the link's hash: the token itself is never stored
    if run.status == RunStatus.RUNNING and _decide_in_walk(run_id=run.id, step_id=step_id, decision=decision):
        return run_get(run_id=run_id)
    run = run_get(run_id=run_id)  # it may have parked meanwhile: then the decision wakes it
    woke = run.status == RunStatus.WAITING and run_wake(
        run_id=run_id,
        by=by,
        why=f"approval {step_id} {'approved' if approved else 'rejected'}",
        expect={"kind": "approval", "step_id": step_id, "attempt": attempt},  # a race with a retry cannot win
        extra_events=[("approval_decided", decision)],
    )
    if not woke:
        raise _refusal(run_get(run_id=run_id), step_id, attempt)
    return run_get(run_id=run_id)


def _step_state(run_id, step_id: str) -> StepState | None:
    # That step's rows alone fold into its state (runs.replay).
    return replay(replay_rows_for_step(run_id=run_id, step_id=step_id)).get(step_id)


def _open(state: StepState) -> bool:
    return (
        state.output is MISSING
        and state.failure is None
        and "approval_requested" in state.events
        and "approval_decided" not in state.events
    )


def _user_named(username: str) -> Any:
    return get_user_model().objects.filter(username=username).first()


def _decide_in_walk(*, run_id, step_id: str, decision: dict) -> bool:
    """A decision on an approval of a graph's branch that parked while other branches still move (the run is
    running): journal it, if the journal shows that attempt requested and undecided. The walk reads it when it would
    park the run (runs.walk.walk.Walk.go_waiting writes the status first, then looks, so a decision committed before
    that look is seen; one after finds the run waiting and wakes it). The run's row is locked meanwhile."""
    with transaction.atomic():
        status = Run.objects.select_for_update(no_key=True).filter(id=run_id).values_list("status", flat=True).first()
        if status != RunStatus.RUNNING:
            return False
        state = _step_state(run_id, step_id)  # read under the lock
        if state is None or not _open(state) or decision["attempt"] != state.attempt:
            return False
        events_append(
            run_id=run_id,
            events=[NewEvent("approval_decided", step_id, state.attempt, decision)],
            writer=decision["by"],
        )
    return True


def _arguments_check(request: dict, step_id: str, arguments: Any) -> None:
    """Edited arguments fit the tool the run waits to call (runs.steps.tools): else 422 invalid_arguments naming the
    field."""
    registered = TOOLS.get(request.get("tool") or "")
    if registered is None:
        raise ServiceError(
            f"approval {step_id!r} is not a tool call's: it takes no arguments", code="invalid_arguments", status=422
        )
    try:
        registered.checked(arguments)
    except ArgumentsInvalid as exc:
        raise ServiceError(
            f"arguments.{exc.field}: {exc.message} (tool {registered.name})", code="invalid_arguments", status=422
        ) from None


# --- refusals -------------------------------------------------------------------------------------


def _refusal(run: Run, step_id: str, attempt: int | None) -> ServiceError:
    """Why a decision on this approval cannot count, never silence: 409 not_waiting_on_approval saying so when the run
    has no such step, else what the run does instead (and who decided that attempt, if it was)."""
    if not _has_step(run, step_id):
        return Conflict(
            f"run {run.id} does not wait on approval {step_id!r}: its workflow has no such step",
            code="not_waiting_on_approval",
        )
    decided = _decided(run.id, step_id, attempt)
    return Conflict(
        f"run {run.id} does not wait on approval {step_id!r}"
        + (f" attempt {attempt}" if attempt is not None else "")
        + decided
        + _not_waiting_why(run),
        code="not_waiting_on_approval",
    )


def _has_step(run: Run, step_id: str) -> bool:
    """A step (or an item, or a tool call, of one) of the run's workflow; a Python workflow's steps are those its
    journal has."""
    base = step_id.split("[", 1)[0]
    definition = run.workflow.definition or {}
    if not is_code(definition) and any(step.get("id") == base for step in definition.get("steps") or []):
        return True
    return JournalEvent.objects.filter(run_id=run.id, step_id=step_id).exists()


def _decided(run_id, step_id: str, attempt: int | None) -> str:
    """ ", decided already: rejected by alice" for an attempt that was decided (the last one, without an attempt)."""
    rows = JournalEvent.objects.filter(run_id=run_id, step_id=step_id, kind="approval_decided")
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    last = rows.order_by("-seq").first()
    if last is None or not isinstance(last.payload, dict):
        return ""
    verb = "approved" if last.payload.get("approved") else "rejected"
    return f": attempt {last.attempt} was decided already, {verb} by {last.payload.get('by')}"


def _not_waiting_why(run: Run) -> str:
    """What the run does instead of waiting on the approval, for the 409 of a decision that came too soon or late."""
    waiting_on = run.waiting_on
    if waiting_on and waiting_on.get("kind") == "concurrency":
        return (
            f" (it is queued on its concurrency group {waiting_on.get('key')!r}, {waiting_on.get('running')} of"
            f" {waiting_on.get('max_runs')} running: decide once a slot frees and the run waits on the approval again)"
        )
    if waiting_on:
        attempt = f" attempt {waiting_on['attempt']}" if waiting_on.get("attempt") is not None else ""
        return f" (it waits on {waiting_on.get('kind')} {waiting_on.get('step_id')}{attempt})"
    if run.status == RunStatus.RUNNING:
        return f" (it is {run.status}: its other branches are still moving; decide once the run waits)"
    return f" (it is {run.status})"


# --- links and deadlines --------------------------------------------------------------------------


def approval_decide_by_link(
    *, token: str, approved: bool, comment: str = "", answer: dict | None = None, choice: str | None = None
) -> Run:
    """Decide through a notification's signed link, without a login, when the approval allows it (link_decides):
    404 link_invalid (not signed here), 410 link_expired, 410 link_used (that attempt is decided: a link decides
    once), 403 link_not_allowed. Journaled by "link" with the link's hash."""
    link = approval_link_open(token=token)
    if not link["request"].get("link_decides"):
        raise ServiceError(
            "this approval is decided by a logged-in operator: its link only opens it",
            code="link_not_allowed",
            status=403,
        )
    try:
        return approval_decide(
            run_id=link["run"].id,
            step_id=link["step_id"],
            approved=approved,
            by="link",
            comment=comment,
            attempt=link["attempt"],
            answer=answer,
            choice=choice,
            via="link",
            link=link_hash(token),
        )
    except Conflict as exc:  # decided in between
        raise ServiceError(f"this link was used already: {exc.detail}", code="link_used", status=410) from None


def approval_link_open(*, token: str) -> dict:
    """What a signed link opens: {run, step_id, attempt, request} of its approval while that attempt is open; the
    link's refusals as approval_decide_by_link says."""
    try:
        link = link_read(token)
    except LinkInvalid as exc:
        raise NotFound(str(exc), code="link_invalid") from None
    except LinkExpired as exc:
        raise ServiceError(str(exc), code="link_expired", status=410) from None
    try:
        run = run_get(run_id=link.run_id)
    except NotFound:
        raise NotFound("the run of this link does not exist any more", code="link_invalid") from None
    request = approval_open(run, link.step_id)
    if request is None or request.get("attempt") != link.attempt:
        decided = _decided(run.id, link.step_id, link.attempt)
        raise ServiceError(
            f"this link was used already, or its decision taken otherwise{decided or f' (the run is {run.status})'}",
            code="link_used",
            status=410,
        )
    return {"run": run, "step_id": link.step_id, "attempt": link.attempt, "request": request}


def approvals_time_out(*, run_id, waiting_on: Any) -> bool:
    """Decide, by "timeout", every approval of the run whose deadline has passed by the database's clock, as its
    on_timeout says (reject by default). True when one was decided (the run woke)."""
    now = db_now()
    decided = False
    for wait in waits_of(waiting_on):
        deadline = parse_datetime(wait["deadline"]) if wait.get("kind") == "approval" and wait.get("deadline") else None
        if deadline is None or deadline > now:
            continue
        decision = timeout_decision(wait, seconds=wait.get("timeout_seconds"))
        try:
            approval_decide(
                run_id=run_id,
                step_id=wait["step_id"],
                approved=decision["approved"],
                by=TIMED_OUT,
                comment=decision["comment"],
                attempt=wait.get("attempt"),
                answer=decision.get("answer"),
                choice=decision.get("choice"),
                via="timeout",
            )
            decided = True
        except Conflict:
            continue  # someone decided it first
    return decided
