"""The agent loop of an llm_call with `tools`: call the model, run the tools it asks for, call it again with their
results, until it answers without a tool call (or max_turns is reached: the step fails with max_turns).
Each model answer is an llm_turn row (Idempotency-Key {step key}:turn{t}), each tool call an item {step}[{turn}.{n}]
with its own key and step_started / step_completed; a re-drive reads them back and goes on at its turn."""

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import StepError, Wait
from ..providers.base import Completion, cost_usd
from ..secrets import mask, redact
from .base import StepContext, run_masked
from .tools import TOOLS, ArgumentsInvalid

DEFAULT_MAX_TURNS = 8


@dataclass
class LoopJournal:
    """What one attempt's journal holds of its loop: turns by number, tool calls by index "turn.n"."""

    turns: dict[int, dict] = field(default_factory=dict)  # llm_turn payloads
    started: dict[str, dict] = field(default_factory=dict)  # a tool call's first step_started payload
    outcomes: dict[str, dict] = field(default_factory=dict)  # {"output": ...} or {"error": ...}
    requested: set[str] = field(default_factory=set)  # tool calls whose approval was asked for
    decisions: dict[str, dict] = field(default_factory=dict)  # approval_decided payloads


def call_index(turn: int, n: int) -> str:
    return f"{turn}.{n}"


def tool_messages(turn: dict, results: list[Any]) -> list[dict]:
    """The assistant's turn and its tool results as OpenAI's messages (tool_calls, then one role: tool each)."""
    calls = turn.get("tool_calls") or []
    assistant: dict[str, Any] = {"role": "assistant", "content": turn["message"].get("content") or None}
    if calls:
        assistant["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": call["arguments"]
                    if isinstance(call["arguments"], str)
                    else json.dumps(call["arguments"]),
                },
            }
            for call in calls
        ]
    replies = [
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
        for call, result in zip(calls, results, strict=True)
    ]
    return [assistant, *replies]


def run_loop(
    step: dict, ctx: StepContext, messages: list[dict], complete: Callable[[list[dict], str, dict], Completion]
) -> dict:
    """The loop's output: {text, model, turns: [{turn, message, tool_calls: [{name, arguments, result, ...}],
    usage, cost_usd}], usage, cost_usd}. complete(messages, key, options) is one model call."""
    names = list(step["tools"])
    missing = [name for name in names if name not in TOOLS]
    if missing:  # posted where they were registered, walked where they are not: nothing can answer the model
        raise StepError(
            f"tools {', '.join(missing)} are not registered in this process (is their module in PAL_WORKFLOW_MODULES?)",
            code="unknown_tool",
            details={"tools": missing},
        )
    offered = [TOOLS[name].offered() for name in names]
    max_turns = int(step.get("max_turns") or DEFAULT_MAX_TURNS)
    journal: LoopJournal = ctx.loop_read() or LoopJournal()
    messages = list(messages)
    turns: list[dict] = []
    prompt_tokens = completion_tokens = 0
    cost = 0.0
    for number in range(1, max_turns + 1):
        ctx.check_lease()
        turn = journal.turns.get(number)
        if turn is None:
            if number > 1:  # the first call was let in by the walk's own check, before the step started
                ctx.budget_check(prompt_tokens + completion_tokens, cost)
            key = f"{ctx.key}:turn{number}"
            completion = complete(messages, key, {"tools": offered})
            turn = mask(
                {
                    "turn": number,
                    "key": key,
                    "model": completion.model,
                    "message": {"role": "assistant", "content": completion.text},
                    "tool_calls": completion.tool_calls,
                    "usage": {
                        "prompt_tokens": completion.prompt_tokens,
                        "completion_tokens": completion.completion_tokens,
                    },
                    "cost_usd": cost_usd(step["model"], completion.prompt_tokens, completion.completion_tokens),
                }
            )
            ctx.loop_write("llm_turn", None, turn)
        prompt_tokens += int(turn["usage"]["prompt_tokens"])
        completion_tokens += int(turn["usage"]["completion_tokens"])
        cost = round(cost + float(turn.get("cost_usd") or 0.0), 10)
        calls = turn.get("tool_calls") or []
        if calls and number == max_turns:
            raise StepError(
                f"the model still asked for tools at turn {number}, the step's max_turns",
                code="max_turns",
                details={"max_turns": max_turns, "tool_calls": [call["name"] for call in calls]},
            )
        results = [tool_call(step, ctx, journal, call_index(number, n), call) for n, call in enumerate(calls)]
        turns.append(
            {
                "turn": number,
                "message": turn["message"],
                "tool_calls": [
                    {
                        "id": call["id"],
                        "name": call["name"],
                        "arguments": call["arguments"],
                        "result": result,
                        "key": f"{ctx.run_id}:{ctx.step_id}[{call_index(number, n)}]:{ctx.attempt}",
                    }
                    for n, (call, result) in enumerate(zip(calls, results, strict=True))
                ],
                "usage": turn["usage"],
                "cost_usd": turn.get("cost_usd") or 0.0,
            }
        )
        if not calls:
            return {
                "text": turn["message"].get("content") or "",
                "model": turn.get("model") or step["model"],
                "turns": turns,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
                "cost_usd": cost,
            }
        messages += tool_messages(turn, results)
    raise AssertionError("unreachable: the last turn returns or raises")  # pragma: no cover


def tool_call(step: dict, ctx: StepContext, journal: LoopJournal, index: str, call: dict) -> Any:
    """One tool call of the model, as an item of the step: its journaled result, or the tool run now (after an
    operator's decision, for a tool in approve_tools). What goes back to the model: the tool's output, or
    {"error", "code"} when the call could not be made or the tool failed definitely."""
    if index in journal.outcomes:
        outcome = journal.outcomes[index]
        return outcome["output"] if "output" in outcome else _error_result(outcome["error"])
    sid = f"{ctx.step_id}[{index}]"
    name, asked = call["name"], call["arguments"]
    arguments = asked
    extra: dict[str, Any] = {}
    if name in (step.get("approve_tools") or []):
        decision = journal.decisions.get(index)
        if decision is None:
            waiting_on = {
                "kind": "approval",
                "step_id": sid,
                "attempt": ctx.attempt,
                "prompt": f"Run tool {name}?",
                "tool": name,
                "arguments": asked,
                "of": ctx.step_id,
            }
            request = {"prompt": waiting_on["prompt"], "tool": name, "arguments": asked, "call": sid}
            raise Wait(waiting_on, journal=[] if index in journal.requested else [("approval_requested", request)])
        extra["decision"] = {k: decision.get(k) for k in ("approved", "by", "comment")}
        if not decision.get("approved"):
            result = {"rejected": True, "by": decision.get("by"), "comment": decision.get("comment") or ""}
            failure = StepError(
                f"rejected by {decision.get('by')}: {decision.get('comment') or 'no comment'}", code="tool_rejected"
            ).as_payload()
            _start(ctx, journal, index, name, arguments, extra)
            ctx.loop_write("step_failed", index, {**failure, "details": result})
            return result
        if isinstance(decision.get("arguments"), dict):
            arguments, extra["asked"] = decision["arguments"], asked
    key = _start(ctx, journal, index, name, arguments, extra)
    try:
        output = _run_tool(step, ctx, sid, key, name, arguments, resumed=index in journal.started)
    except StepError as exc:
        if not exc.permanent:
            raise  # an unknown outcome: the step goes again under the same keys, and so does this call
        failure = exc.as_payload()
        ctx.loop_write("step_failed", index, failure)
        journal.outcomes[index] = {"error": failure}
        return _error_result(failure)
    ctx.loop_write("step_completed", index, {"output": output})
    journal.outcomes[index] = {"output": output}
    return output


def _start(ctx: StepContext, journal: LoopJournal, index: str, name: str, arguments: Any, extra: dict) -> str:
    """step_started of a tool call (again, resumed, when it had started before a crash); its key."""
    key = f"{ctx.run_id}:{ctx.step_id}[{index}]:{ctx.attempt}"
    payload: dict[str, Any] = {"key": key, "kind": "tool_call"}
    if index in journal.started:
        payload["resumed"] = True
    else:
        payload["input"] = redact({"tool": name, "args": arguments, **extra})  # as a step's input is journaled
    ctx.loop_write("step_started", index, payload)
    journal.started.setdefault(index, payload)
    return key


def _run_tool(step: dict, ctx: StepContext, sid: str, key: str, name: str, arguments: Any, *, resumed: bool) -> Any:
    registered = TOOLS.get(name)
    if registered is None or name not in step["tools"]:
        raise StepError(f"the model asked for tool {name!r}, which this step does not offer", code="unknown_tool")
    try:
        registered.checked(arguments)
    except ArgumentsInvalid as exc:
        raise StepError(
            f"tool {name}: {exc}", code="bad_args", details={"field": exc.field, "arguments": arguments}
        ) from None
    index = sid[len(ctx.step_id) + 1 : -1]

    def emit(kind: str, payload: Any = None) -> int:
        return ctx.loop_emit(index, kind, payload)

    item = replace(
        ctx,
        step_id=sid,
        key=key,
        resumed=resumed,
        emit=emit,
        find=_nothing,
        extra={},
        sent=False,
    )
    return run_masked(lambda fields, context: registered.run(fields["args"], context), {"args": arguments}, item)


def _nothing(kind: str) -> None:
    return None


def _error_result(failure: dict) -> dict:
    if failure.get("code") == "tool_rejected" and isinstance(failure.get("details"), dict):
        return failure["details"]
    return {"error": failure.get("message", ""), "code": failure.get("code", "step_error")}
