"""The append-only journal: one row per event of a run, keyed (run_id, seq)."""

from django.db import models

from .text import StorableJSONDecoder, StorableJSONEncoder

RESERVED_KINDS = frozenset(
    {
        "run_created",
        "run_started",
        "step_started",
        "step_completed",
        "step_failed",
        "step_retrying",
        "run_redriven",
        "side_effect_claimed",
        "side_effect_delivered",
        "side_effect_unconfirmed",
        "side_effect_failed",
        "run_backoff",
        "side_effect_resolved",
        "approval_requested",
        "approval_decided",
        "signal_received",
        "child_created",
        "child_adopted",
        "child_sliced",
        "run_waiting",
        "run_resumed",
        "run_paused",
        "run_retried",
        "definition_moved",
        "run_succeeded",
        "run_failed",
        "run_cancelled",
        "step_skipped",
        "walk_crashed",
        "llm_turn",
        # Reserved for what comes (forks, budgets, schedules): no tool may write them in the meantime.
        "run_forked",
        "budget_raised",
        "schedule_fired",
    }
)


class JournalEvent(models.Model):
    """One event. Rows are written only by journal.services.event_append and never updated or deleted.

    run_id is a plain UUID, not a foreign key: the journal outlives any cleanup of runs and never imports them.
    """

    pk = models.CompositePrimaryKey("run_id", "seq")
    run_id = models.UUIDField()
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=64)
    step_id = models.CharField(max_length=80, null=True, blank=True)  # an item: "{step}[{index}]"
    attempt = models.PositiveIntegerField(null=True, blank=True)
    # Written as journal.services.dumps() made it; the decoder gives back text Postgres cannot hold as it came.
    payload = models.JSONField(default=dict, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    created_at = models.DateTimeField()
    writer = models.CharField(max_length=200, blank=True, default="", help_text="worker, user or 'sweep' that wrote it")
    epoch = models.BigIntegerField(null=True, blank=True, help_text="lease epoch of the writer, when it held one")
    prev_hash = models.CharField(max_length=64, default="", help_text="the previous row's hash (zeros for seq 1)")
    hash = models.CharField(max_length=64, default="", help_text="sha256 over prev_hash and this row's content")

    class Meta:
        db_table = "journal_events"
        ordering = ["run_id", "seq"]

    def __str__(self):
        return f"{self.run_id}#{self.seq} {self.kind}"
