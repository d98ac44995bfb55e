"""An operator's decision on a claimed-but-unconfirmed side effect: marked delivered, or sent again."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from journal.selectors import replay_rows_for_run
from journal.services import (
    NewEvent,
    events_append,
)
from pal.clock import db_now

from .. import leases, selectors
from ..audit import Audit
from ..errors import Conflict, NotFound, ServiceError, StepError
from ..models import (
    FINAL_STATUSES,
    SideEffect,
    SideEffectStatus,
)
from ..replay import MISSING, replay
from ..steps.base import StepContext, get_kind
from ..workflows import step_invoke
from .actions import journal_head_advance, run_redrive

# --- side effects: an operator's decision on a claimed-but-unconfirmed one ------------------------

SIDE_EFFECT_DECISIONS = ("mark_delivered", "send_again")


def side_effect_resolve(*, key: str, decision: str, by: str, reason: str):
    """Settle a side effect that was claimed and never confirmed (status claimed or unconfirmed), journaled on
    its run as side_effect_resolved with who and why. Returns the side effect as it is afterwards."""
    # mark_delivered: the operator checked that it arrived (or that it must not go out): it becomes delivered and
    # nothing is sent.
    # send_again:
    # - a webhook whose step attempt is still open in a run that has not ended: the run is re-driven; its deliver
    # step sends the webhook again with the same Idempotency-Key (the receiver dedups) and confirms it itself;
    # - otherwise (an email, which a re-drive never sends again; or a webhook whose run went on or ended): it is
    # sent now, from here, through the deliver step's own code with the same key (the same Message-ID for an
    # email, the same Idempotency-Key for a webhook), and takes the status the peer's answer gives.
    # A side effect still `claimed` by a run that a live lease holds is refused: its worker may be sending it now.
    # Two decisions at once: a conditional update lets one through and the other gets a Conflict.
    if decision not in SIDE_EFFECT_DECISIONS:
        raise ServiceError(f"decision must be one of {', '.join(SIDE_EFFECT_DECISIONS)}", code="invalid_decision")
    audit = Audit.of(by=by, reason=reason, action="a decision on a side effect")
    effect = SideEffect.objects.select_related("run", "run__workflow").filter(key=key).first()
    if effect is None:
        raise NotFound(f"side effect {key} does not exist", code="side_effect_not_found")
    open_statuses = (SideEffectStatus.CLAIMED, SideEffectStatus.UNCONFIRMED)
    if effect.status not in open_statuses:
        raise Conflict(
            f"side effect {key} is already {effect.status}; there is nothing to decide", code="side_effect_settled"
        )
    run = effect.run
    lease = selectors.lease_of(run) if effect.status == SideEffectStatus.CLAIMED else None
    if run.status not in FINAL_STATUSES and lease is not None and leases.lease_live(lease["expires_at"], now=db_now()):
        raise Conflict(
            f"run {run.id} is held by a live lease ({lease['owner']}, epoch {lease['epoch']}): its worker may "
            f"be sending {key} right now; decide once the lease has expired or the run has moved on",
            code="lease_held",
        )
    previous = effect.status
    resolved = audit.payload(key=key, channel=effect.channel, decision=decision, previous_status=previous)
    if decision == "mark_delivered":
        now = timezone.now()
        with transaction.atomic():
            taken = SideEffect.objects.filter(id=effect.id, status=previous, updated_at=effect.updated_at).update(
                status=SideEffectStatus.DELIVERED,
                delivered_at=now,
                updated_at=now,
                response={"resolved_by": by, "why": reason, "previous": effect.response},
            )
            if taken != 1:
                raise Conflict(f"side effect {key} changed while you decided; look again", code="side_effect_changed")
            events_append(
                run_id=run.id,
                events=[
                    NewEvent(
                        "side_effect_resolved",
                        effect.step_id,
                        effect.attempt,
                        {**resolved, "status": SideEffectStatus.DELIVERED},
                    )
                ],
                writer=by,
            )
            journal_head_advance(run_id=run.id)  # the run may have ended: its recorded head moves to this row
        return SideEffect.objects.get(id=effect.id)
    if effect.channel == "webhook" and run.status not in FINAL_STATUSES and _attempt_is_open(effect):
        with transaction.atomic():
            events_append(
                run_id=run.id,
                events=[
                    NewEvent(
                        "side_effect_resolved",
                        effect.step_id,
                        effect.attempt,
                        {**resolved, "status": previous, "via": "redrive"},
                    )
                ],
                writer=by,
            )
            run_redrive(run_id=run.id, by=by, reason=f"send {key} again: {reason}")
        return SideEffect.objects.get(id=effect.id)
    return _side_effect_send_now(effect, resolved=resolved, by=by)


def _attempt_is_open(effect) -> bool:
    """True when the effect's step attempt is the step's current attempt in the journal and has no outcome, so a
    re-drive runs that very attempt again (same key)."""
    state = replay(replay_rows_for_run(run_id=effect.run_id)).get(effect.step_id)
    return state is not None and state.attempt == effect.attempt and state.output is MISSING and state.failure is None


def _no_event(kind: str, payload: Any = None) -> int:
    """A send from an operator's decision is journaled once, as side_effect_resolved: the step's events are not."""
    return 0


def _side_effect_send_now(effect, *, resolved: dict, by: str):
    """Send a side effect again from here through the deliver step's code, with its original key and fields
    (rendered from the run's input and the journaled outputs of the steps before it). No transaction is open
    while it sends."""
    run = effect.run
    step = next((s for s in run.workflow.definition.get("steps", []) if s.get("id") == effect.step_id), None)
    kind = get_kind("deliver")
    if step is None or step.get("kind") != "deliver" or kind is None:
        raise Conflict(
            f"step {effect.step_id!r} of {run.workflow} is not a deliver step; cannot send {effect.key} again",
            code="not_a_deliver_step",
        )
    # Take the decision first (a conditional write), so two operators clicking at once send it once.
    now = timezone.now()
    marker = {
        **(effect.response if isinstance(effect.response, dict) else {}),
        "sending_again": {"by": by, "at": now.isoformat()},
    }
    if (
        SideEffect.objects.filter(id=effect.id, status=effect.status, updated_at=effect.updated_at).update(
            response=marker, updated_at=now
        )
        != 1
    ):
        raise Conflict(f"side effect {effect.key} changed while you decided; look again", code="side_effect_changed")
    states = replay(replay_rows_for_run(run_id=run.id))
    outputs = {sid: {"output": state.output} for sid, state in states.items() if state.output is not MISSING}
    context = {"input": run.input, "steps": outputs}
    outcome: dict = {}

    def confirm(_effect, *, status: str, response=None):
        when = timezone.now()
        SideEffect.objects.filter(id=effect.id).update(
            status=status,
            response={"sent_again_by": by, "answer": response},
            updated_at=when,
            **({"delivered_at": when} if status == "delivered" else {}),
        )
        outcome.update(status=status, response=response)

    ctx = StepContext(
        run_id=str(run.id),
        step_id=effect.step_id,
        attempt=effect.attempt,
        key=effect.key,
        resumed=True,
        timeout=step.get("timeout_seconds"),
        emit=_no_event,
        lease_lost=lambda: False,
        claim=lambda **_: (effect, True),  # the claim is this row: send under its key
        confirm=confirm,
    )
    problem = None
    try:
        step_invoke(step, ctx, context=context)
    except StepError as exc:
        problem = exc
    status = outcome.get("status") or effect.status
    events_append(
        run_id=run.id,
        events=[
            NewEvent(
                "side_effect_resolved",
                effect.step_id,
                effect.attempt,
                {
                    **resolved,
                    "status": status,
                    "via": "sent_now",
                    "answer": outcome.get("response"),
                    **({"error": problem.message} if problem else {}),
                },
            )
        ],
        writer=by,
    )
    journal_head_advance(run_id=run.id)  # the run may have ended: its recorded head moves to this row
    if problem is not None:
        raise Conflict(f"sending {effect.key} again failed: {problem.message}", code="send_failed")
    return SideEffect.objects.get(id=effect.id)
