"""runs.graph: a workflow's needs, ancestors, problems and walk order (CONTRACT section 3). Pure: no database."""

import pytest

from runs.graph import Ancestry, ancestors_of, graph_problems, needs_of, order


def step(step_id, *needs, **fields):
    """A step; needs given as positional ids, or needs=None to leave the field out (the default)."""
    value = {"id": step_id, "kind": "tool_call", "tool": "echo", **fields}
    if needs:
        value["needs"] = list(needs)
    return value


def plain(*ids):
    return [step(step_id) for step_id in ids]


RESEARCH = [
    step("plan"),
    step("web", "plan"),
    step("papers", "plan"),
    step("read", "web", "papers"),
    step("escalate", "read"),
]


# --- needs ----------------------------------------------------------------------------------------


def test_a_step_without_needs_needs_the_step_listed_just_before_it():
    assert needs_of(plain("a", "b", "c")) == {"a": [], "b": ["a"], "c": ["b"]}


def test_the_first_step_without_needs_needs_nothing():
    assert needs_of(plain("only")) == {"only": []}


def test_empty_needs_means_the_step_may_start_at_once():
    assert needs_of([step("a"), {**step("b"), "needs": []}]) == {"a": [], "b": []}


def test_explicit_needs_are_kept_as_written():
    assert needs_of(RESEARCH)["read"] == ["web", "papers"]


def test_a_step_after_one_with_explicit_needs_still_defaults_to_the_step_before_it():
    steps = [step("a"), {**step("b"), "needs": []}, step("c")]
    assert needs_of(steps)["c"] == ["b"]


def test_needs_may_name_a_step_listed_later():
    steps = [step("a", "b"), {**step("b"), "needs": []}]
    assert needs_of(steps) == {"a": ["b"], "b": []}


# --- ancestors ------------------------------------------------------------------------------------


def test_the_ancestors_of_a_plain_list_are_the_steps_before_each_one():
    assert ancestors_of(plain("a", "b", "c")) == {"a": set(), "b": {"a"}, "c": {"a", "b"}}


def test_ancestors_are_the_transitive_needs():
    ancestors = ancestors_of(RESEARCH)
    assert ancestors["read"] == {"plan", "web", "papers"}
    assert ancestors["escalate"] == {"plan", "web", "papers", "read"}


def test_parallel_branches_are_not_each_others_ancestors():
    ancestors = ancestors_of(RESEARCH)
    assert ancestors["web"] == {"plan"}
    assert ancestors["papers"] == {"plan"}


def test_ancestry_answers_by_list_index():
    ancestry = Ancestry(RESEARCH)
    assert ancestry.includes(3, 0)  # read -> web -> plan
    assert not ancestry.includes(2, 1)  # papers does not need web
    assert ancestry.of(4) == {"plan", "web", "papers", "read"}


def test_ancestors_of_steps_on_a_cycle_are_found_without_looping_forever():
    ancestors = ancestors_of([step("a", "b"), step("b", "a")])
    assert ancestors == {"a": {"a", "b"}, "b": {"a", "b"}}


def test_the_ancestry_of_a_plain_list_of_ten_thousand_steps_is_built_without_sets_per_step():
    steps = plain(*(f"s{i}" for i in range(10_000)))
    ancestry = Ancestry(steps)
    assert ancestry.includes(9_999, 0)
    assert not ancestry.includes(0, 9_999)


# --- order ----------------------------------------------------------------------------------------


def test_the_order_of_a_plain_list_is_exactly_the_list_order():
    ids = [f"step-{i}" for i in range(200)]
    assert order(plain(*ids)) == ids


def test_the_order_keeps_list_order_among_steps_that_are_ready_together():
    assert order(RESEARCH) == ["plan", "web", "papers", "read", "escalate"]


def test_a_step_listed_first_that_needs_a_later_one_comes_after_it():
    steps = [step("report", "fetch"), {**step("fetch"), "needs": []}, step("tidy")]
    assert order(steps) == ["fetch", "report", "tidy"]


def test_independent_steps_keep_their_list_order():
    steps = [{**step(name), "needs": []} for name in ("c", "a", "b")]
    assert order(steps) == ["c", "a", "b"]


def test_the_order_of_a_cycle_is_refused():
    with pytest.raises(ValueError, match="cycle"):
        order([step("a", "b"), step("b", "a")])


# --- problems -------------------------------------------------------------------------------------


def test_a_plain_list_and_the_research_graph_have_no_problems():
    assert graph_problems(plain("a", "b", "c")) == []
    assert graph_problems(RESEARCH) == []


def test_an_unknown_need_is_named_at_the_step():
    assert graph_problems([step("a"), step("b", "ghost")]) == [("steps[1] (b).needs", "needs unknown step 'ghost'")]


def test_a_step_needing_itself_is_refused():
    assert graph_problems([step("a", "a")]) == [("steps[0] (a).needs", "step 'a' cannot need itself")]


def test_a_need_named_twice_is_refused():
    assert graph_problems([step("a"), step("b", "a", "a")]) == [("steps[1] (b).needs", "names step 'a' twice")]


@pytest.mark.parametrize("needs", ["a", {"a": True}, [1], ["a", None], None])
def test_needs_that_are_not_a_list_of_ids_are_refused(needs):
    steps = [step("a"), {**step("b"), "needs": needs}]
    assert graph_problems(steps) == [("steps[1] (b).needs", "must be a list of step ids")]


def test_a_cycle_of_two_steps_names_both():
    problems = graph_problems([{**step("a"), "needs": ["b"]}, step("b", "a")])
    assert problems == [("steps[0] (a).needs", "needs form a cycle: a needs b, b needs a")]


def test_a_cycle_through_a_default_need_says_so():
    # b has no needs: it needs a, the step listed just before it, and a needs b.
    problems = graph_problems([step("a", "b"), step("b")])
    assert problems == [
        ("steps[0] (a).needs", "needs form a cycle: a needs b, b needs a (by default: the step listed just before it)")
    ]


def test_a_longer_cycle_names_every_step_on_it_in_order():
    steps = [step("start"), step("x", "start", "z"), step("y", "x"), step("z", "y"), step("after", "z")]
    [(loc, message)] = graph_problems(steps)
    assert loc == "steps[1] (x).needs"
    assert message == "needs form a cycle: x needs z, z needs y, y needs x"


def test_two_separate_cycles_are_both_reported():
    steps = [step("a", "b"), step("b", "a"), step("c", "d"), step("d", "c")]
    assert [loc for loc, _ in graph_problems(steps)] == ["steps[0] (a).needs", "steps[2] (c).needs"]


def test_a_step_behind_a_cycle_is_not_itself_called_a_cycle():
    steps = [step("a", "b"), step("b", "a"), step("c", "b")]
    assert [loc for loc, _ in graph_problems(steps)] == ["steps[0] (a).needs"]


def test_steps_that_are_not_objects_or_lack_ids_do_not_break_the_checks():
    steps = ["nonsense", {"kind": "tool_call"}, step("c", "ghost")]
    assert graph_problems(steps) == [("steps[2] (c).needs", "needs unknown step 'ghost'")]
