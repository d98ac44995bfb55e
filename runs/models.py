"""Workflows, runs, leases and side effects: fields, constraints and querysets; no I/O."""

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from journal.text import StorableJSONDecoder, StorableJSONEncoder

# For the JSONFields that can hold what a peer sent (a model's answer, a tool's output, a child's input made from
# them): text Postgres cannot store is written escaped and read back as it came (journal.text).


class Workflow(models.Model):
    """One version of a workflow definition. Posting an existing name makes version + 1."""

    name = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    description = models.TextField(blank=True, default="")
    definition = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "workflows"
        ordering = ["name", "-version"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="workflow_name_version_unique")]
        permissions = [("operate", "Can operate runs: create, cancel, re-drive, retry, approve, signal")]

    def __str__(self):
        return f"{self.name} v{self.version}"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    """Created; a task to drive it is in the broker (or lost, and the sweep will re-send it)."""
    RUNNING = "running"
    """Being walked by a worker that holds its lease, or between two slices of that walk."""
    WAITING = "waiting"
    """Parked on an approval, a signal, a timer or a child; holds no lease and no worker."""
    SUCCEEDED = "succeeded"
    """Every step completed; output is the last step's output."""
    FAILED = "failed"
    """A step failed definitely and had no attempts left."""
    CANCELLED = "cancelled"
    """Stopped by an operator."""


LIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
PRIORITY_MIN, PRIORITY_MAX = -100, 100  # Django's task priorities (django.tasks.base.TASK_MIN/MAX_PRIORITY)


class RunQuerySet(models.QuerySet):
    def live(self):
        return self.filter(status__in=LIVE_STATUSES)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    input = models.JSONField(default=dict, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    output = models.JSONField(null=True, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    error = models.JSONField(null=True, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    parent_run = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    parent_step_id = models.CharField(max_length=80, null=True, blank=True)  # a step, or an item "{step}[{index}]"
    parent_attempt = models.PositiveIntegerField(null=True, blank=True)
    # The run this one was forked from (POST /runs/{id}/fork): its steps before the fork point were reused.
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks")
    depth = models.PositiveSmallIntegerField(default=0)
    trigger_meta = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    request_hash = models.CharField(max_length=64, blank=True, default="")
    waiting_on = models.JSONField(null=True, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    wake_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The journal's head when the run ended, written in the ending's own commit (and moved by an event
    # appended to an ended run): the hash chain alone cannot see rows cut off its end (journal.chain).
    journal_head_seq = models.PositiveIntegerField(null=True, blank=True)
    journal_head_hash = models.CharField(max_length=64, blank=True, default="")
    # The workflow's concurrency group ("{workflow}:{key}"), fixed at creation: at most max_runs of a group run.
    concurrency_key = models.CharField(max_length=200, null=True, blank=True)
    # Django's task priority, -100..100, higher sooner (POST /runs, task.using(priority=...); a child has its
    # parent's): its drive messages' broker priority (runs.dispatch), and the order a freed concurrency slot and a
    # paced resume take waiting runs in (then creation order).
    priority = models.SmallIntegerField(default=0, db_default=0)  # db_default: code before 0025 inserts runs too

    objects = RunQuerySet.as_manager()
    # Not a column: the lease booking a run was created with, set by services._run_insert for the answer that
    # creates it, as selectors.lease_of gives a lease ({owner, epoch, expires_at}): POST /runs answers it as the
    # run's lease at its commit instead of reading it back.
    booked_lease: dict | None = None

    class Meta:
        db_table = "runs"
        ordering = ["-created_at", "-id"]
        constraints = [
            # Adoption after a crash: one child per (parent, step, attempt), enforced by the database.
            models.UniqueConstraint(
                fields=["parent_run", "parent_step_id", "parent_attempt"],
                name="runs_one_child_per_parent_step_attempt",
                condition=Q(parent_run__isnull=False),
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX), name="runs_priority_range"
            ),
        ]
        indexes = [
            # Used by the recovery sweep: a partial index over live runs only, so a million finished
            # runs add nothing to the sweep's read.
            models.Index(
                fields=["status", "updated_at"],
                name="runs_live_idx",
                condition=Q(status__in=["queued", "running"]),
            ),
            # Used by the run list (newest first, keyset pagination) and its filters.
            models.Index(fields=["-created_at", "-id"], name="runs_created_idx"),
            models.Index(fields=["status", "-created_at"], name="runs_status_created_idx"),
            # Used by the workflow pages (runs.workflow_stats): one workflow's runs in a time window.
            models.Index(fields=["workflow", "-created_at"], name="runs_workflow_created_idx"),
            # Used by the concurrency limit: a group's running runs, and its queued ones by priority, then age.
            models.Index(
                fields=["concurrency_key", "status", "-priority", "created_at"],
                name="runs_concurrency_idx",
                condition=Q(concurrency_key__isnull=False),
            ),
            # Used by the timer wake-up: waiting runs with a wake time.
            models.Index(fields=["wake_at"], name="runs_wake_idx", condition=Q(wake_at__isnull=False)),
            # Used by /metrics (runs.tallies): the runs that ended since the tallies' mark.
            models.Index(fields=["finished_at"], name="runs_finished_idx", condition=Q(finished_at__isnull=False)),
        ]

    @property
    def booked_owner(self) -> str | None:
        """Who holds the lease it was created with (runs.api.runs.run_out: while the lease is still that booking, its
        journal is just run_created)."""
        return self.booked_lease["owner"] if self.booked_lease is not None else None

    def __str__(self):
        return f"{self.workflow.name} {self.id}"

    @property
    def is_final(self):
        return self.status in FINAL_STATUSES


class RunInputTerm(models.Model):
    """One top-level member of a run's input (its key with a text, whole number or boolean value), hashed to a
    term: the index an `input` containment filter walks newest first, so its first page costs the page and not the
    number of matches (runs.input_terms). Written with the run; a run's input never changes. The primary key is
    the walk's order; there is no foreign-key constraint (each run's insert would pay a lookup per member) and no
    index by run (runs are never deleted)."""

    pk = models.CompositePrimaryKey("term", "created_at", "run")
    term = models.BigIntegerField()
    created_at = models.DateTimeField()
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="input_terms", db_constraint=False, db_index=False
    )

    class Meta:
        db_table = "run_input_terms"


class RunLock(models.Model):
    """The lease on a run. owner is a worker ("host:pid:nonce") or a reservation for one task
    ("task:<celery id>") that the receiving worker converts; epoch grows at every acquisition or steal
    and fences every journal append and side-effect claim (runs.leases)."""

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="lock", db_column="run_id")
    owner = models.CharField(max_length=200)
    epoch = models.BigIntegerField(default=1)
    expires_at = models.DateTimeField()
    acquired_at = models.DateTimeField()

    class Meta:
        db_table = "run_locks"
        indexes = [
            # Used by the heartbeat: one UPDATE ... WHERE owner = me per beat.
            models.Index(fields=["owner"], name="run_locks_owner_idx"),
            # Used by the sweep at lease expiry: the earliest expiry among leases is one read of this index.
            models.Index(fields=["expires_at"], name="run_locks_expires_idx"),
        ]

    def __str__(self):
        return f"{self.run_id} held by {self.owner} (epoch {self.epoch})"


class SideEffectStatus(models.TextChoices):
    CLAIMED = "claimed"
    """The key is taken; the send may or may not have happened (the process may have died)."""
    DELIVERED = "delivered"
    """The peer confirmed it."""
    FAILED = "failed"
    """The peer refused it definitely."""
    UNCONFIRMED = "unconfirmed"
    """Claimed before a crash and not safe to send again (email): an operator decides."""


class SideEffect(models.Model):
    key = models.CharField(max_length=255, unique=True, help_text="{run_id}:{step_id}:{attempt}")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="side_effects")
    step_id = models.CharField(max_length=80)  # a step, or an item "{step}[{index}]"
    attempt = models.PositiveIntegerField()
    channel = models.CharField(max_length=16)
    target = models.TextField()
    status = models.CharField(max_length=16, choices=SideEffectStatus.choices, default=SideEffectStatus.CLAIMED)
    claimed_epoch = models.BigIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    claimed_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "side_effects"
        ordering = ["-claimed_at"]
        indexes = [
            # Used by the ops dashboard: claimed-but-unconfirmed side effects.
            models.Index(
                fields=["status"], name="side_effects_open_idx", condition=Q(status__in=["claimed", "unconfirmed"])
            ),
        ]

    def __str__(self):
        return f"{self.channel} {self.key} ({self.status})"


class Sweep(models.Model):
    """One pass of the recovery sweep, for /health and the ops dashboard (its times: the database's clock)."""

    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    examined = models.PositiveIntegerField(default=0)
    redriven = models.JSONField(default=list, blank=True)
    woken = models.JSONField(default=list, blank=True)
    who = models.CharField(max_length=200, blank=True, default="")
    # Bulk actions whose task the sweep sent again (lost with the broker, or its worker died).
    bulk_resent = models.JSONField(default=list, blank=True)

    class Meta:
        db_table = "sweeps"
        ordering = ["-started_at"]
        indexes = [
            # Used by the dashboard (the newest sweeps) and by the pruning that keeps PAL_SWEEP_HISTORY rows.
            models.Index(fields=["-started_at"], name="sweeps_started_idx"),
        ]


class Signal(models.Model):
    """A signal sent to a run: kept until the run waits on its name, then consumed exactly once."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=64)
    payload = models.JSONField(default=dict, blank=True)
    sent_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_step_id = models.CharField(max_length=80, null=True, blank=True)

    class Meta:
        db_table = "signals"
        ordering = ["created_at", "id"]
        indexes = [
            # Used by the signal step: the oldest unconsumed signal of a name for a run.
            models.Index(
                fields=["run", "name", "created_at"], name="signals_pending_idx", condition=Q(consumed_at__isnull=True)
            ),
        ]

    def __str__(self):
        return f"{self.name} for {self.run_id}"


class BulkStatus(models.TextChoices):
    PENDING = "pending"
    """Created; its task is in the broker (or lost, and the sweep will send it again)."""
    RUNNING = "running"
    """Its task is applying the action run by run."""
    DONE = "done"
    """Every run was tried; `failed` counts the refusals."""


class BulkAction(models.Model):
    """Cancel, re-drive, retry or move (to `version` of their one workflow) every run that matched a filter, applied
    by a background task.

    run_ids is the set the operator previewed, fixed at creation, so runs that start matching later are not
    swept in by surprise."""

    ACTIONS = ("cancel", "redrive", "retry", "move")

    action = models.CharField(max_length=16)
    filters = models.JSONField(default=dict, blank=True)
    run_ids = models.JSONField(default=list)
    reason = models.TextField()
    force = models.BooleanField(default=False)
    version = models.PositiveIntegerField(null=True, blank=True)  # a move's: the version its runs go to
    created_by = models.CharField(max_length=150)
    status = models.CharField(max_length=16, choices=BulkStatus.choices, default=BulkStatus.PENDING)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)
    # How many of run_ids are applied and counted: moved in the same commit as each run's action, so a task
    # that takes over (the first died or was lost) goes on from there and applies and counts no run twice.
    position = models.PositiveIntegerField(default=0)
    # The delivery of the task that holds it while running; a task whose claim was taken over stops.
    claim = models.CharField(max_length=64, blank=True, default="")
    # Its last sign of life (created, sent again, claimed, a run applied): the sweep sends the task again when
    # a pending or running one shows none for a while (runs.recovery.bulk_actions_resend).
    updated_at = models.DateTimeField(auto_now=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "bulk_actions"
        ordering = ["-created_at"]
        indexes = [
            # Used by the sweep: the bulk actions not done yet, however many are done.
            models.Index(
                fields=["updated_at"], name="bulk_actions_open_idx", condition=Q(status__in=["pending", "running"])
            ),
        ]

    def __str__(self):
        return f"{self.action} x{self.total} by {self.created_by} ({self.status})"


class ConcurrencyKey(models.Model):
    """One row per concurrency group, locked while a run of the group starts, parks or ends, so that counting the
    group's running runs and handing a freed slot to the next run are ordered (runs.concurrency)."""

    key = models.CharField(max_length=200, primary_key=True)

    class Meta:
        db_table = "concurrency_keys"


class ScheduleCatchup(models.TextChoices):
    ONE = "one"
    """Fires missed while no scheduler ran are made once when one is back: one run, for the latest of them."""
    NONE = "none"
    """Missed fires are skipped: the schedule goes on from the next fire time."""


class Schedule(models.Model):
    """A cron schedule that starts runs of a workflow (runs.schedules). Each fire time makes one run, keyed
    `schedule:{id}:{fire time}`; next_fire_at is advanced with a conditional write so two beats fire once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow_name = models.CharField(max_length=64)
    workflow_version = models.PositiveIntegerField(null=True, blank=True)  # none: the latest at each fire
    cron = models.CharField(max_length=120)
    timezone = models.CharField(max_length=64, default="UTC")  # IANA; the cron is read in this zone's wall time
    input = models.JSONField(default=dict, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    catchup = models.CharField(max_length=8, choices=ScheduleCatchup.choices, default=ScheduleCatchup.ONE)
    enabled = models.BooleanField(default=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)  # null while paused
    last_fired_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "schedules"
        ordering = ["workflow_name", "created_at"]
        indexes = [
            # Used by the beat's fire (runs.schedules.schedule_fire_due): enabled schedules that are due.
            models.Index(fields=["next_fire_at"], name="schedules_due_idx", condition=Q(enabled=True)),
        ]

    def __str__(self):
        return f"{self.workflow_name} at {self.cron!r} ({self.timezone})"


class ScheduleEvent(models.Model):
    """What happened to a schedule, append-only: an operator's action (who and why) or a fire (its run). A
    schedule has no run of its own to journal on; rows outlive their schedule (schedule_id is no foreign key)."""

    schedule_id = models.UUIDField()
    kind = models.CharField(max_length=24)  # created, updated, paused, resumed, deleted, fired, skipped, fire_failed
    fire_at = models.DateTimeField(null=True, blank=True)
    run_id = models.UUIDField(null=True, blank=True)
    by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    payload = models.JSONField(default=dict, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "schedule_events"
        ordering = ["-id"]
        constraints = [
            # One fire per fire time, held by the database (the run's Idempotency-Key holds it for the run).
            models.UniqueConstraint(
                fields=["schedule_id", "fire_at"], name="schedule_events_one_fire", condition=Q(kind="fired")
            ),
        ]
        indexes = [
            # Used by /schedules/ and GET /schedules/{id}: a schedule's newest events and runs.
            models.Index(fields=["schedule_id", "-id"], name="schedule_events_schedule_idx"),
        ]

    def __str__(self):
        return f"{self.kind} {self.schedule_id} by {self.by or '-'}"


class RateSlot(models.Model):
    """One call that started under a rate limit (PAL_RATE_LIMITS): when, and the tokens it reported. Rows long
    out of the 60-second window are pruned by the sweep (runs.rate_limits.rate_slots_prune)."""

    key = models.CharField(max_length=200)  # the limit's name, "llm:gpt-4o-mini"
    started_at = models.DateTimeField()
    tokens = models.PositiveIntegerField(default=0)
    run_id = models.UUIDField()
    step_key = models.CharField(max_length=255)

    class Meta:
        db_table = "rate_slots"
        indexes = [models.Index(fields=["key", "started_at"], name="rate_slots_window_idx")]


class SweepPlan(models.Model):
    """Unused: the early sweep at a lease's expiry was planned here and sent as a countdown task, which died with the
    worker holding it; the beat plans it now (runs.recovery.RecoveryLook). The table stays for workers of the
    version before during an upgrade."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    due_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "sweep_plan"


class BranchLock(models.Model):
    """One item of a run's fan-out booked for the fleet (runs.walk.fleet): the root walk books it for one Celery task
    id ("task:<id>"), the worker that receives the task takes it under its own name (epoch + 1), beats it while the
    item runs and writes the item's outcome into `result`; the root journals that outcome and deletes the row in the
    same commit. The epoch fences the item's writer: a rebooked item's old writer (a zombie) writes nothing."""

    pk = models.CompositePrimaryKey("run_id", "sid")
    run_id = models.UUIDField()
    sid = models.CharField(max_length=80)  # the journal's step id of the item: "{step}[{index}]"
    attempt = models.PositiveIntegerField()
    owner = models.CharField(max_length=200)
    epoch = models.BigIntegerField(default=1)
    expires_at = models.DateTimeField()
    booked_at = models.DateTimeField()
    resumed = models.BooleanField(default=False)  # the attempt had started before (ctx.resumed of the step)
    # The item's fields as the root rendered them, and its outcome: stored as the journal stores payloads.
    fields = models.JSONField(encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)
    result = models.JSONField(null=True, blank=True, encoder=StorableJSONEncoder, decoder=StorableJSONDecoder)

    class Meta:
        db_table = "branch_locks"

    def __str__(self):
        return f"{self.run_id} {self.sid} held by {self.owner} (epoch {self.epoch})"


class RunTally(models.Model):
    """Runs counted once for /metrics (runs.tallies): by workflow version, the runs created before the mark (status
    "") and the runs that ended before it, by final status. Only the holder of the mark's row lock writes them."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=16, blank=True, default="")
    n = models.BigIntegerField(default=0)

    class Meta:
        db_table = "run_tallies"
        constraints = [models.UniqueConstraint(fields=["workflow", "status"], name="run_tallies_workflow_status")]


class RunTallyMark(models.Model):
    """The one row that says up to when the tallies count (null: nothing counted yet)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    upto = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "run_tally_mark"


class WorkflowHourRollup(models.Model):
    """A workflow's runs (every version, by name) created in one UTC hour, counted once for /workflows/
    (runs.workflow_rollups): how many were created before the mark, and of those that ended before it, how many by
    final status, their cost and a histogram of their durations (log-spaced buckets; the durations themselves too
    while there are few). Only the holder of the mark's row lock writes them."""

    name = models.CharField(max_length=64)
    hour = models.DateTimeField()
    created = models.BigIntegerField(default=0)
    ended = models.JSONField(default=dict)  # {final status: runs}
    cost_usd = models.FloatField(default=0.0)
    histogram = models.JSONField(default=list)  # [first bucket, its runs, the next bucket's runs, ...]
    durations = models.JSONField(null=True, blank=True, default=list)  # every duration, or null past EXACT_UP_TO

    class Meta:
        db_table = "workflow_hour_rollups"
        constraints = [models.UniqueConstraint(fields=["hour", "name"], name="workflow_hour_rollups_hour_name")]


class WorkflowRollupMark(models.Model):
    """The one row that says what the rollups hold: the runs created at or after `since` (the first hour they
    count), created, or ended, before `upto` (null: nothing counted yet)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    since = models.DateTimeField(null=True, blank=True)
    upto = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "workflow_rollup_mark"


class PauseScope(models.TextChoices):
    RUN = "run"
    """One run (target: its id): it parks at its next slice."""
    WORKFLOW = "workflow"
    """Every run of a workflow (target: its name), new ones too: each parks when its walk begins a slice."""
    DEPENDENCY = "dependency"
    """Calls to one peer (target: `llm:MODEL`, `webhook:HOST` or `email`): a step parks before its call."""
    FLEET = "fleet"
    """Every run (target `*`)."""


class Pause(models.Model):
    """An operator's hold (runs.services.pauses): active while resumed_at is null. A resume wakes the runs it held,
    per_second of them a second when paced; a paced dependency's calls keep to that pace until pace_until
    (runs.pauses.pace_take). Every time in it is the database's clock."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scope = models.CharField(max_length=16, choices=PauseScope.choices)
    target = models.CharField(max_length=255)
    reason = models.TextField()
    by = models.CharField(max_length=150)
    created_at = models.DateTimeField(db_default=Now())
    resumed_at = models.DateTimeField(null=True, blank=True)
    resumed_by = models.CharField(max_length=150, blank=True, default="")
    resume_reason = models.TextField(blank=True, default="")
    per_second = models.FloatField(null=True, blank=True)
    pace_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pauses"
        ordering = ["-created_at"]
        constraints = [
            # One active pause per target, held by the database; its index is the walk's per-slice look and the
            # dependency look before each call (runs.pauses).
            models.UniqueConstraint(
                fields=["scope", "target"], name="pauses_one_active", condition=Q(resumed_at__isnull=True)
            ),
        ]
        indexes = [
            # Used by a paced dependency's calls (runs.pauses.dependency_hold): pauses still pacing.
            models.Index(fields=["scope", "target"], name="pauses_pacing_idx", condition=Q(pace_until__isnull=False)),
        ]

    def __str__(self):
        return f"{self.scope} {self.target} by {self.by}"

    @property
    def active(self) -> bool:
        return self.resumed_at is None


# A module of their own (this one is full), imported here so that Django and every `from .models import` find them.
from .models_views import RunAttribute, SavedView  # noqa: E402, F401
from .rerun_models import Rerun, RerunItem, RerunItemStatus, RerunStatus  # noqa: E402, F401
