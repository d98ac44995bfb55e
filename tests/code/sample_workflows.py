"""Python workflows the tests run (PAL_WORKFLOW_MODULES=tests.code.sample_workflows for their workers).

Each real call of a @step function or of the stamp tool appends a line to PAL_TEST_CALLS_FILE (when set) and to
CALLS, so a test counts the calls a crash or a replay made again."""

import json
import os
import signal

from pal.tools import tool
from pal.workflows import StepFailed, current_step, step, workflow
from runs.steps.base import StepContext
from tests.tasks import sample_tasks

CALLS: list[tuple[str, str]] = []  # (function, key) of each real call in this process


def called(name: str, key: str | None = None) -> None:
    if key is None:
        ctx = current_step()
        key = ctx.key if ctx else ""
    CALLS.append((name, key))
    path = os.environ.get("PAL_TEST_CALLS_FILE")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"fn": name, "key": key, "pid": os.getpid()}) + "\n")


@step
def add(a: int, b: int) -> int:
    called("add")
    return a + b


@step
def double(n: int) -> int:
    called("double")
    return n * 2


@step(retry={"max_attempts": 2})
def refuse(reason: str) -> None:
    called("refuse")
    raise ValueError(f"refused: {reason}")


@step
def pause(seconds: float) -> float:
    """A step that takes a while (a kill -9 lands inside it)."""
    import time

    called("pause")
    time.sleep(seconds)
    return seconds


def killed_after(label: str) -> None:
    """With PAL_TEST_KILL_DIR set (a worker's environment, never a test process's): the first time the code gets
    here, kill -9 the whole worker (its process group), right after the call before returned to the code and
    before the walk commits what it journals of it. Each label once: the replay after the kill goes past it."""
    folder = os.environ.get("PAL_TEST_KILL_DIR")
    if not folder:
        return
    try:
        open(os.path.join(folder, label), "x").close()
    except FileExistsError:
        return
    os.killpg(os.getpgrp(), signal.SIGKILL)


class KilledAfterEachCall:
    """A workflow's ctx whose every call is followed by killed_after("<n>-<method>"), n its place in the code."""

    def __init__(self, ctx):
        self._ctx, self._calls = ctx, 0

    def __getattr__(self, name: str):
        method = getattr(self._ctx, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            value = method(*args, **kwargs)
            self._calls += 1
            killed_after(f"{self._calls:02d}-{name}")
            return value

        return call


@tool
def stamp(label: str, ctx: StepContext) -> dict:
    """Stamps a label (a tool of a Python workflow's ctx.tool): each real run is noted with its key."""
    called("stamp", ctx.key)
    return {"stamped": label}


@tool
def hold_until(path: str, ctx: StepContext) -> dict:
    """Waits until a file exists at path (a test opens the gate): a step that holds its worker for as long as the
    test needs, stopped by a cancel or a steal (the lease is looked at between looks)."""
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
        ctx.check_lease()
    return {"held": path}


@workflow(name="py-sum")
def py_sum(ctx, input):
    total = 0
    for x in input["xs"]:
        total = add(total, x)
    return {"total": total}


@workflow(name="py-everything")
def py_everything(ctx, input):
    """Every kind of call a workflow can make without a peer: steps, a map, values, an approval, a sleep."""
    first = add(1, 2)
    when, token, luck = ctx.now(), ctx.uuid(), ctx.random()
    doubled = ctx.map(double, [1, 2, 3], max_concurrency=2)
    echoed = ctx.tool("echo", said=f"first {first}")
    decision = ctx.approval(f"Go on with {first}?")
    ctx.sleep(input.get("sleep", 0))
    child = ctx.child("py-sum", {"xs": [first, 4]})
    signal = ctx.signal("go") if input.get("signal") else None
    return {
        "first": first,
        "when": when.isoformat(),
        "token": str(token),
        "luck": luck,
        "doubled": doubled,
        "echoed": echoed,
        "approved": decision.get("approved") if isinstance(decision, dict) else decision,
        "child": child,
        "signal": signal,
    }


@workflow(name="py-typed-approval")
def py_typed_approval(ctx, input):
    """A typed approval from code: a form and choices, assigned to the input's owner, branching on the choice."""
    form = {"type": "object", "properties": {"amount": {"type": "integer", "maximum": 100}}, "required": ["amount"]}
    answer = ctx.approval("Refund?", form=form, choices=["refund", "hold"], assign={"user": input["owner"]})
    if answer["choice"] == "refund":
        return {"refunded": add(answer["amount"], 0)}
    return {"held": True}


@workflow(name="py-catches")
def py_catches(ctx, input):
    try:
        refuse("once")
    except StepFailed as failed:
        return {"caught": failed.code, "step": failed.step_id}
    return {"caught": None}


@workflow(name="py-refuses")
def py_refuses(ctx, input):
    refuse("always")


@workflow(name="py-raises")
def py_raises(ctx, input):
    add(1, 1)
    raise KeyError("no such invoice")


@workflow(name="py-bad-args")
def py_bad_args(ctx, input):
    return add({1, 2}, 3)  # a set is not JSON


@workflow(name="py-slow")
def py_slow(ctx, input):
    """input.n steps of input.seconds each, then a total: a kill -9 lands inside one."""
    done = [pause(input.get("seconds", 0.2)) for _ in range(input.get("n", 5))]
    return {"steps": len(done), "total": add(len(done), 0)}


@workflow(name="py-peers")
def py_peers(ctx, input):
    """Every ctx call (the peers', the waits', the values', a tool's and a task's) between @step calls."""
    ctx = KilledAfterEachCall(ctx)  # with PAL_TEST_KILL_DIR, the worker dies once right after each ctx call
    outline = ctx.llm(model="gpt-4o-mini", prompt=f"OUTLINE {input['ticket']}")
    when, token, luck = ctx.now(), ctx.uuid(), ctx.random()
    waited = pause(input.get("seconds", 0.4))
    stamped = ctx.tool("stamp", label=f"{input['ticket']} at {when.isoformat()}")
    doubled = ctx.map(double, [1, 2, 3, 4], max_concurrency=2)
    ctx.webhook(url=input["hook"], body={"outline": outline["text"], "token": str(token)})
    draft = ctx.llm(model="gpt-4o-mini", prompt=f"DRAFT {outline['text']}")
    decision = ctx.approval(f"Send {draft['text']}?")
    go = ctx.signal("go")
    ctx.sleep(0.5)
    ctx.email(to=[input["to"]], subject="Your ticket", body=draft["text"])
    charged = ctx.task(sample_tasks.charge, input["marks"], input.get("seconds", 0.4))
    child = ctx.child("py-sum", {"xs": doubled})
    later = pause(input.get("seconds", 0.4))
    return {
        "draft": draft["text"],
        "approved": decision["approved"],
        "signal": go,
        "child": child,
        "paused": waited + later,
        "when": when.isoformat(),
        "token": str(token),
        "luck": luck,
        "stamped": stamped,
        "charged": charged,
    }


@step
def classify(text: str) -> dict:
    called("classify")
    return {"tier": "gold" if "urgent" in text else "free"}


@workflow(
    name="py-attributed", attributes={"customer": "{{ input.customer }}", "tier": "{{ steps.classify.output.tier }}"}
)
def py_attributed(ctx, input):
    """Attributes from its input and from its classify step (issue 27)."""
    return classify(input["text"])


@workflow(name="py-task")
def py_task(ctx, input):
    """A task of Django's task framework called as a step, before and after an approval."""
    total = ctx.task(sample_tasks.add, 2, b=3)
    decision = ctx.approval(f"Add one to {total}?")
    return {"total": total, "again": ctx.task(sample_tasks.add, total, 1), "approved": decision["approved"]}


@workflow(name="py-signal")
def py_signal(ctx, input):
    first = add(1, 1)
    return {"first": first, "got": ctx.signal("go")}
