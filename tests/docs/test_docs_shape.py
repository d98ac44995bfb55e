"""The docs keep their shape: links that lead somewhere, examples that validate and run offline, API paths written
whole where people copy them, no project history in user docs, a tree that names every module, a glossary with
every word, and a PERFORMANCE.md that is only what the bench writes."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
USER_DOCS = [p for p in PAGES if not p.name.startswith("PERFORMANCE")]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_every_relative_link_leads_to_a_file():
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in PAGES
        for target, _ in LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:")) and not (page.parent / target).exists()
    ]
    assert broken == []


def test_no_project_history_in_user_docs():
    history = re.compile(r"\b(session|issue|helper) [0-9]+\b", re.IGNORECASE)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in USER_DOCS for m in history.finditer(p.read_text())]
    assert found == []


@pytest.mark.parametrize(
    "name",
    [
        "README.md",
        "docs/OPERATIONS.md",
        "docs/troubleshooting.md",
        "docs/FLOW-CONTROL.md",
        "docs/tutorial.md",
        "docs/concepts.md",
        *[f"docs/how-to/{p.name}" for p in sorted((DOCS / "how-to").glob("*.md"))],
    ],
)
def test_api_paths_are_written_whole_where_people_copy_them(name):
    # Without /api/v1 a path is a page's: a curl with a token gets a redirect to the login or a CSRF 403.
    calls = re.findall(r"\b(?:GET|POST|DELETE|PATCH|PUT)\s+(/[^\s`)]*)", (ROOT / name).read_text())
    assert [path for path in calls if not path.startswith(("/api/v1/", "/metrics"))] == []


def test_workflow_examples_validate_and_run_offline():
    from runs.workflows import validate_definition

    examples = []
    for page in PAGES:
        text = page.read_text()
        assert "127.0.0.1:9000" not in text, f"{page.name}: nothing listens there when the reader tries it"
        for _, body in (m for m in FENCE.findall(text) if m[0] == "json"):
            try:
                definition = json.loads(body)
            except ValueError:
                continue  # a fragment of a definition, not a whole one
            if isinstance(definition, dict) and "steps" in definition:
                examples.append((page, definition))
    assert len(examples) >= 8
    for page, definition in examples:
        if page.name == "tutorial.md" and '"priority"' in json.dumps(definition):
            continue  # its tool is the reader's own module: tests/docs/test_tutorial.py loads it
        validate_definition(definition)
    tour = {
        "support-triage",
        "refund-review",
        "hello",
    }  # the examples make run loads: a reader's post must not replace them
    assert not [d["name"] for _, d in examples if d["name"] in tour]


def test_the_architecture_tree_names_every_module():
    text = (DOCS / "ARCHITECTURE.md").read_text()
    tree = text[text.index("```") : text.index("```", text.index("```") + 3)]
    modules = [
        p
        for package in ("runs", "journal", "tokens", "pal")
        for p in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in p.parts and p.name != "__init__.py"
    ]
    missing = [str(p.relative_to(ROOT)) for p in modules if not re.search(rf"\b{re.escape(p.stem)}\b", tree)]
    assert missing == []


def test_the_architecture_names_every_model():
    from django.apps import apps

    text = (DOCS / "ARCHITECTURE.md").read_text()
    models = [m for app in ("runs", "journal", "tokens") for m in apps.get_app_config(app).get_models()]
    assert [m._meta.db_table for m in models if f"`{m._meta.db_table}`" not in text] == []


def test_the_glossary_has_every_word():
    glossary = (DOCS / "concepts.md").read_text().split("## Glossary", 1)[1]
    words = "run step attempt item key lease epoch fence booking walk slice sweep stuck why claim receipt".split()
    assert [w for w in words if f"**{w}**" not in glossary] == []


def test_performance_md_links_the_notes_the_bench_does_not_write():
    from bench import report
    from bench.__main__ import plan

    generated = report.render(results=[], facts={}, plan=plan(False), quick=False)
    assert report.NOTES in generated and report.NOTES in (DOCS / "PERFORMANCE.md").read_text()
    assert (DOCS / "PERFORMANCE-notes.md").exists()


def test_the_readme_is_short_and_says_how_to_recover_the_tour():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 170
    assert "make tour" in readme and "changepassword admin" in readme
    assert "worker.pid" in readme  # the tour by hand: the worker's process group, without hunting for its pid
