"""A Python workflow on the pages and the API: its run, its steps (add#2), its source and the steps it took."""

import re

import pytest
from django.urls import reverse

from runs.code import WORKFLOWS
from runs.models import Run
from tests.api.conftest import Api, token_for
from tests.api.conftest import make_user as make_api_user
from tests.code import sample_workflows
from tests.helpers import drive_to_end
from tests.pages.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(db):
    return logged_in(make_user("vera", "runs.view_run"))


@pytest.fixture
def done_run():
    run = Run.objects.get(id=sample_workflows.py_sum.start({"xs": [1, 2, 3]}))
    drive_to_end(run)
    return run


def test_the_run_page_and_a_numbered_steps_panel_show_its_steps(viewer, done_run):
    page = viewer.get(reverse("runs:detail", args=[done_run.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "add#2" in text and "add#3" in text
    panel = viewer.get(reverse("runs:step", args=[done_run.id, "add#2"]))
    assert panel.status_code == 200, panel.content[:300]
    assert "tests.code.sample_workflows.add" in panel.content.decode()


def test_the_workflow_page_shows_its_source_and_the_steps_its_run_took(viewer, done_run):
    page = viewer.get(reverse("runs:workflow", args=["py-sum"]))
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="code-note"' in text and "tests.code.sample_workflows.py_sum" in text
    assert "def py_sum(ctx, input):" in text  # its source
    assert text.count("add#") >= 2, text[text.find("graph-scroll") : text.find("graph-scroll") + 1500]


def test_the_workflow_page_shows_each_versions_source_and_the_steps_of_its_recent_runs_together(viewer, monkeypatch):
    first = Run.objects.get(id=sample_workflows.py_sum.start({"xs": [1, 2]}))
    drive_to_end(first)  # add, add#2

    def doubled_first(ctx, input):
        return {"total": sample_workflows.add(sample_workflows.double(input["xs"][0]), 0)}

    code = WORKFLOWS["py-sum"]
    monkeypatch.setattr(code, "fn", doubled_first)
    monkeypatch.setattr(code, "version", "v-doubled")
    monkeypatch.setattr(code, "source", "def doubled_first(ctx, input):\n    ...  # the new code\n")
    second = Run.objects.get(id=sample_workflows.py_sum.start({"xs": [3]}))
    drive_to_end(second)  # double, add
    assert second.workflow.version == first.workflow.version + 1

    page = viewer.get(reverse("runs:workflow", args=["py-sum"]))
    assert page.status_code == 200
    text = page.content.decode()
    sources = text[text.index('id="sources"') : text.index("Definition (JSON)")]
    latest, older = second.workflow.version, first.workflow.version
    assert f'id="source-v{latest}" open' in sources and f'id="source-v{older}">' in sources  # the older closed
    assert "def doubled_first(ctx, input):" in sources and "def py_sum(ctx, input):" in sources
    assert "v-doubled" in sources and first.workflow.definition["code_version"] in sources
    graph = text[text.index("graph-scroll") : text.index('id="sources-title"')]
    steps = set(re.findall(r'data-step="([^"]+)"', graph))
    assert steps == {"add", "add#2", "double"}, steps  # the first run's steps and the second's, together
    edges = set(re.findall(r'data-from="([^"]+)" data-to="([^"]+)"', graph))
    assert edges == {("add", "add#2"), ("double", "add")}, edges
    assert "2 newest runs took" in text


def test_post_runs_starts_a_python_workflow_like_any(db):
    api = Api(token_for(make_api_user("otto", "runs.view_run", "runs.operate")))
    answer = api.post("/runs", {"workflow": "py-sum", "input": {"xs": [5]}})
    assert answer.status_code in (200, 201), answer.content
    run = Run.objects.get(id=answer.json()["id"])
    drive_to_end(run)
    assert run.output == {"total": 5} and run.workflow.definition["code"] == "tests.code.sample_workflows.py_sum"
