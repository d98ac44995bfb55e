"""Reading the journal."""

from collections.abc import Collection
from typing import Any, NamedTuple
from uuid import UUID

from django.db.models import Case, F, Max, Q, Value, When

from .models import JournalEvent


def events_for_run(*, run_id: UUID | str, after_seq: int = 0, limit: int | None = None):
    qs = JournalEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")
    return list(qs[:limit] if limit else qs)


def events_window(*, run_id: UUID | str, before_seq: int | None = None, limit: int = 500) -> tuple[list, bool]:
    """The last `limit` events before before_seq (all the latest when None), in seq order, and whether earlier
    ones exist. The run page shows the end of a long journal first and loads earlier pages on demand."""
    qs = JournalEvent.objects.filter(run_id=run_id)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    rows = list(qs.order_by("-seq")[: limit + 1])
    more = len(rows) > limit
    return rows[:limit][::-1], more


MARKER_KINDS = (
    "run_redriven",
    "run_retried",
    "definition_moved",
    "run_waiting",
    "run_resumed",
    "run_backoff",
    "step_retrying",
    "run_cancelled",
    "run_succeeded",
    "run_failed",
    "step_skipped",
)


def waterfall_markers(*, run_id: UUID | str) -> list[dict]:
    """The events the waterfall draws as markers rather than bars: re-drives and retries (with who and why),
    waits and resumes, back-offs and retries of an unknown outcome, the run's end, skipped steps (with the `when`
    and the value that decided). One lean query (no payload for the kinds that need none), so a run of 10,000
    events pays for its few markers only."""
    rows = (
        JournalEvent.objects.filter(run_id=run_id, kind__in=MARKER_KINDS)
        .order_by("seq")
        .values_list(
            "seq",
            "kind",
            "step_id",
            "attempt",
            "created_at",
            "payload__by",
            "payload__why",
            "payload__force",
            "payload__waiting_on__kind",
            "payload__message",
            "payload__when",
            "payload__value",
        )
    )
    return [
        {
            "seq": seq,
            "kind": kind,
            "step_id": step_id,
            "attempt": attempt,
            "at": at,
            "by": by,
            "why": why,
            "force": bool(force),
            "waiting_on": waiting_on,
            "message": message,
            "when": when,
            "value": value,
        }
        for seq, kind, step_id, attempt, at, by, why, force, waiting_on, message, when, value in rows
    ]


class ReplayRow(NamedTuple):
    """One journal row as a replay reads it (runs.replay): payload is None where the read left it out."""

    seq: int
    kind: str
    step_id: str | None
    attempt: int | None
    payload: Any
    created_at: Any
    hash: str


# The kinds a replay reads back (runs.replay): what a waiting step reads of its attempt (an approval's decision,
# a consumed signal, a timer's deadline, its child). The one list: runs.replay folds these into a step's events.
REMEMBERED_KINDS = frozenset(
    {
        "approval_requested",
        "approval_decided",
        "signal_received",
        "run_waiting",
        "child_created",
        "child_adopted",
        "child_sliced",
    }
)
# The kinds whose payload a replay reads: the outcomes and the remembered ones. Every other row (step_started,
# whose payload holds the step's whole input, custom events ...) comes without it.
REPLAY_PAYLOAD_KINDS = ("step_completed", "step_failed", *sorted(REMEMBERED_KINDS))


def replay_rows_for_run(*, run_id: UUID | str) -> list[ReplayRow]:
    """What the executor replays from, and no more: the payload only for the kinds the replay reads."""
    return _replay_rows(JournalEvent.objects.filter(run_id=run_id))


def replay_rows_for_step(*, run_id: UUID | str, step_id: str) -> list[ReplayRow]:
    """One step's rows as replay_rows_for_run gives them: a step's state folds from its own rows alone (runs.replay),
    so a decision on one step reads these, not the whole run (runs.services.approval_decide)."""
    return _replay_rows(JournalEvent.objects.filter(run_id=run_id, step_id=step_id))


def _replay_rows(events) -> list[ReplayRow]:
    payload = JournalEvent._meta.get_field("payload").clone()
    rows = (
        events.order_by("seq")
        .annotate(
            lean=Case(When(kind__in=REPLAY_PAYLOAD_KINDS, then=F("payload")), default=Value(None), output_field=payload)
        )
        .values_list("seq", "kind", "step_id", "attempt", "lean", "created_at", "hash")
    )
    return list(map(ReplayRow._make, rows))


def events_of_kind(*, run_id: UUID | str, kind: str, step_ids: list[str]) -> list[JournalEvent]:
    """The run's events of one kind for these steps, in seq order."""
    return list(JournalEvent.objects.filter(run_id=run_id, kind=kind, step_id__in=step_ids).order_by("seq"))


LOOP_KINDS = ("llm_turn", "approval_requested", "step_started", "step_completed", "step_failed", "approval_decided")


def loop_rows(*, run_id: UUID | str, step_id: str, attempt: int) -> list[tuple[str, str | None, Any]]:
    """(kind, step_id, payload) of one attempt's agent loop in seq order: the step's own llm_turn and
    approval_requested rows and the rows of its tool calls, the items "{step_id}[{turn}.{n}]" (runs.steps.llm_loop)."""
    rows = (
        JournalEvent.objects.filter(run_id=run_id, attempt=attempt, kind__in=LOOP_KINDS)
        .filter(Q(step_id=step_id) | Q(step_id__startswith=f"{step_id}["))
        .order_by("seq")
        .values_list("kind", "step_id", "payload")
    )
    return list(rows)


def last_event(*, run_id: UUID | str, kind: str | None = None) -> JournalEvent | None:
    """The run's last row (of this kind, when given)."""
    qs = JournalEvent.objects.filter(run_id=run_id)
    return (qs.filter(kind=kind) if kind else qs).order_by("-seq").first()


def events_since(*, run_id: UUID | str, kind: str, since_kinds: Collection[str]) -> int:
    """How many rows of `kind` the run has after its last row of one of `since_kinds` (all of them when none)."""
    qs = JournalEvent.objects.filter(run_id=run_id)
    after = qs.filter(kind__in=list(since_kinds)).aggregate(last=Max("seq"))["last"] or 0
    return qs.filter(kind=kind, seq__gt=after).count()


def event_get(*, run_id: UUID | str, seq: int) -> JournalEvent | None:
    return JournalEvent.objects.filter(run_id=run_id, seq=seq).first()


FINAL_KINDS = frozenset({"run_succeeded", "run_failed", "run_cancelled"})
WATERFALL_KINDS = (
    "step_started",
    "step_completed",
    "step_failed",
    "run_waiting",
    "run_resumed",
    "child_created",
    "child_adopted",
    "run_redriven",
    "run_retried",
    "definition_moved",
    *sorted(FINAL_KINDS),
)


def waterfall_bars(*, run_id: UUID | str) -> list[dict]:
    """One bar per execution of a step attempt, in journal order, folded from the journal alone."""
    # status: running (started, no outcome yet), waiting (parked on an approval, a signal, a timer or a child),
    # completed, failed, interrupted (started again after a crash, or the run ended around it), cancelled (the run
    # was cancelled while it ran). child_run_id: the child run a child_run step created or adopted.
    # A re-drive (run_redriven) or an operator's retry (run_retried) reuses every step whose current attempt had
    # completed instead of running it again: each such step gets a bar with cached=true, zero length at the moment
    # of the re-drive, with the attempt whose stored output was reused.
    # items: on a for_each step's bar, how many items it has (its step_started says); None on every other bar. A
    # for_each step's bar spans its items: when the run ends while they run it stops there (failed when one of its
    # items failed the run), and an operator's retry of a failed item opens a new bar for it at the retry.
    fold = WaterfallFold()
    # A lean read: only the kinds the fold looks at, and of each payload only the keys it reads (not a step's
    # whole output), so a run of 10,000 events folds in a fraction of the time full rows would take.
    rows = (
        JournalEvent.objects.filter(run_id=run_id, kind__in=WATERFALL_KINDS)
        .order_by("seq")
        .values_list(
            "kind",
            "step_id",
            "attempt",
            "created_at",
            "payload__kind",
            "payload__child_run_id",
            "payload__run_id",
            "payload__items",
            "payload__reused_from",
        )
    )
    for row in rows:
        fold.take(*row)
    fold.retry_over()
    return fold.bars


class WaterfallFold:
    """waterfall_bars' state, folded one lean journal row at a time (take), in journal order."""

    def __init__(self):
        self.bars: list[dict] = []
        self.open_bars: dict[str | None, dict] = {}  # step_id -> its bar that has no outcome yet
        self.completed: dict[str | None, dict] = {}  # step_id -> bar of its current completed attempt
        self.ended_fan_outs: dict[str | None, dict] = {}  # for_each step_id -> its bar the run's end stopped
        self.retried_at = None  # a retry whose run_retried rows (one per step that goes on) are being folded

    def take(self, kind, step_id, attempt, created_at, step_kind, child_run_id, other_run_id, items, reused_from):
        if kind != "run_retried":
            self.retry_over()
        open_bars = self.open_bars
        if kind == "step_completed" and isinstance(reused_from, dict) and step_id not in open_bars:
            self.reused_from_original(step_id, attempt, created_at, step_kind, reused_from)
        elif kind == "step_started":
            self.started(step_id, attempt, created_at, step_kind, items)
        elif kind in ("step_completed", "step_failed") and step_id in open_bars:
            self.ended(kind, step_id, attempt, created_at)
        elif kind == "run_waiting" and step_id in open_bars:
            open_bars[step_id]["status"] = "waiting"
        elif kind == "run_resumed" and step_id in open_bars:
            open_bars[step_id]["status"] = "running"
        elif kind in ("child_created", "child_adopted") and step_id in open_bars:
            child = child_run_id or other_run_id
            if child:
                open_bars[step_id]["child_run_id"] = child
        elif kind in ("run_redriven", "run_retried"):
            self.reused(kind, step_id, created_at)
        elif kind == "definition_moved" and step_id is not None:
            # Moved to another version, where this step runs again (or is gone): its bar no longer goes on.
            self.completed.pop(step_id, None)
            moved = open_bars.pop(step_id, None)
            if moved is not None:
                moved["status"] = "interrupted"
        elif kind in FINAL_KINDS:
            self.run_ended(kind, step_id, created_at)

    def reused_from_original(self, step_id, attempt, created_at, step_kind, reused_from) -> None:
        # A fork's step taken from its original (no call): a cached bar of no length where the fork began.
        bar = {
            "step_id": step_id,
            "kind": step_kind,
            "attempt": attempt,
            "started_at": created_at,
            "ended_at": created_at,
            "status": "completed",
            "cached": True,
            "child_run_id": None,
            "items": None,
            "reused_from": reused_from,
        }
        self.bars.append(bar)
        self.completed[step_id] = bar

    def started(self, step_id, attempt, created_at, step_kind, items) -> None:
        previous = self.open_bars.pop(step_id, None)
        if previous is not None:
            previous["status"] = "interrupted"
        if self.completed.get(step_id, {}).get("attempt") != attempt:
            self.completed.pop(step_id, None)
        bar = {
            "step_id": step_id,
            "kind": step_kind,
            "attempt": attempt,
            "started_at": created_at,
            "ended_at": None,
            "status": "running",
            "cached": False,
            "child_run_id": None,
            "items": items if isinstance(items, int) else None,
        }
        self.bars.append(bar)
        self.open_bars[step_id] = bar
        self.ended_fan_outs.pop(step_id, None)

    def ended(self, kind, step_id, attempt, created_at) -> None:
        bar = self.open_bars[step_id]
        if bar["attempt"] != attempt:
            return
        del self.open_bars[step_id]
        bar["ended_at"] = created_at
        bar["status"] = "completed" if kind == "step_completed" else "failed"
        if kind == "step_completed":
            self.completed[step_id] = bar

    def reused(self, kind, step_id, created_at) -> None:
        if kind == "run_retried":
            self.completed.pop(step_id, None)
            # The for_each step goes on (no step_started of its own): only its failed items run again.
            for fan_out in self.ended_fan_outs.values():
                reopened = {**fan_out, "started_at": created_at, "ended_at": None, "status": "running"}
                self.bars.append(reopened)
                self.open_bars[fan_out["step_id"]] = reopened
            self.ended_fan_outs.clear()
            # Its other rows may run more steps again (a retry from a step): what it reused is known after them.
            self.retried_at = self.retried_at or created_at
            return
        self.cached_bars(created_at)

    def retry_over(self) -> None:
        if self.retried_at is not None:
            self.cached_bars(self.retried_at)
            self.retried_at = None

    def cached_bars(self, created_at) -> None:
        for done in list(self.completed.values()):
            self.bars.append({**done, "started_at": created_at, "ended_at": created_at, "cached": True})

    def run_ended(self, kind, step_id, created_at) -> None:
        for bar in self.open_bars.values():
            bar["status"] = "cancelled" if kind == "run_cancelled" else "interrupted"
            bar["ended_at"] = created_at if kind == "run_cancelled" else None
            if bar["items"] is not None:  # a for_each step's bar spans its items up to the end
                self.ended_fan_outs[bar["step_id"]] = bar
                bar["ended_at"] = created_at
                if kind == "run_failed" and (step_id or "").startswith(f"{bar['step_id']}["):
                    bar["status"] = "failed"
        self.open_bars.clear()
