"""Reading the journal."""

from uuid import UUID

from .models import JournalEvent


def events_for_run(*, run_id: UUID | str, after_seq: int = 0, limit: int | None = None):
    qs = JournalEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq")
    return list(qs[:limit] if limit else qs)


def event_rows_for_run(*, run_id: UUID | str):
    """The lean read the executor replays from: (seq, kind, step_id, attempt, payload) tuples."""
    return list(
        JournalEvent.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "kind", "step_id", "attempt", "payload", "created_at", "hash")
    )


def last_event(*, run_id: UUID | str) -> JournalEvent | None:
    return JournalEvent.objects.filter(run_id=run_id).order_by("-seq").first()


def event_get(*, run_id: UUID | str, seq: int) -> JournalEvent | None:
    return JournalEvent.objects.filter(run_id=run_id, seq=seq).first()


FINAL_KINDS = frozenset({"run_succeeded", "run_failed", "run_cancelled"})


def waterfall_bars(*, run_id: UUID | str) -> list[dict]:
    """One bar per execution of a step attempt, in journal order, folded from the journal alone.

    status: running (started, no outcome yet), waiting (parked on an approval, a signal, a timer or a child),
    completed, failed, interrupted (started again after a crash, or the run ended around it), cancelled (the run
    was cancelled while it ran). child_run_id: the child run a child_run step created or adopted.
    A re-drive (run_redriven) or an operator's retry (run_retried) reuses every step whose current attempt had
    completed instead of running it again: each such step gets a bar with cached=true, zero length at the moment
    of the re-drive, with the attempt whose stored output was reused.
    """
    bars: list[dict] = []
    open_bars: dict[str, dict] = {}  # step_id -> its bar that has no outcome yet
    completed: dict[str, dict] = {}  # step_id -> bar of its current completed attempt
    for event in events_for_run(run_id=run_id):
        kind, step_id, attempt, payload = event.kind, event.step_id, event.attempt, event.payload or {}
        if kind == "step_started":
            previous = open_bars.pop(step_id, None)
            if previous is not None:
                previous["status"] = "interrupted"
            if completed.get(step_id, {}).get("attempt") != attempt:
                completed.pop(step_id, None)
            bar = {
                "step_id": step_id, "kind": payload.get("kind"), "attempt": attempt,
                "started_at": event.created_at, "ended_at": None, "status": "running", "cached": False,
                "child_run_id": None,
            }
            bars.append(bar)
            open_bars[step_id] = bar
        elif kind in ("step_completed", "step_failed") and step_id in open_bars:
            bar = open_bars[step_id]
            if bar["attempt"] != attempt:
                continue
            del open_bars[step_id]
            bar["ended_at"] = event.created_at
            bar["status"] = "completed" if kind == "step_completed" else "failed"
            if kind == "step_completed":
                completed[step_id] = bar
        elif kind == "run_waiting" and step_id in open_bars:
            open_bars[step_id]["status"] = "waiting"
        elif kind == "run_resumed" and step_id in open_bars:
            open_bars[step_id]["status"] = "running"
        elif kind in ("child_created", "child_adopted") and step_id in open_bars:
            child = payload.get("child_run_id") or payload.get("run_id")
            if child:
                open_bars[step_id]["child_run_id"] = child
        elif kind in ("run_redriven", "run_retried"):
            if kind == "run_retried":
                completed.pop(step_id, None)
            for done in list(completed.values()):
                bars.append({**done, "started_at": event.created_at, "ended_at": event.created_at, "cached": True})
        elif kind in FINAL_KINDS:
            for bar in open_bars.values():
                bar["status"] = "cancelled" if kind == "run_cancelled" else "interrupted"
                bar["ended_at"] = event.created_at if kind == "run_cancelled" else None
            open_bars.clear()
    return bars
