"""The walk of a Python workflow: its function replayed on a thread of its own against the journal.

Each @step or ctx call asks the walk's thread for a step (id: its name, then name#2, ...): one the journal has
completed answers with its output at once; any other runs as a JSON step does (a branch of the graph scheduler).
A call the journal does not hold at that point parks the run on nondeterminism; nothing is called."""

import json
import queue
import threading
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections

from journal.services import FencedOut

from .. import leases
from ..code import CodeWorkflow, current, journal_order, path_of
from ..errors import StepError
from ..replay import MISSING, StepState, replay
from ..steps.base import get_kind
from .fleet import items_of
from .scheduler import GO_ON, Graph

TICK = 0.5  # seconds between looks at the lease while the workflow's own code runs between two calls


class Stopped(BaseException):
    """Raised in a workflow's code at its next call once its walk has stopped (parked, sliced, fenced out)."""


class StepFailed(Exception):
    """A step's attempts are spent: raised in the workflow's code at its call (uncaught, it fails the run)."""

    def __init__(self, step_id: str, failure: dict):
        super().__init__(f"step {step_id} failed: {failure.get('message', '')}")
        self.step_id, self.failure = step_id, failure
        self.code = failure.get("code", "step_error")


@dataclass
class Call:
    """One step the code asks for: its name (the id before #n), kind and literal fields."""

    name: str
    kind: str
    fields: dict
    retry: dict | None = None
    timeout_seconds: float | None = None
    items: list | None = None  # ctx.map: one item per element
    max_concurrency: int | None = None

    def step(self, sid: str) -> dict:
        step: dict[str, Any] = {"id": sid, "kind": self.kind, **self.fields}
        if self.retry:
            step["retry"] = self.retry
        if self.timeout_seconds:
            step["timeout_seconds"] = self.timeout_seconds
        if self.items is not None:
            step["for_each"] = "code"
            step["max_concurrency"] = self.max_concurrency or 10
        return step


def checked(call: Call) -> Call:
    """The call as the walk gets it, on the code's thread: JSON fields, valid for its kind; else ValueError."""
    try:
        call.fields = json.loads(json.dumps(call.fields, allow_nan=False))
        if call.items is not None:
            call.items = json.loads(json.dumps(list(call.items), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{call.name}: its arguments must be JSON ({exc})") from None
    kind = get_kind(call.kind)
    assert kind is not None
    timeout = {"timeout_seconds": call.timeout_seconds} if call.timeout_seconds else {}
    problems = kind.validate({"kind": call.kind, **call.fields, **timeout})
    if call.retry is not None:
        attempts = call.retry.get("max_attempts", 1)
        if not isinstance(attempts, int) or not 1 <= attempts <= 100:
            problems.append(("retry.max_attempts", "must be a whole number from 1 to 100"))
    if problems:
        raise ValueError("; ".join(f"{call.name}: {field} {message}" for field, message in problems))
    return call


class Runner:
    """The workflow function on its own thread; each call it makes waits for the walk's thread's answer."""

    def __init__(self, code: CodeWorkflow, run_id: str, input: dict):
        self.code, self.run_id, self.input = code, run_id, input
        self.requests: queue.Queue = queue.Queue()
        self.replies: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self.main, name=f"pal-code-{run_id[:8]}", daemon=True)

    def main(self) -> None:
        current.calls = self
        try:
            value = self.code.fn(WorkflowContext(self), self.input)
        except Stopped:
            return
        except BaseException as exc:  # the workflow's own code raised: the run's failure
            self.requests.put(("raise", exc, traceback.format_exc()))
        else:
            self.requests.put(("return", value))
        finally:
            current.calls = None
            connections.close_all()  # this thread's own, should the code have queried the database

    # --- the code's thread -----------------------------------------------------------------------

    def ask(self, call: Call) -> Any:
        self.requests.put(("step", checked(call)))
        answer, value = self.replies.get()
        if answer == "stop":
            raise Stopped()
        if answer == "raise":
            raise value
        return value

    # --- the walk's thread -----------------------------------------------------------------------

    def next(self, fence) -> tuple:
        if self.thread.ident is None:
            self.thread.start()
        while True:
            try:
                return self.requests.get(timeout=TICK)
            except queue.Empty:
                if leases.heartbeat.lost(fence):
                    raise FencedOut(fence) from None

    def answer(self, value: Any) -> None:
        self.replies.put(("value", value))

    def throw(self, exc: BaseException) -> None:
        self.replies.put(("raise", exc))

    def stop(self) -> None:
        self.replies.put(("stop", None))


class WorkflowContext:
    """What a workflow function gets as ctx: each call a journaled step of its run (contract section 11)."""

    def __init__(self, runner: Any):  # a Runner (a walk) or a _Replay (pal_check_workflows)
        self._runner = runner
        self.run_id = runner.run_id
        self.input = runner.input

    def _call(self, name: str, kind: str, fields: dict, *, id: str | None = None, **more) -> Any:
        return self._runner.ask(Call(id or name, kind, {k: v for k, v in fields.items() if v is not None}, **more))

    def llm(self, *, model: str, prompt=None, messages=None, tools=None, max_turns=None, id=None, **fields):
        fields = {
            "model": model,
            "prompt": prompt,
            "messages": messages,
            "tools": tools,
            "max_turns": max_turns,
            **fields,
        }
        return self._call("llm", "llm_call", fields, id=id)

    def tool(self, name: str, *, id: str | None = None, **args):
        return self._call("tool", "tool_call", {"tool": name, "args": args}, id=id)

    def webhook(self, *, url: str, body: Any, id: str | None = None):
        return self._call("webhook", "deliver", {"channel": "webhook", "url": url, "body": body}, id=id)

    def email(self, *, to: list[str], subject: str, body: str, id: str | None = None):
        fields = {"channel": "email", "to": list(to), "subject": subject, "body": body}
        return self._call("email", "deliver", fields, id=id)

    def child(self, workflow: str, input: dict | None = None, *, id: str | None = None):
        return self._call("child", "child_run", {"workflow": workflow, "input": input or {}}, id=id)

    def approval(
        self,
        prompt: str,
        *,
        id: str | None = None,
        form: dict | None = None,
        choices: list[str] | None = None,
        assign: dict | None = None,
        timeout_seconds: float | None = None,
        on_timeout: Any = None,
        notify: dict | None = None,
        link_decides: bool | None = None,
    ):
        """A person's decision (docs/reference/workflows.md, `approval`): its typed fields as an approval step's."""
        fields = {
            "prompt": prompt,
            "form": form,
            "choices": choices,
            "assign": assign,
            "on_timeout": on_timeout,
            "notify": notify,
            "link_decides": link_decides,
        }
        return self._call("approval", "approval", fields, id=id, timeout_seconds=timeout_seconds)

    def signal(self, name: str, *, id: str | None = None):
        return self._call("signal", "signal", {"name": name}, id=id)

    def sleep(self, seconds: float, *, id: str | None = None):
        return self._call("sleep", "sleep", {"seconds": seconds}, id=id)

    def task(self, task, *args, id: str | None = None, **kwargs):
        """A task of Django's task framework run as a step (kind django_task): cached, claimed."""
        fields = {"task": path_of(task.func), "args": {"args": list(args), "kwargs": kwargs}}
        return self._call(task.func.__name__, "django_task", fields, id=id)

    def map(self, fn, items, *, max_concurrency: int = 10, id: str | None = None) -> list:
        """fn (a @step function) on each item, up to max_concurrency at once, on the whole fleet; their outputs."""
        code = getattr(fn, "pal_step", None)
        if code is None:
            raise ValueError(f"ctx.map takes a @step function; {fn!r} is none")
        fields = {"function": code.path}
        return self._call("map", "python", fields, id=id, items=list(items), max_concurrency=max_concurrency)

    def now(self):
        return datetime.fromisoformat(self._call("now", "python", {"function": "runs.steps.python.now"}))

    def uuid(self):
        return uuid.UUID(self._call("uuid", "python", {"function": "runs.steps.python.uuid4"}))

    def random(self) -> float:
        return self._call("random", "python", {"function": "runs.steps.python.random_value"})


def step_id_for(names: Counter, name: str) -> str:
    """A call's step id: its name, then name#2, name#3 ... in call order (names counts the calls so far)."""
    names[name] += 1
    return name if names[name] == 1 else f"{name}#{names[name]}"


def divergence(journal: tuple[str, str], code: dict) -> dict:
    """The run's waiting_on when the code asks for another step than the journal holds at that point."""
    return {"kind": "nondeterminism", "journal": {"step_id": journal[0], "kind": journal[1]}, "code": code}


class CodeGraph(Graph):
    """The scheduler over the steps a workflow function asks for, one at a time, as it asks for them."""

    def __init__(self, walk, states: dict[str, StepState], code: CodeWorkflow):
        super().__init__(walk, states)
        self.steps = []  # grows with the code's calls (the stored definition has none)
        self.runner = Runner(code, walk.run_text, walk.run.input)
        self.journal = journal_order(walk.run.id)
        self.names: Counter = Counter()
        self.calls = 0
        self.asked: str | None = None  # the step the code waits on
        self.returned: Any = MISSING
        self.ended: dict | None = None  # the code raised: the run's failure
        self.diverged: dict | None = None  # the code asked for another step than the journal holds
        self.code_items: dict[str, list] = {}  # each ctx.map's elements, by its step id
        self.fleet = settings.PAL_ITEMS_ACROSS_WORKERS
        if self.fleet:
            self.left = items_of(run_id=walk.run.id)
            self.drop_left([sid for sid, row in self.left.items() if not self.adoptable(row, self.states.get(sid))])
            walk.items_booked = walk.items_booked or bool(self.left)

    def close(self) -> None:
        self.runner.stop()
        super().close()

    def ready(self):
        while True:
            if self.asked is None:
                if self.returned is not MISSING or self.ended or self.diverged:
                    return []
                self.take(self.runner.next(self.walk.fence))
                continue
            state = self.states[self.asked]
            if state.output is MISSING:
                ready = super().ready()  # a ctx.map's last item may end its step here: the code goes on
                if ready or state.output is MISSING or self.failed is not None:
                    return ready
            self.asked = None
            self.runner.answer(state.output)

    def take(self, message: tuple) -> None:
        """What the code asked for: a step (the one to wait on now), its return value or its exception."""
        position = self.calls
        if message[0] == "raise":
            _, exc, text = message
            if isinstance(exc, StepFailed):  # a step's failure the code did not catch: the run fails on it
                self.ended = {"step_id": exc.step_id, **exc.failure}
            else:
                self.ended = {"step_id": None, **_code_failure(exc, text)}
            return
        if message[0] == "return":
            if position < len(self.journal):
                self.diverge(position, {"step_id": None, "kind": "return"})
            else:
                self.returned = message[1]
            return
        call: Call = message[1]
        self.calls += 1
        sid = step_id_for(self.names, call.name)
        if position < len(self.journal) and self.journal[position] != (sid, call.kind):
            return self.diverge(position, {"step_id": sid, "kind": call.kind})
        step = call.step(sid)
        self.add(step, call.items)
        self.asked = sid

    def diverge(self, position: int, code: dict) -> None:
        self.diverged = divergence(self.journal[position], code)

    def add(self, step: dict, items: list | None) -> None:
        sid = step["id"]
        self.steps.append(step)
        self.by_id[sid] = step
        self.needs[sid] = []
        self.position[sid] = len(self.order)
        self.order.append(sid)
        self.dependents[sid] = []
        self.open_needs[sid] = 0
        self.frontier.add(sid)
        self.states.setdefault(sid, StepState())
        if items is not None:
            self.code_items[sid] = items

    def step_items(self, step: dict) -> list:
        return self.code_items[step["id"]]

    def complete(self) -> bool:
        return False  # the code's return ends the run, not its steps' outputs (idle)

    def idle(self):
        walk = self.walk
        if self.diverged is not None:
            return walk.park(self.diverged)
        if self.ended is not None:
            failure = dict(self.ended)
            return walk.finish_failed(failure.pop("step_id"), failure.pop("attempt", None), failure)
        if self.failed is not None and self.asked is not None:
            # The step's attempts are spent: the code gets StepFailed at its call (it may catch it and go on).
            failed, self.failed = self.failed, None
            step_id = failed.step["id"]
            self.frontier.discard(step_id)
            self.asked = None
            failure = {**(failed.state.failure or {}), "attempt": failed.state.attempt}
            failure.pop("ms", None)
            self.runner.throw(StepFailed(step_id, failure))
            return GO_ON
        if self.returned is not MISSING:
            return walk.finish_succeeded(output=self.returned)
        return super().idle()


def _code_failure(exc: BaseException, text: str) -> dict:
    """The journal's form of an exception of the workflow's own code: masked, with its traceback's last lines."""
    last = [line for line in text.strip().splitlines() if line.strip()][-3:]
    return StepError(
        f"the workflow's code raised {type(exc).__name__}: {exc}",
        code="workflow_error",
        details={"exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}", "traceback": last},
    ).as_payload()


class _Replay:
    """Answers a workflow function's calls from a run's journal alone (dry_replay): nothing is called."""

    def __init__(self, run, states: dict[str, StepState], journal: list[tuple[str, str]]):
        self.run_id, self.input = str(run.id), run.input
        self.states, self.journal = states, journal
        self.names: Counter = Counter()
        self.calls = 0
        self.diverged: dict | None = None

    def ask(self, call: Call) -> Any:
        position, sid = self.calls, step_id_for(self.names, call.name)
        self.calls += 1
        if position >= len(self.journal):
            raise Stopped()  # past what the journal holds: the same so far
        if self.journal[position] != (sid, call.kind):
            self.diverged = divergence(self.journal[position], {"step_id": sid, "kind": call.kind})
            raise Stopped()
        state = self.states.get(sid)
        if state is None or state.output is MISSING:
            if state is not None and state.failure is not None and position + 1 < len(self.journal):
                raise StepFailed(sid, state.failure)  # the code caught it: later steps followed
            raise Stopped()
        return state.output


def dry_replay(code: CodeWorkflow, run, rows) -> dict | None:
    """Replay a run's journal (its replay rows) against the code as it is now, calling nothing: the
    nondeterminism the run's walk would park on, or None when the code asks for what the journal holds."""
    replay_ = _Replay(run, replay(rows), journal_order(run.id))
    current.calls = replay_
    try:
        code.fn(WorkflowContext(replay_), run.input)
    except Stopped:
        pass
    except Exception:
        pass
    else:
        if replay_.calls < len(replay_.journal):
            return divergence(replay_.journal[replay_.calls], {"step_id": None, "kind": "return"})
    finally:
        current.calls = None
    return replay_.diverged
