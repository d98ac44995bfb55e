"""Python workflows the tests run (PAL_WORKFLOW_MODULES=tests.code.sample_workflows for their workers).

Each real call of a @step function appends a line to PAL_TEST_CALLS_FILE (when set) and to CALLS, so a test
counts the calls a crash or a replay made again."""

import json
import os

from pal.workflows import StepFailed, current_step, step, workflow
from tests.tasks import sample_tasks

CALLS: list[tuple[str, str]] = []  # (function, key) of each real call in this process


def called(name: str) -> None:
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
    """Every ctx call that reaches a peer, between @step calls, a map, an approval, a timer and a child."""
    outline = ctx.llm(model="gpt-4o-mini", prompt=f"OUTLINE {input['ticket']}")
    waited = pause(input.get("seconds", 0.4))
    doubled = ctx.map(double, [1, 2, 3, 4], max_concurrency=2)
    ctx.webhook(url=input["hook"], body={"outline": outline["text"]})
    draft = ctx.llm(model="gpt-4o-mini", prompt=f"DRAFT {outline['text']}")
    decision = ctx.approval(f"Send {draft['text']}?")
    ctx.sleep(0.5)
    ctx.email(to=[input["to"]], subject="Your ticket", body=draft["text"])
    child = ctx.child("py-sum", {"xs": doubled})
    later = pause(input.get("seconds", 0.4))
    return {"draft": draft["text"], "approved": decision["approved"], "child": child, "paused": waited + later}


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
