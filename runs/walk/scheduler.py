"""The graph scheduler: every ready step of a run's graph at once (a lone one on the walk's thread, the others on
threads of their own or booked for the fleet), their outcomes journaled by the walk's thread in the order they come."""

import logging
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.conf import settings

from journal.services import NewEvent

from ..budgets import budget_reached, has_budget
from ..code import STEPS
from ..errors import SliceOver, StepError
from ..expressions import when_true
from ..graph import needs_of, order
from ..replay import MISSING, StepState, item_id, step_key
from ..steps.tools import TOOLS
from ..workflows import DEFAULT_MAX_CONCURRENCY, for_each_items, step_policy
from .branch import Branch, Forward, Result
from .fleet import Booking, ItemRow, items_of
from .items import FleetItems, Walker

log = logging.getLogger("pal.executor")

# A step whose attempts take less than this runs its ready branches on the walk's own thread, one after another:
# handing a no-op tool to a thread (and its outcome back) costs more than running it.
QUICK_SECONDS = 0.002


# What Graph.idle returns when the loop goes on rather than ending the walk's slice (the walk's answers may be None).
GO_ON = object()


class Graph(FleetItems):
    """The walk over a run's steps as a graph: every step whose needs have ended runs at the same time as the other
    ready ones (and each for_each step runs up to max_concurrency items at a time), each on a thread of its own while
    more than one runs; a lone step runs on the walk's thread, as a plain list always did. A branch that waits parks;
    the run parks when nothing else can move. The walk's thread does all the journaling, in the order outcomes come.
    """

    def __init__(self, walk: Walker, states: dict[str, StepState]):
        self.walk = walk
        self.states = states
        self.steps = walk.definition["steps"]
        self.by_id = {step["id"]: step for step in self.steps}
        self.needs = needs_of(self.steps)
        self.order = order(self.steps)
        # The frontier: the steps whose needs have all ended and that are not known to have ended themselves. A
        # step that ends hands the frontier its dependents whose last need it was, so finding what is ready looks
        # at the frontier only, never at the whole graph again (a plain list of 1,000 steps: one step per look).
        self.position = {step_id: index for index, step_id in enumerate(self.order)}
        self.dependents: dict[str, list[str]] = {step_id: [] for step_id in self.order}
        for step_id, needs in self.needs.items():
            for need in needs:
                self.dependents[need].append(step_id)
        self.open_needs = {step_id: len(self.needs[step_id]) for step_id in self.order}
        self.frontier = {step_id for step_id in self.order if not self.needs[step_id]}
        self.forward = Forward()
        self.pool: ThreadPoolExecutor | None = None
        self.running: dict[str, Branch] = {}
        self.parked: dict[str, Branch] = {}
        self.later: dict[str, Branch] = {}  # branches waiting for their `due` (a backoff, an unknown outcome)
        self.items: dict[str, list] = {}  # a for_each step's items, rendered once its needs ended
        self.items_open: dict[str, list[int]] = {}  # the indices of a for_each step's items not ended yet
        self.failed: Branch | None = None
        self.stopping = False  # the slice is used up (or a child used it up): start nothing new
        self.walked = 0
        self.budgeted = has_budget(walk.run)  # the run or an ancestor has a budget: check it before each start
        self.over_budget: dict | None = None  # a cap reached: start nothing new, park once the others end
        # Items for the whole fleet (runs.walk.fleet): only a graph that can start several branches at once books
        # any, and only such a run can have rows left by an earlier walk of it (a crash) to adopt.
        self.fleet = settings.PAL_ITEMS_ACROSS_WORKERS and any(
            "for_each" in step or "needs" in step for step in self.steps
        )
        self.left: dict[str, ItemRow] = items_of(run_id=walk.run.id) if self.fleet else {}
        # Rows of an earlier walk that this one will not wait for go in its first commit: it runs those items anew
        # (booked again under a new epoch, or on its own threads), so a late message for an old booking (the fleet
        # was busy) takes nothing and a frozen worker of one writes nothing.
        self.drop_left([sid for sid, row in self.left.items() if not self.adoptable(row, self.states.get(sid))])
        walk.items_booked = walk.items_booked or bool(self.left)
        self.next_poll = 0.0
        # How many branches the fleet may hold at once: one more each time a worker takes a booking, half as many
        # each time the walk had to take one back (the fleet is busy). The rest run on the walk's threads at once,
        # so a busy fleet costs a fan-out nothing and an idle one takes more and more of it.
        self.fleet_window = 2
        self.took: dict[str, float] = {}  # per step: how long its attempts' code took (a moving average), seconds
        self.pure_sids: set[str] = set()  # branches started with their rows left for a later commit (deferrable)

    def close(self) -> None:
        self.forward.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    # --- what is ready ---------------------------------------------------------------------------

    def done(self, step_id: str) -> bool:
        state = self.states.get(step_id)
        return state is not None and state.output is not MISSING

    def complete(self) -> bool:
        """Every step has its output: the run succeeds."""
        return all(self.done(step["id"]) for step in self.steps)

    def busy(self, sid: str) -> bool:
        return sid in self.running or sid in self.parked or sid in self.later

    def ready(self) -> list[Branch]:
        """The branches to start now; journals (pending) the skips and the fan-outs' ends it finds on the way."""
        walk = self.walk
        taken: dict[str, Branch] = {}
        changed = True
        while changed:
            changed = False
            for step_id in sorted(self.frontier, key=self.position.__getitem__):
                state = self.states.setdefault(step_id, StepState())
                if state.output is not MISSING:
                    if step_id not in walk.step_context:
                        walk.remember(step_id, state.output, ended=False)  # the replay's: its attributes are set
                    self.frontier.discard(step_id)
                    for dependent in self.dependents[step_id]:
                        self.open_needs[dependent] -= 1
                        if not self.open_needs[dependent]:
                            self.frontier.add(dependent)
                    changed = True
                    continue
                if step_id in taken or self.busy(step_id):
                    continue
                step = self.by_id[step_id]
                if "when" in step and not state.started:
                    try:
                        go_on, value = when_true(step["when"], walk.context())
                    except StepError as exc:  # a comparison the data cannot make ("7" > 5): the step's failure
                        self.fail_unstarted(step, state, exc)
                        continue
                    if not go_on:
                        payload = {"when": step["when"], "value": value}
                        walk.pending.append(NewEvent("step_skipped", step_id, None, payload))
                        state.output, state.skipped = None, True
                        walk.remember(step_id, None)
                        changed = True
                        continue
                if "for_each" in step:
                    changed = self.items_ready(step, state, taken) or changed
                    continue
                branch = self.retry_or_fail(Branch(step_id, step, state))
                if branch is not None:
                    taken[step_id] = branch
        return [] if self.failed is not None else list(taken.values())

    def step_items(self, step: dict) -> list:
        """A for_each step's items, worked out once its needs have ended."""
        return for_each_items(step, self.walk.context())

    def fail_unstarted(self, step: dict, state: StepState, error: StepError) -> None:
        """A step that fails before it starts (its `when` or its for_each's items cannot be worked out): a definite
        failure that no retry mends, journaled step_failed (pending); the run fails once the others end."""
        failure = {**error.as_payload(), "ms": 0.0}
        self.walk.pending.append(NewEvent("step_failed", step["id"], state.attempt, failure))
        state.failure, state.failed_tries = failure, state.failed_tries + 1
        self.failed = self.failed or Branch(step["id"], step, state)

    def retry_or_fail(self, branch: Branch) -> Branch | None:
        """A branch whose last try failed: its next try, or None when its attempts are spent (the run fails)."""
        state = branch.state
        if state.failure is None:
            return branch
        max_attempts, _backoff = step_policy(branch.step)
        if state.failed_tries >= max_attempts:
            self.failed = self.failed or branch
            return None
        self.walk.next_try(state)
        return branch

    def items_ready(self, step: dict, state: StepState, taken: dict[str, Branch]) -> bool:
        """Take the items of a for_each step to start now (at most max_concurrency running) into `taken`; True when
        the step just ended (every item has its output: the step's output is their list, in order)."""
        walk, step_id = self.walk, step["id"]
        items = self.items.get(step_id)
        if items is None:
            try:
                items = self.step_items(step)
            except StepError as exc:
                self.fail_unstarted(step, state, exc)
                return False
            self.items[step_id] = items
            if not state.started:
                key = step_key(walk.run.id, step_id, state.attempt)
                payload = {"key": key, "kind": step["kind"], "items": len(items)}
                walk.pending.append(NewEvent("step_started", step_id, state.attempt, payload))
                state.started = True
        pending = self.items_open.get(step_id)
        if pending is None:  # the items without an output yet, in order: each look walks only their front
            pending = self.items_open[step_id] = [
                index
                for index in range(len(items))
                if self.states.setdefault(item_id(step_id, index), StepState()).output is MISSING
            ]
        limit = int(step.get("max_concurrency", DEFAULT_MAX_CONCURRENCY))
        prefix = step_id + "["
        in_flight = sum(1 for sid in (*self.running, *taken) if sid.startswith(prefix))
        kept: list[int] = []
        looked = 0
        for index in pending:
            if in_flight >= limit:
                break  # nothing more may start: the rest waits for the next look
            looked += 1
            sid = item_id(step_id, index)
            item_state = self.states[sid]
            if item_state.output is not MISSING:
                continue  # ended since the last look: off the list
            kept.append(index)
            if sid in taken or self.busy(sid):
                continue
            branch = self.retry_or_fail(Branch(sid, step, item_state, item=(index, items[index])))
            if branch is None:
                pending[:looked] = kept
                return False
            taken[sid] = branch
            in_flight += 1
        pending[:looked] = kept
        if pending:
            return False
        outputs = [self.states[item_id(step_id, index)].output for index in range(len(items))]
        walk.pending.append(
            NewEvent("step_completed", step_id, state.attempt, {"output": outputs, "items": len(items)})
        )
        state.output = outputs
        walk.remember(step_id, outputs)
        return True

    # --- running ---------------------------------------------------------------------------------

    def start(self, branches: list[Branch]) -> None:
        walk = self.walk
        lone = len(branches) == 1 and not self.running
        bookings: list[tuple[Branch, Booking]] = []
        for branch in branches:
            resumed = branch.state.started
            left = self.left.get(branch.sid)
            adopt = left is not None and self.adoptable(left, branch.state)
            if left is not None and not adopt:
                self.drop_left([branch.sid])  # its state moved on since the walk began: run anew, the row goes
            self.left.pop(branch.sid, None)
            ctx = walk.begin(branch, journal=not adopt)
            for name in (
                "claim",
                "confirm",
                "consume_signal",
                "child",
                "emit",
                "rate_limit",
                "rate_report",
                "lease_check",
                "loop_read",
                "loop_write",
                "loop_emit",
                "budget_check",
                "open_request",
                "clock",
            ):
                setattr(ctx, name, self.forward.wrap(getattr(ctx, name)))
            if adopt:
                # A worker runs it (or ran it) for an earlier walk of this run that died: wait for its row.
                branch.fleet, branch.booked_at, self.next_poll = True, time.monotonic(), 0.0
            elif (
                not lone
                and self.for_fleet(branch)
                and not self.quick(branch)  # not worth a trip to another worker
                and len(self.on_fleet()) + len(bookings) < self.fleet_window
            ):
                assert branch.fields is not None
                bookings.append(
                    (branch, Booking(branch.sid, branch.state.attempt, branch.fields, resumed, branch.step))
                )
        if bookings or not self.deferrable(branches):
            self.book(bookings)  # with the last outcomes and these step_started: one commit
        self.walked += len(branches)
        for branch in branches:
            if branch.fleet:
                self.running[branch.sid] = branch
        branches = [branch for branch in branches if not branch.fleet]
        if not branches:
            return
        # A lone branch runs on the walk's thread, as a plain list always did; so do branches of a step whose
        # attempts so far took less than handing one to a thread costs (no-op tools): one after another, their
        # outcomes journaled together with the next starts.
        inline = branches if lone else [branch for branch in branches if self.quick(branch)]
        threaded = [] if lone else [branch for branch in branches if not self.quick(branch)]
        if threaded and self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=settings.PAL_WALK_THREADS, thread_name_prefix="pal-branch")
        for branch in threaded:
            self.running[branch.sid] = branch
            assert self.pool is not None
            self.pool.submit(self.body, branch)
        for branch in inline:
            self.running[branch.sid] = branch
            began = time.monotonic()
            try:
                output, error = branch.invoke(), None
            except BaseException as exc:
                output, error = None, exc
            branch.took = time.monotonic() - began
            self.outcome(branch, output, error)

    def deferrable(self, branches: list[Branch]) -> bool:
        """Pure branches whose start may wait for a later commit: only while every row pending is a pure step's
        (or a skip), so a step with an effect always has its outcome committed before anything after it runs."""
        if not all(map(is_pure, branches)):
            return False
        self.pure_sids.update(branch.sid for branch in branches)
        pending_pure = all(e.kind == "step_skipped" or e.step_id in self.pure_sids for e in self.walk.pending)
        return pending_pure and self.walk.defer(len(branches))

    def quick(self, branch: Branch) -> bool:
        """The attempts of this branch's step so far took less than a thread hand-off costs."""
        took = self.took.get(branch.step["id"])
        return took is not None and took < QUICK_SECONDS

    def body(self, branch: Branch) -> None:
        """A branch's thread: the step's own code; its outcome goes back to the walk's thread."""
        began = time.monotonic()
        try:
            output = branch.invoke()
        except BaseException as exc:
            branch.took = time.monotonic() - began
            self.forward.inbox.put(("done", branch, None, exc))
        else:
            branch.took = time.monotonic() - began
            self.forward.inbox.put(("done", branch, output, None))

    def outcome(self, branch: Branch, output: Any, error: BaseException | None) -> None:
        del self.running[branch.sid]
        if branch.took:  # how long the step's code took (its worker's figure for an item on the fleet)
            step_id = branch.step["id"]
            seen = self.took.get(step_id)
            self.took[step_id] = branch.took if seen is None else 0.8 * seen + 0.2 * branch.took
        try:
            result = self.walk.settle(branch, output, error)
        except SliceOver:
            self.stopping = True  # a child used up the slice: the others finish their attempts, then the handoff
            branch.state.waiting = True  # its child goes on in the next slice: no second step_started
            return
        state = branch.state
        if result.result is Result.WAITING:
            self.parked[branch.sid] = branch
            if not branch.waits_on_child() and branch.wait_on.get("kind") != "paused":
                # Journaled with the next commit; a child's and a pause's at the parking, which may find them moved
                # (the child woke, the pause was resumed) and drive them on instead (Walk.go_waiting).
                self.walk.pending += branch.park_events
                branch.park_events = []
            state.waiting = True  # when it goes on, it goes on where it stopped: no second step_started
        elif result.result is Result.RETRY_LATER:
            branch.due, branch.handoff_reason = time.monotonic() + result.delay, "unknown outcome"
            self.later[branch.sid] = branch
        elif result.result is Result.FAILED:
            state.failed_tries += 1
            max_attempts, backoff = step_policy(branch.step)
            if state.failed_tries >= max_attempts:
                self.failed = self.failed or branch
            elif backoff > 0:
                self.walk.next_try(state)
                branch.due, branch.handoff_reason = time.monotonic() + backoff, "backoff"
                self.later[branch.sid] = branch
            else:
                self.walk.next_try(state)

    def next_message(self, timeout: float | None) -> None:
        try:
            message = self.forward.inbox.get(timeout=timeout)
        except queue.Empty:
            return
        if message[0] == "call":
            _, fn, args, kwargs, reply = message
            try:
                reply.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the branch's thread raises it, as a direct call would have
                reply.set_exception(exc)
        else:
            _, branch, output, error = message
            self.outcome(branch, output, error)

    # --- the loop --------------------------------------------------------------------------------

    def run(self):
        while True:
            ready = self.startable()
            if ready:
                self.start(ready)
            elif self.running:
                self.wait_for_running()
            else:
                ended = self.idle()
                if ended is not GO_ON:
                    return ended

    def startable(self) -> list:
        """The branches to start now: none once the walk stops, a branch failed or a budget cap was reached."""
        walk = self.walk
        if self.walked and walk.deadline is not None and time.monotonic() > walk.deadline:
            self.stopping = True
        now = time.monotonic()
        for sid, branch in list(self.later.items()):
            if branch.due <= now and not self.stopping:
                del self.later[sid]
        ready = [] if self.stopping or self.failed or self.over_budget else self.ready()
        if ready and self.budgeted:
            walk.flush()  # the spend is the journal's: the outcomes so far first
            self.over_budget = budget_reached(walk.run)  # the next step does not start past a cap
            if self.over_budget:
                ready = []
        return ready

    def wait_for_running(self) -> None:
        # A walk that is stopping starts none of its later branches (the next slice does): it waits for
        # what runs, not for their due times, which may have passed (a wait of 0 s: a spin until they end).
        later = () if self.stopping else self.later.values()
        soonest = min((b.due for b in later), default=None)
        if self.on_fleet():
            soonest = min(soonest or self.next_poll, self.next_poll)
        self.next_message(None if soonest is None else max(0.0, soonest - time.monotonic()))
        if self.on_fleet() and time.monotonic() >= self.next_poll:
            self.poll()

    def idle(self):
        """Nothing runs and nothing more can start now: the walk ends, hands off, sleeps or parks; GO_ON when the
        loop goes on (a sleep ended, or a child woke before the parking)."""
        walk = self.walk
        if self.failed is not None:
            failed = self.failed
            return walk.finish_failed(failed.sid, failed.state.attempt, failed.state.failure or {})
        if self.complete():
            return walk.finish_succeeded()
        if self.stopping and not (self.parked and not self.later and not self.ready()):
            return walk.end_slice()
        if self.later:
            first = min(self.later.values(), key=lambda b: b.due)
            delay = round(max(0.0, first.due - time.monotonic()), 3)  # to the millisecond: a countdown
            if not walk.nested:
                retry_step = first.sid if first.handoff_reason == "backoff" else None
                return walk.handoff(reason=first.handoff_reason, delay=delay, retry_step=retry_step)
            walk.flush()
            walk.sleep_fenced(delay)
            return GO_ON
        if self.over_budget:
            return walk.park(self.over_budget)
        if self.parked:
            # In the graph's order (an item's by its index), not the order their threads came back in: the run's
            # waits, its forms and the inbox's rows list them the same way every time.
            parked = sorted(
                self.parked.values(),
                key=lambda b: (self.position.get(b.step["id"], 0), b.item[0] if b.item is not None else -1),
            )
            moved = walk.go_waiting(parked)
            if not moved:
                return None
            # The child woke (or ended), or the pause was resumed, between its look and our parking: drive it on.
            for branch in moved:
                del self.parked[branch.sid]
                branch.wait, branch.park_events = None, []
            return GO_ON
        raise RuntimeError(f"run {walk.run.id}: no step can run and none waits")  # a bug: the graph is checked


def is_pure(branch: Branch) -> bool:
    """A step with no effect outside the database (a pure tool, a @step(pure=True)): its rows may wait for a
    later commit, since a crash that loses them only runs it again."""
    step = branch.step
    if step["kind"] == "tool_call":
        found = TOOLS.get(step.get("tool", ""))
        return found is not None and found.pure
    if step["kind"] == "python":
        code = STEPS.get((branch.fields or {}).get("function", ""))
        return code is not None and code.pure
    return False
