"""/inbox/ (issue 28): every open decision, filtered and ordered, decided from its row with a reason (htmx or a plain
form), its list refreshed by htmx; /ops/ counts them and links there."""

import re

import pytest
from django.contrib.auth.models import Group

from runs.models import RunStatus
from runs.services import workflow_create
from tests.code.agent_tools import RAN, refund_reply, refund_step
from tests.helpers import drive, drive_to_end, make_run, step_events

from .conftest import htmx, logged_in, make_user

pytestmark = pytest.mark.django_db


def waiting(*, workflow=None, **fields):
    run = make_run(
        workflow=workflow,
        steps=None if workflow else [{"id": "review", "kind": "approval", "prompt": "Ship it?", **fields}],
    )
    drive(run)
    assert run.status == RunStatus.WAITING
    return run


def rows(page: str) -> list[str]:
    """The run ids of the inbox's rows, in order."""
    return re.findall(r'<article class="decision-row kind-\w+" id="inbox-([0-9a-f-]{36})-', page)


def row_id(run, step="review") -> str:
    return f"inbox-{run.id}-{step}"


def test_the_inbox_lists_each_open_decision_with_a_form_for_an_operator(operator):
    run = waiting(choices=["ship", "hold"])

    page = operator.get("/inbox/").content.decode()

    assert rows(page) == [str(run.id)]
    assert "Ship it?" in page
    assert f'hx-target="#{row_id(run)}"' in page
    assert '<input type="text" name="comment" required' in page  # decided with a reason
    assert 'name="choice" value="hold"' in page
    assert 'hx-trigger="pal:inbox"' in page  # the list refreshes itself (pal.js, while nobody types in it)


def test_a_viewer_sees_the_decisions_without_forms(viewer):
    waiting()

    page = viewer.get("/inbox/").content.decode()

    assert "Ship it?" in page and '<form class="approval' not in page


def test_deciding_from_a_row_with_htmx_answers_the_row_and_journals_the_reason(operator):
    run = waiting()

    answer = operator.post(
        f"/runs/{run.id}/approvals/review/",
        {"approved": "1", "attempt": "1", "comment": "looks right", "next": "/inbox/"},
        headers=htmx(row_id(run)),
    )

    assert answer.status_code == 200
    text = answer.content.decode()
    assert text.lstrip().startswith(f'<article class="decision-row kind-approval" id="{row_id(run)}"')
    assert "Approved step review" in text and "is now running" in text
    (decided,) = step_events(run, "approval_decided", "review")
    assert (decided.payload["by"], decided.payload["comment"]) == ("otto", "looks right")
    assert rows(operator.get("/inbox/").content.decode()) == []


def test_deciding_from_a_row_without_javascript_comes_back_to_the_inbox(operator):
    run = waiting()

    answer = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "0", "comment": "no", "next": "/inbox/?order=newest"}
    )

    assert answer.status_code == 302 and answer["Location"] == "/inbox/?order=newest"
    assert step_events(run, "approval_decided", "review")[0].payload["approved"] is False


def test_a_refused_decision_from_a_row_shows_its_form_again_with_the_refusal(operator):
    run = waiting(form={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})

    answer = operator.post(
        f"/runs/{run.id}/approvals/review/", {"approved": "1", "comment": "x"}, headers=htmx(row_id(run))
    )

    assert answer.status_code == 422
    text = answer.content.decode()
    assert f'id="{row_id(run)}"' in text and "answer.n: is required" in text and 'name="answer.n"' in text


def test_filters_workflow_assignee_mine_and_order():
    alice = make_user("alice", "runs.view_run", "runs.operate")
    alice.groups.add(Group.objects.create(name="billing"))
    client = logged_in(alice)
    workflow = workflow_create(
        definition={"name": "inbox-page", "steps": [{"id": "review", "kind": "approval", "prompt": "?"}]}
    )
    first, second = waiting(workflow=workflow), waiting(workflow=workflow)
    billing = waiting(assign={"group": "billing"})
    waiting(assign={"user": "bob"})

    assert rows(client.get("/inbox/?workflow=inbox-page").content.decode()) == [str(first.id), str(second.id)]
    assert rows(client.get("/inbox/?workflow=inbox-page&order=newest").content.decode()) == [
        str(second.id),
        str(first.id),
    ]
    mine = client.get("/inbox/?assignee=me").content.decode()
    assert rows(mine) == [str(billing.id)]
    assert rows(client.get("/inbox/?assignee=billing").content.decode()) == [str(billing.id)]
    assert rows(client.get("/inbox/?age=1h").content.decode()) == []


def test_the_list_alone_for_htmx(operator):
    run = waiting()

    fragment = operator.get("/inbox/", headers=htmx("inbox-list")).content.decode()

    assert fragment.lstrip().startswith('<section id="inbox-list"')
    assert rows(fragment) == [str(run.id)]


def test_ops_counts_open_decisions_and_links_to_the_inbox(operator):
    waiting()
    waiting(assign={"user": "otto"})

    page = operator.get("/ops/").content.decode()

    assert re.search(r'Open decisions</a> <span class="pill">2</span>', page)
    assert re.search(r'href="/inbox/\?assignee=me"><span>assigned to you</span><strong>1</strong>', page)
    fragment = operator.get("/ops/", headers=htmx("decision-counts")).content.decode()
    assert fragment.lstrip().startswith('<section class="card decision-counts" id="decision-counts"')


def test_the_inbox_needs_a_login_and_a_reader(anonymous, nobody):
    assert anonymous.get("/inbox/").status_code == 302
    assert nobody.get("/inbox/").status_code == 403


def test_a_tool_call_waiting_for_approval_is_decided_from_its_row_with_edited_arguments(
    operator, settings, llm_provider
):
    settings.PAL_LLM_BASE_URL = llm_provider.url
    llm_provider.reply = refund_reply
    RAN.clear()
    run = make_run(steps=[refund_step()])
    drive_to_end(run)
    target = f"inbox-{run.id}-agent-1-0-"
    page = operator.get("/inbox/?kind=tool_call").content.decode()
    assert f'id="{target}"' in page and "tool call" in page and 'name="arguments"' in page

    answer = operator.post(
        f"/runs/{run.id}/approvals/agent[1.0]/",
        {"approved": "1", "comment": "half", "arguments": '{"invoice_id": 7, "amount": 60}'},
        headers=htmx(target),
    )

    assert answer.status_code == 200 and f'id="{target}"' in answer.content.decode()
    (decided,) = step_events(run, "approval_decided")
    assert decided.payload["arguments"] == {"invoice_id": 7, "amount": 60}


def test_filtered_by_an_attribute_and_a_bad_name_says_why(viewer):
    workflow = workflow_create(
        definition={
            "name": "inbox-attr-page",
            "steps": [{"id": "review", "kind": "approval", "prompt": "Ship it?"}],
            "attributes": {"tier": "{{ input.tier }}"},
        }
    )
    gold = make_run(workflow=workflow, input={"tier": "gold"})
    silver = make_run(workflow=workflow, input={"tier": "silver"})
    for run in (gold, silver):
        drive(run)

    page = viewer.get("/inbox/", {"attr_name": "tier", "attr_value": "gold"}).content.decode()
    assert rows(page) == [str(gold.id)]

    bad = viewer.get("/inbox/", {"attr_name": "Not A Name", "attr_value": "x"}).content.decode()
    assert rows(bad) == [] and 'role="alert"' in bad and "attr.Not A Name" in bad
