"""The input terms (runs.input_terms): the index by top-level input members that gives an `input` filter's first
page newest first. Whatever the terms hold, the filter's answer is that of `input @> probe` over every run: a
term only narrows where the check looks, and a probe member without a term leaves the narrowing to the others."""

import random

import pytest
from django.db import connection

from runs import input_terms, search, selectors
from runs.models import Run, RunInputTerm
from tests.helpers import echo_step, make_run, make_workflow

# Values that make a term, those that do not, and the pairs jsonb calls equal.
INPUTS = [
    {"customer": "acme", "n": 1, "vip": True},
    {"customer": "Acme", "n": 1.0, "vip": False},
    {"customer": "ünïcødé 🚀", "n": -0.0, "big": 2**63 - 1, "bigger": 2**63},
    {"customer": "x" * input_terms.MAX_TEXT, "long": "y" * (input_terms.MAX_TEXT + 1), "frac": 1.5},
    {"customer": "nul\x00inside", "lone": "\ud800", "key\x00": "v", "nested": {"customer": "acme"}},
    {"customer": "\ue000pal-escaped:looks escaped", "tags": ["acme", 1], "none": None, "e": 100},
    {"customer": "acme", "n": 2, "e": 1e2, "empty": ""},
    {},
]

PROBES = [
    {"customer": "acme"},
    {"customer": "acme", "n": 1},
    {"n": 1.0},
    {"n": 0},
    {"vip": True},
    {"vip": 1},
    {"big": 2**63 - 1},
    {"customer": "x" * input_terms.MAX_TEXT},
    {"long": "y" * (input_terms.MAX_TEXT + 1)},
    {"frac": 1.5},
    {"customer": "nul\x00inside"},
    {"lone": "\ud800"},
    {"customer": "\ue000pal-escaped:looks escaped"},
    {"tags": ["acme"]},
    {"nested": {"customer": "acme"}},
    {"none": None},
    {"e": 100},
    {"e": 100.0, "customer": "acme"},
    {"empty": ""},
    {"customer": "ünïcødé 🚀"},
    {"customer": "missing"},
]


@pytest.fixture
def workflow(db):
    return make_workflow(name="terms", steps=[echo_step("only", said="hi")])


def _matches(probe: dict) -> list[str]:
    return [str(r.id) for r in selectors.runs_matching(input=probe).order_by("-created_at", "-id")]


def _expected(runs: list[Run], probe: dict) -> list[str]:
    newest_first = sorted(runs, key=lambda r: (r.created_at, str(r.id)), reverse=True)
    return [str(r.id) for r in newest_first if search.json_contains(r.input, probe)]


def test_a_probe_member_names_a_term_only_when_jsonb_equality_would_find_it_by_that_member():
    assert input_terms.term_of("n", 1) == input_terms.term_of("n", 1.0) == input_terms.term_of("n", 1e0)
    assert input_terms.term_of("n", 1) != input_terms.term_of("n", True)
    assert input_terms.term_of("n", "1") != input_terms.term_of("n", 1)
    assert input_terms.term_of("customer", "acme") != input_terms.term_of("Customer", "acme")
    for unindexed in (
        1.5,
        None,
        [1],
        {"a": 1},
        "y" * (input_terms.MAX_TEXT + 1),
        "nul\x00",
        2**63,
        "\ue000pal-escaped:",
    ):
        assert input_terms.term_of("k", unindexed) is None, unindexed
    assert input_terms.term_of("key\x00", "v") is None
    assert input_terms.terms_of({"a": "x", "b": [1], "c": 2}) == [
        input_terms.term_of("a", "x"),
        input_terms.term_of("c", 2),
    ]


def test_every_probe_finds_exactly_the_runs_whose_input_contains_it_newest_first(workflow):
    runs = [make_run(workflow=workflow, input=input) for input in INPUTS]
    for probe in PROBES:
        assert _matches(probe) == _expected(runs, probe), probe
    assert _matches({"customer": "acme"}), "the probes found something"


def test_each_new_run_is_indexed_by_its_top_level_members_with_its_own_created_at(workflow):
    run = make_run(workflow=workflow, input={"customer": "acme", "n": 3, "deep": {"x": 1}, "frac": 0.5})
    rows = RunInputTerm.objects.filter(run_id=run.id)
    assert sorted(row.term for row in rows) == sorted(input_terms.terms_of(run.input))
    assert len(rows) == 2
    assert {row.created_at for row in rows} == {run.created_at}


def test_the_cursor_walks_a_term_filter_to_its_end_with_each_match_once_in_order(workflow, client):
    rng = random.Random(7)
    runs = [make_run(workflow=workflow, input={"team": rng.choice(["red", "blue"]), "i": i}) for i in range(23)]
    seen, cursor = [], None
    while True:
        page, cursor = selectors.run_list(input={"team": "red"}, limit=4, cursor=cursor)
        seen += [str(r.id) for r in page]
        if cursor is None:
            break
    assert seen == _expected(runs, {"team": "red"})
    assert len(seen) == len(set(seen)) > 4


def test_a_probe_of_two_members_walks_the_rarer_ones_runs_and_pages_through_every_match_once(workflow):
    runs = [
        make_run(workflow=workflow, input={"team": "red", "tier": "gold" if i % 4 == 0 else "free"}) for i in range(21)
    ]
    probe = {"team": "red", "tier": "gold"}
    assert input_terms._rarest(input_terms.terms_of(probe)) == input_terms.term_of("tier", "gold")
    seen, cursor = [], None
    while True:
        page, cursor = selectors.run_list(input=probe, limit=2, cursor=cursor)
        seen += [str(r.id) for r in page]
        if cursor is None:
            break
    assert seen == _expected(runs, probe)
    assert len(seen) == 6


@pytest.mark.integration  # TERMS_SQL is Postgres's: run in make test's Postgres pass
def test_the_sql_terms_of_the_migration_and_the_bench_fill_equal_those_run_creation_writes(workflow):
    runs = [make_run(workflow=workflow, input=input) for input in INPUTS]
    written = set(RunInputTerm.objects.values_list("term", "created_at", "run_id"))
    assert len(written) > len(INPUTS)
    RunInputTerm.objects.all().delete()
    with connection.cursor() as cursor:
        cursor.execute(input_terms.terms_sql("runs r"))
    assert set(RunInputTerm.objects.values_list("term", "created_at", "run_id")) == written
    for probe in PROBES:
        assert _matches(probe) == _expected(runs, probe), probe
