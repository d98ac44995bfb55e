"""Reruns: a re-run from a step across many runs (runs.services.reruns), and the runs each one covers. Fields,
constraints and no I/O, like runs.models, which imports this module (it has its own: models.py is full)."""

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class RerunStatus(models.TextChoices):
    RUNNING = "running"
    """Its task chain reruns the runs one after another, per_second of them a second when paced."""
    DONE = "done"
    """Every run it covers was rerun or refused."""
    ABORTED = "aborted"
    """An operator stopped it: the runs it had not reached were left as they were."""


class RerunItemStatus(models.TextChoices):
    PENDING = "pending"
    """Not reached yet (or never, once the rerun was aborted)."""
    RERUN = "rerun"
    """Rerun: retried in place (`action` retry) or forked into a new run (`action` fork, `fork_run`)."""
    REFUSED = "refused"
    """Its service refused it (say, it was no longer failed): `code` and `detail` say why."""


class Rerun(models.Model):
    """An operator's re-run of the runs a filter selected, from their failed step or a given step: the set is fixed
    at creation (its items, oldest run first) and each item is rerun at most once, in the same commit as its
    turn, so a worker killed mid-job or a task sent twice reruns no run twice. Every time in it is the database's."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)  # the incident it answers
    filter = models.JSONField(default=dict, blank=True)
    from_step = models.CharField(max_length=80)  # "failed" or a step id
    reason = models.TextField()
    by = models.CharField(max_length=150)
    per_second = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=RerunStatus.choices, default=RerunStatus.RUNNING)
    count = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)  # rerun or refused, moved in each item's commit
    refused = models.PositiveIntegerField(default=0)
    # The task chain that drives it: a delivery whose claim is not this one stops (the sweep gave it a new one).
    claim = models.CharField(max_length=64, blank=True, default="")
    # When its next run's turn comes: a paced job's turns are 1/per_second s apart; an unpaced one's is always due.
    next_at = models.DateTimeField(db_default=Now())
    # Its last sign of life (created, a turn taken, sent again): the sweep sends its task again when a running
    # one shows none for a while and its next turn is past (runs.recovery.reruns_resend).
    updated_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    aborted_by = models.CharField(max_length=150, blank=True, default="")
    abort_reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "reruns"
        ordering = ["-created_at"]
        indexes = [
            # Used by the sweep: the running reruns, however many are done.
            models.Index(fields=["updated_at"], name="reruns_running_idx", condition=Q(status="running")),
        ]

    def __str__(self):
        return f"{self.name} ({self.status}, {self.done}/{self.count})"


class RerunItem(models.Model):
    """One run a rerun covers, at its position (oldest first), and what became of it."""

    rerun = models.ForeignKey(Rerun, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, choices=RerunItemStatus.choices, default=RerunItemStatus.PENDING)
    action = models.CharField(max_length=16, blank=True, default="")  # retry or fork
    fork_run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    code = models.CharField(max_length=64, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "rerun_items"
        ordering = ["rerun", "position"]
        constraints = [
            models.UniqueConstraint(fields=["rerun", "position"], name="rerun_items_position"),
            models.UniqueConstraint(fields=["rerun", "run"], name="rerun_items_one_per_run"),  # a run once a rerun
        ]
        indexes = [
            # Used by each turn: the rerun's first pending item, however many are done.
            models.Index(fields=["rerun", "position"], name="rerun_items_pending_idx", condition=Q(status="pending")),
        ]

    def __str__(self):
        return f"{self.run_id} in {self.rerun_id}: {self.status}"
