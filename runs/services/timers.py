"""A durable timer that came due: an approval's deadline (the engine decides it, runs.services.decisions), a sleep,
a rate limit's next slot or a paced resume's turn."""

from pal.clock import db_now

from ..dispatch import enqueue_wake
from ..models import Pause, Run, RunStatus
from ..waiting import waits_of
from .decisions import approvals_time_out
from .wakeups import run_wake


def run_wake_timer(*, run_id) -> bool:
    """Wake a run whose durable timer is due by the database's clock (sent with a countdown, and by the sweep as a
    backstop); an approval's deadline decides it instead (by "timeout"). A wake-up that came early (its eta was its
    sender's clock, or the timer fired a moment early) is sent again for what is left; the beat's look wakes the run
    if that one is late."""
    wake_at = Run.objects.filter(id=run_id, status=RunStatus.WAITING).values_list("wake_at", flat=True).first()
    if wake_at is None:
        return False
    left = (wake_at - db_now()).total_seconds()
    if left > 0:
        enqueue_wake(run_id=run_id, countdown=left)
        return False
    waiting_on = Run.objects.filter(id=run_id).values_list("waiting_on", flat=True).first()
    # An approval past its deadline is decided (on_timeout), which wakes the run: its walk sees the other waits too.
    if approvals_time_out(run_id=run_id, waiting_on=waiting_on):
        return True
    # Any wait with a due wake time: a timer, a rate limit's next slot, or a paced resume's turn (a graph may wait
    # on others too: they go on waiting once the run parks again).
    by, why = "timer", "timer due"
    paused = next((w for w in waits_of(waiting_on) if w.get("kind") == "paused"), None)
    pause = Pause.objects.filter(id=paused["pause"], resumed_at__isnull=False).first() if paused else None
    if pause is not None and pause.per_second:  # its turn of a paced resume: the run_resumed says whose and why
        by = pause.resumed_by
        why = f"paced resume ({pause.per_second:g}/s) of the pause of {pause.target}: {pause.resume_reason}"
    return run_wake(run_id=run_id, by=by, why=why)
