"""Handing work to the queue: book a run's lease for a new drive task and send that task, send a timer's wake-up,
a bulk action's or a rerun's task. Every send happens once the surrounding transaction commits (a rollback sends
nothing)."""

# A send that fails after its commit (the broker away) is logged, not raised (_after_commit): what it would have
# started is committed and something else sends it again (the sweep at a booking's expiry, the walk for a fan-out
# item, the next tick). Raised, it would turn a request whose run is made into an error answer ("may be retried":
# a second run), or a worker's committed step into a failed task.
#
# Tasks are sent by name (runs.tasks registers them under these names), so this module, low in the layers, does
# not import the tasks' module, which sits at the top and calls into everything below.

import atexit
import contextlib
import logging
import os
import queue
import threading
import uuid

from celery import current_app, signature
from django.conf import settings
from django.db import transaction

from pal import telemetry

from . import leases
from .models import PRIORITY_MAX, Run
from .secrets import mask

log = logging.getLogger("pal.dispatch")

drive = signature("runs.tasks.drive")
wake = signature("runs.tasks.wake")
bulk = signature("runs.tasks.bulk")
sweep = signature("runs.tasks.sweep")
item = signature("runs.tasks.item")
rerun = signature("runs.tasks.rerun")


def book_drive(*, run_id, force: bool = False, priority: int | None = None):
    """Book the run's lease for a new drive task and send that task once the transaction commits.

    The one way a run is handed to the queue (creation, the sweep, an operator's re-drive or retry, a wake-up).
    Returns the booking's Fence, or None when a live lease holds the run (force steals it). A rollback of the
    surrounding transaction drops both the booking and the send. priority: the run's (read from its row if None)."""
    task_id = str(uuid.uuid4())
    fence = leases.lease_reserve(run_id=run_id, task_id=task_id, force=force)
    if fence is not None:
        if priority is None:
            priority = Run.objects.filter(id=run_id).values_list("priority", flat=True).first() or 0
        enqueue_drive(run_id=run_id, task_id=task_id, priority=priority)
    return fence


def broker_priority(priority: int) -> int | None:
    """The message priority of a drive for a run's priority (higher sooner), or None: sent without one, as every
    message was before priorities (priority 0 always is). Redis: 0..9, lower sooner, a message without one at 0,
    so only a priority below 0 has a place (1..9, after it). RabbitMQ (x-max-priority 9): 0..9, higher sooner, a
    message without one at 0, so only one above 0 has a place (1..9, before it). Other brokers have none."""
    scheme = settings.CELERY_BROKER_URL.split(":", 1)[0]
    steps = (PRIORITY_MAX + MESSAGE_PRIORITIES - 1) // MESSAGE_PRIORITIES  # run priorities a message level spans
    if scheme in ("redis", "rediss") and priority < 0:
        return min(MESSAGE_PRIORITIES, 1 + (-priority - 1) // steps)
    if scheme in ("amqp", "amqps", "pyamqp") and priority > 0:
        return min(MESSAGE_PRIORITIES, 1 + (priority - 1) // steps)
    return None


MESSAGE_PRIORITIES = 9  # message levels besides 0 (settings: Redis priority_steps 0..9, RabbitMQ x-max-priority 9)


def drives_booked(*, run_ids: list) -> list[tuple]:
    """The (run_id, task_id) of a new drive task for each run: what its lease booking names (leases)."""
    return [(run_id, str(uuid.uuid4())) for run_id in run_ids]


def drives_send_after_commit(bookings: list[tuple]) -> None:
    """Send the drive tasks of bookings (run_id, task_id, priority) once the surrounding transaction commits (in
    autocommit: now, so only once the bookings are written), through this process's DriveSender if it has one."""
    if not bookings:
        return
    if len(bookings) == 1:
        what = f"run {bookings[0][0]}: drive task"
    else:
        what = f"runs {', '.join(str(booking[0]) for booking in bookings)}: drive tasks (some or all)"
    sender = _sender
    if sender is not None:
        transaction.on_commit(lambda: sender.put(bookings, what))
    else:
        _after_commit(lambda: drives_send(bookings), what, then=_SWEEP)


_SWEEP = "the sweep sends it again once its booking expires"


def _after_commit(send, what: str, *, then: str) -> None:
    """send() once the surrounding transaction commits (_guarded)."""
    transaction.on_commit(lambda: _guarded(send, what, then=then))


def _guarded(send, what: str, *, then: str) -> None:
    """send(); if it fails, log what was not sent and what sends it again (the error's text masked: a broker's error
    may quote its URL)."""
    try:
        send()
    except Exception as exc:
        log.warning("%s not sent (%s: %s); %s", what, type(exc).__name__, mask(str(exc)), then)


# --- the web process's sender ----------------------------------------------------------------------


class DriveSender:
    """The drive messages of the runs a web process makes, sent by one thread of its own, several at a time."""

    # A request that made runs hands their bookings here at its commit and answers at once; the thread takes every
    # booking waiting and sends them with one drives_send (one pooled producer, one Redis pipeline), which costs a
    # request less than sending its own (docs/PERFORMANCE-code.md). The rule of a send after its commit is unchanged: a
    # booking whose message is not sent (the broker away, the process killed before its turn) is re-driven by the sweep
    # once the booking expires; a failure is logged, with the same line per request as before (_after_commit). Each
    # message is published in the trace context of the request that made its run (OpenTelemetry's Celery instrumentation
    # puts it in the message's headers).
    #
    # Once BACKLOG bookings wait for the thread, a request sends its own, as without a sender (so at most BACKLOG
    # plus one request's runs wait). The thread takes its turns at the GIL with the request threads; unbounded, it
    # fell behind under POST /runs/batch (docs/PERFORMANCE-code.md). Bounded, the requests pay for
    # what the thread cannot send, so what waits is a few batches' worth (about 10 ms of sending) and ingest runs at the
    # rate its messages really go out. Single POSTs hand over two or three bookings at a time: far below the bound.
    #
    # pal.web starts one per process (drive_sender_start); elsewhere (a worker, a management command, the test
    # client) each transaction sends its own, as before. A process's exit sends what is waiting (atexit).

    BATCH = 100  # bookings per drives_send at most (a POST /runs/batch's worth)
    BACKLOG = 200  # bookings waiting at most (two batches of 100); past it a request sends its own

    def __init__(self):
        self.waiting: queue.SimpleQueue = queue.SimpleQueue()
        self.backlog = 0  # bookings handed over by put() and not sent yet
        self.counting = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="pal-drive-sender", daemon=True)
        self.thread.start()

    def put(self, bookings: list[tuple], what: str) -> None:
        with self.counting:
            full = self.backlog >= self.BACKLOG
            if not full:
                self.backlog += len(bookings)
        if full:  # the thread is behind: this request sends its own, and so waits its turn (back-pressure)
            _guarded(lambda: drives_send(bookings), what, then=_SWEEP)
            return
        # Where the request's own send would have come from: its trace context and its thread's reply_to.
        self.waiting.put((bookings, what, (telemetry.context_now(), current_app.thread_oid)))

    def _loop(self) -> None:
        while True:
            taken = [self.waiting.get()]
            if taken[0] is None:
                return
            size = len(taken[0][0])
            while size < self.BATCH:
                try:
                    more = self.waiting.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self.waiting.put(None)  # stop after sending these
                    break
                taken.append(more)
                size += len(more[0])
            self._send(taken)

    def _send(self, taken: list) -> None:
        try:
            drives_send(
                [booking for bookings, _, _ in taken for booking in bookings],
                sent_from=[origin for bookings, _, origin in taken for _ in bookings],
            )
        except Exception as exc:
            for _, what, _ in taken:
                log.warning("%s not sent (%s: %s); %s", what, type(exc).__name__, mask(str(exc)), _SWEEP)
        finally:
            with self.counting:
                self.backlog = max(0, self.backlog - sum(len(bookings) for bookings, _, _ in taken))

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is waiting, then end the thread (waits at most timeout seconds)."""
        self.waiting.put(None)
        self.thread.join(timeout)


_sender: DriveSender | None = None


def _forgotten_in_a_child() -> None:
    global _sender
    _sender = None  # a forked child has the queue but not the thread: it sends per transaction


os.register_at_fork(after_in_child=_forgotten_in_a_child)


def drive_sender_start() -> DriveSender:
    """This process's DriveSender (pal.web calls it once): new runs' messages go through it from now on."""
    global _sender
    if _sender is None or not _sender.thread.is_alive():
        _sender = DriveSender()
        atexit.register(_sender.stop)
    return _sender


def drive_sender_stop() -> None:
    """Send what is waiting and go back to a send per transaction (tests)."""
    global _sender
    sender, _sender = _sender, None
    if sender is not None:
        sender.stop()
        atexit.unregister(sender.stop)


DRIVE = "runs.tasks.drive"


def drives_send(bookings: list[tuple], *, sent_from: list[tuple] | None = None) -> None:
    """Send the drive task of each (run_id, task_id[, the run's priority]), the message drive.apply_async would
    send for it (with broker_priority's priority)."""
    # Celery builds and sends each message (app.amqp's create_task_message and send_task_message: its headers, its
    # before/after_task_publish signals, its retry policy); what send_task would work out again at every call and is
    # the same for them all is worked out once: the route, the sender's reply_to, the task tree of a worker that
    # sends them (a schedule firing), and ignore_result (the task's own once this process has loaded runs.tasks, else
    # unsaid, as apply_async sends it; the worker then takes the task's, True, either way). One producer (one pooled
    # connection) sends them all and, on Redis, several in one pipeline (kombu's Producer.batch, one round trip;
    # another broker sends each at once). A send that fails leaves its runs to the sweep, as a failing callback per
    # run left those after it: their leases are booked (tests/services/test_runs_insert_bulk.py compares the messages).
    # sent_from: for each booking, (the trace context to publish it in, its reply_to): those of the request thread
    # that made the run, when another thread sends it (DriveSender); None: this thread's.
    app = current_app
    amqp = app.amqp
    route = amqp.router.route({}, DRIVE)
    parent = app.current_worker_task
    root_id = (parent.request.root_id or parent.request.id) if parent else None
    parent_id = parent.request.id if parent else None
    common = {
        "reply_to": app.thread_oid,
        "create_sent_event": app.conf.task_send_sent_event,
        "root_id": root_id,
        "parent_id": parent_id,
        "ignore_result": task.ignore_result if (task := app._tasks.get(DRIVE)) is not None else None,
    }
    with app.producer_or_acquire() as producer, producer.connection._reraise_as_library_errors():
        _one_client(producer.channel)
        # A pipeline for one message costs more than it saves.
        with producer.batch() if len(bookings) > 1 else contextlib.nullcontext():
            # The route's queue, declared once per connection (kombu keeps what a connection declared): Celery
            # would bind a copy of it before each message only for maybe_declare to find it declared, so a
            # connection that has declared it is told so here, by the same test maybe_declare makes.
            declare: list | None = [] if _declared(producer.connection, route.get("queue")) else None
            for index, (run_id, task_id, *priority) in enumerate(bookings):
                args = (str(run_id),)
                level = broker_priority(priority[0]) if priority else None
                more = {"priority": level} if level is not None else {}
                context = None
                if sent_from:
                    context, common["reply_to"] = sent_from[index]
                # argsrepr as saferepr writes a one-string tuple (a uuid's text is far below its size limit).
                message = amqp.create_task_message(
                    task_id, DRIVE, args, None, argsrepr=repr(args), kwargsrepr="{}", **common
                )
                with telemetry.within(context):
                    amqp.send_task_message(producer, DRIVE, message, declare=declare, **route, **more)
                declare = []  # the first message's publish declared it: the next need not bind it again


def _declared(connection, queue) -> bool:
    """Whether this broker connection has declared queue (kombu.common.maybe_declare's own test)."""
    return queue is not None and queue.can_cache_declaration and hash(queue) in connection.declared_entities


class _ChannelClient:
    """What a kombu Redis channel makes its publishing client with (its _create_client), keeping the one it made."""

    # kombu's Redis channel builds a new redis.Redis around its connection pool for every message it sends
    # (docs/PERFORMANCE-code.md), then drops it; the sockets are the pool's either way.
    # Such a client holds no connection of its own (it takes one from the pool per command and gives it back), so one
    # per channel serves every publish. The channel is a pooled connection's default channel, and app.producer_pool
    # hands that connection to one producer, held by one thread, at a time. A lost connection is the pool's to
    # replace, as before (the client's next command takes a new one); kombu's revive after an error may give the
    # producer a new channel, which gets its own; a new pool of the channel (after a close) gets a new client.

    def __init__(self, make):
        self.make, self.pool, self.client = make, None, None

    def __call__(self, asynchronous=False):
        if asynchronous:  # a consumer's (BRPOP, on the event loop): never a publisher's
            return self.make(asynchronous=True)
        pool = self.make.__self__.pool
        if self.client is None or pool is not self.pool:
            self.pool, self.client = pool, self.make()
        return self.client


def _one_client(channel) -> None:
    """Let a Redis channel reuse its publishing client (_ChannelClient); any other transport's is left alone."""
    make = getattr(channel, "_create_client", None)
    if make is not None and not isinstance(make, _ChannelClient) and hasattr(channel, "conn_or_acquire"):
        channel._create_client = _ChannelClient(make)


def booked_task_id(fence) -> str:
    return fence.owner.removeprefix("task:")


def enqueue_drive(*, run_id, task_id: str, priority: int, countdown: float = 0.0) -> None:
    """Send the drive task once the surrounding transaction commits (its lease booking names task_id), with the
    run's priority as the broker has it (broker_priority)."""
    level = broker_priority(priority)
    more = {"priority": level} if level is not None else {}
    _after_commit(
        lambda: drive.apply_async(args=[str(run_id)], task_id=task_id, countdown=countdown or None, **more),
        f"run {run_id}: drive task",
        then=_SWEEP,
    )


def enqueue_item(*, run_id, sid: str, task_id: str) -> None:
    """Send an item of a run's fan-out to the fleet once the walk's commit that booked it is in (runs.walk.fleet)."""
    _after_commit(
        lambda: item.apply_async(args=[str(run_id), sid], task_id=task_id),
        f"run {run_id}: task of fan-out item {sid}",
        then="the walk takes the item back once its booking expires",
    )


def enqueue_wake(*, run_id, countdown: float) -> None:
    """A durable timer's wake-up, after commit. If it is lost, the sweep wakes the run (wake_at is in the database)."""
    _after_commit(
        lambda: wake.apply_async(args=[str(run_id)], countdown=countdown or None),
        f"run {run_id}: wake-up",
        then="the sweep wakes it once it is due",
    )


def enqueue_bulk(*, bulk_id: int) -> None:
    _after_commit(
        lambda: bulk.apply_async(args=[bulk_id]),
        f"bulk action {bulk_id}: task",
        then="the sweep sends it again",
    )


def enqueue_rerun(*, rerun_id, claim: str, countdown: float = 0.0) -> None:
    """A rerun's next turn (runs.services.reruns), after commit; its claim names the chain it belongs to."""
    _after_commit(
        lambda: rerun.apply_async(args=[str(rerun_id), claim], countdown=countdown or None),
        f"rerun {rerun_id}: task",
        then="the sweep sends it again",
    )


def enqueue_sweep(*, who: str = "lease-expiry") -> None:
    """A sweep now, sooner than the beat's next tick: a lease expired or a timer came due (runs.recovery.RecoveryLook).
    No countdown: a message a worker holds until its eta dies with that worker, and its eta is the sender's clock."""
    _after_commit(
        lambda: sweep.apply_async(kwargs={"who": who}),
        "sweep at a lease's expiry",
        then="the beat's next tick sweeps",
    )
