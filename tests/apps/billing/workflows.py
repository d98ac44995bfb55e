"""An app's workflows.py: imported at start-up as admin.py is, with no PAL_WORKFLOW_MODULES naming it."""

from pal.workflows import step, workflow


@step
def charge(amount: int) -> dict:
    return {"charged": amount}


@workflow(name="billing-refund")
def billing_refund(ctx, input):
    return charge(input["amount"])
