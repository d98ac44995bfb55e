"""Typed tools for the agent-loop tests (PAL_WORKFLOW_MODULES=tests.code.agent_tools for their workers).

Each real run of a tool appends {tool, key, args} to PAL_TEST_CALLS_FILE (when set) and to RAN, so a test counts
the runs a crash or a replay made again."""

import json
import os

import pydantic

from pal.tools import tool
from pal.workflows import workflow
from runs.steps.base import StepContext

RAN: list[dict] = []  # each real run in this process


def ran(name: str, ctx: StepContext, **args) -> None:
    line = {"tool": name, "key": ctx.key, "args": args, "pid": os.getpid()}
    RAN.append(line)
    path = os.environ.get("PAL_TEST_CALLS_FILE")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(line) + "\n")


@tool
def lookup(turn: int, n: int, ctx: StepContext) -> dict:
    """Looks a thing up: what the model asked, with the call's key."""
    ran("lookup", ctx, turn=turn, n=n)
    return {"found": f"thing {turn}.{n}"}


@tool(name="issue_refund", description="Refund an invoice.")
def refund(invoice_id: int, amount: float, ctx: StepContext) -> dict:
    ran("issue_refund", ctx, invoice_id=invoice_id, amount=amount)
    return {"refunded": amount, "invoice_id": invoice_id}


class RefundRequest(pydantic.BaseModel):
    invoice_id: int
    amount: float = pydantic.Field(gt=0)
    reason: str = ""


@tool
def file_refund(request: RefundRequest, ctx: StepContext) -> dict:
    """File a refund request (a tool whose parameter is a pydantic model)."""
    ran("file_refund", ctx, request=request.model_dump())
    return {"filed": request.invoice_id, "amount": request.amount, "as": type(request).__name__}


@workflow(name="py-agent")
def py_agent(ctx, input):
    answer = ctx.llm(model="gpt-4o-mini", prompt=input["ask"], tools=["lookup"], max_turns=input.get("max_turns"))
    return {"text": answer["text"], "turns": len(answer["turns"])}


def refund_reply(body: dict):
    """A model that asks once for issue_refund(invoice_id=7, amount=120.0), then answers with what it got."""
    results = [m.get("content") for m in body.get("messages") or [] if m.get("role") == "tool"]
    if not results:
        return {
            "content": None,
            "tool_calls": [{"name": "issue_refund", "arguments": {"invoice_id": 7, "amount": 120.0}}],
        }
    return f"refund said: {results[0]}"


def refund_step() -> dict:
    return {
        "id": "agent",
        "kind": "llm_call",
        "model": "gpt-4o-mini",
        "prompt": "refund invoice 7",
        "tools": ["issue_refund", "lookup"],
        "approve_tools": ["issue_refund"],
    }
