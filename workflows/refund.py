"""The tour's Python workflow and agent (README): `make run` imports it (PAL_WORKFLOW_MODULES=workflows.refund).

A refund: look the invoice up (a 20-second step: time to kill the worker), draft a note with the model, ask a person
when the amount is over 100, check every line on the fleet, mail the customer."""

import time

from pal.tools import tool
from pal.workflows import step, workflow


@step(retry={"max_attempts": 3, "backoff_seconds": 1})
def fetch_invoice(invoice_id: int, wait_seconds: float = 20) -> dict:
    time.sleep(wait_seconds)  # a slow system of record: kill -9 the worker now, the step runs again under the same key
    lines = [{"sku": f"A-{n}", "amount": 40 + n} for n in range(3)]
    return {
        "id": invoice_id,
        "email": "customer@example.com",
        "amount": sum(x["amount"] for x in lines),
        "lines": lines,
    }


@step
def check_line(line: dict) -> dict:
    return {"sku": line["sku"], "ok": line["amount"] > 0}


@workflow(name="refund", concurrency={"key": "{{ input.customer }}", "max_runs": 2}, budget={"max_cost_usd": 1})
def refund(ctx, input):
    """Refund an invoice: draft, approve over 100, check the lines, mail."""
    inv = fetch_invoice(input["invoice_id"], input.get("wait_seconds", 20))
    draft = ctx.llm(model="gpt-4o-mini", prompt=f"Draft a refund note for invoice {inv['id']}")
    if inv["amount"] > 100:
        ctx.approval(f"Refund {inv['amount']}?")  # parks the run: no worker held while it waits
    checks = ctx.map(check_line, inv["lines"], max_concurrency=4)  # one item per line, on the whole fleet
    ctx.email(to=[inv["email"]], subject="Your refund", body=draft["text"])
    return {"refunded": inv["amount"], "checks": checks}


@tool
def lookup_invoice(invoice_id: int) -> dict:
    """The invoice as the system of record has it."""
    return {"id": invoice_id, "amount": 123, "paid": True}


@tool
def refund_payment(invoice_id: int, amount: float) -> dict:
    """Refund an invoice (an operator approves each call first: approve_tools)."""
    return {"invoice_id": invoice_id, "refunded": amount}


@workflow(name="refund-agent")
def refund_agent(ctx, input):
    """An agent: the model looks the invoice up and refunds it; each refund waits for an operator."""
    answer = ctx.llm(
        model="gpt-4o-mini",
        prompt=input["ticket"],
        tools=["lookup_invoice", "refund_payment"],
        approve_tools=["refund_payment"],
    )
    return {"reply": answer["text"], "turns": len(answer["turns"])}
