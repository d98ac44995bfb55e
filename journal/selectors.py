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
