"""/decisions/<token>/ (issue 28): the page a notification's signed link opens, without a login. With link_decides it
decides once (a typed form too); a second use answers 410; without it, it only opens the approval."""

import json

import pytest
from django.test import Client

from runs.models import RunStatus
from tests.conftest import WEBHOOK_SECRET
from tests.helpers import LOCMEM_MAIL, drive, kinds, mailer, make_run, step_events

pytestmark = pytest.mark.django_db

FORM = {"type": "object", "properties": {"amount": {"type": "integer", "maximum": 100}}, "required": ["amount"]}


@pytest.fixture(autouse=True)
def peers(settings):
    settings.MAILERS = mailer(LOCMEM_MAIL)
    settings.PAL_WEBHOOK_SECRET = WEBHOOK_SECRET


def link_of(webhook_receiver, **fields) -> tuple:
    step = {"id": "review", "kind": "approval", "prompt": "Refund 7?", "notify": {"webhook": webhook_receiver.url}}
    run = make_run(steps=[{**step, **fields}])
    drive(run)
    assert run.status == RunStatus.WAITING
    url = json.loads(webhook_receiver.deliveries[-1].body)["url"]
    return run, "/" + url.split("/", 3)[3]


def test_the_link_opens_the_decision_without_a_login_and_decides_it_once(webhook_receiver):
    run, path = link_of(webhook_receiver, link_decides=True, form=FORM)
    anonymous = Client()

    page = anonymous.get(path)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Refund 7?" in text and '<input type="number" name="answer.amount" step="1" max="100" required>' in text

    bad = anonymous.post(path, {"approved": "1", "answer.amount": "900"})
    assert bad.status_code == 422 and "answer.amount: must be at most 100" in bad.content.decode()
    done = anonymous.post(path, {"approved": "1", "answer.amount": "40", "comment": "fine"})
    assert done.status_code == 302 and done["Location"] == "/decisions/done/"
    assert "Decision recorded" in anonymous.get(done["Location"]).content.decode()

    again = anonymous.post(path, {"approved": "0"})
    assert again.status_code == 410
    assert "used already" in again.content.decode() and "approved by link" in again.content.decode()
    assert anonymous.get(path).status_code == 410
    (decided,) = step_events(run, "approval_decided", "review")
    assert decided.payload["answer"] == {"amount": 40} and decided.payload["by"] == "link"


def test_without_link_decides_the_page_sends_to_the_login_and_a_post_is_403(webhook_receiver):
    run, path = link_of(webhook_receiver)
    anonymous = Client()
    before = kinds(run)

    text = anonymous.get(path).content.decode()
    refused = anonymous.post(path, {"approved": "1"})

    assert "decided by a logged-in operator" in text and 'name="approved"' not in text
    assert refused.status_code == 403
    assert kinds(run) == before


def test_a_link_that_was_not_made_here_is_404():
    assert Client().get("/decisions/not-a-token/").status_code == 404
