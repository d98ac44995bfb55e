"""POST /workflows, GET /workflows, GET /workflows/{name}."""

from .conftest import assert_error


def definition(name="triage", **extra):
    return {"name": name, "steps": [{"id": "a", "kind": "tool_call", "tool": "echo", "args": {"x": 1}}], **extra}


def test_posting_a_workflow_answers_201_with_its_version(operator):
    response = operator.post("/workflows", definition(description="first"))
    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["version"], body["description"]) == ("triage", 1, "first")
    assert body["definition"] == definition(description="first")


def test_posting_the_same_name_again_makes_a_new_version(operator):
    operator.post("/workflows", definition())
    assert operator.post("/workflows", definition(description="second")).json()["version"] == 2


def test_a_bad_definition_is_422_naming_each_bad_field(operator):
    bad = {
        "name": "Bad Name",
        "steps": [
            {"id": "a", "kind": "tool_call", "tool": "no-such-tool"},
            {"id": "b", "kind": "llm_call", "prompt": "{{ steps.zzz.output.text }}"},
        ],
    }
    body = assert_error(operator.post("/workflows", bad), 422, "invalid_workflow")
    locs = {e["loc"] for e in body["errors"]}
    assert "name" in locs
    assert "steps[0] (a).tool" in locs
    assert "steps[1] (b).model" in locs
    assert "steps[1] (b).prompt" in locs
    for loc in ("name", "steps[0] (a).tool", "steps[1] (b).model"):
        assert loc in body["detail"]


def test_wrong_types_and_unknown_fields_are_422(operator):
    body = assert_error(
        operator.post("/workflows", {"name": 7, "steps": "no", "colour": "red"}), 422, "validation_error"
    )
    assert {e["loc"] for e in body["errors"]} == {"name", "steps", "colour"}


def test_an_empty_body_is_422(operator):
    body = assert_error(operator.post("/workflows", raw=""), 422, "validation_error")
    assert "body" in body["detail"]


def test_the_list_shows_the_latest_version_of_each_workflow(operator, viewer):
    operator.post("/workflows", definition("alpha"))
    operator.post("/workflows", definition("alpha", description="newer"))
    operator.post("/workflows", definition("beta"))
    items = viewer.get("/workflows").json()["items"]
    assert [(w["name"], w["version"], w["description"], w["steps"]) for w in items] == [
        ("alpha", 2, "newer", 1),
        ("beta", 1, "", 1),
    ]


def test_one_workflow_comes_with_its_versions(operator, viewer):
    operator.post("/workflows", definition())
    operator.post("/workflows", definition(description="v2"))
    body = viewer.get("/workflows/triage").json()
    assert body["version"] == 2 and body["description"] == "v2"
    assert [v["version"] for v in body["versions"]] == [2, 1]


def test_an_unknown_workflow_is_404(viewer):
    assert_error(viewer.get("/workflows/nope"), 404, "workflow_not_found")


# --- graphs (CONTRACT section 3, "The graph, fan-out and workflow options") -----------------------

RESEARCH = {
    "name": "research",
    "concurrency": {"key": "{{ input.customer }}", "max_runs": 2},
    "budget": {"max_cost_usd": 0.50, "max_tokens": 40000},
    "steps": [
        {"id": "plan", "kind": "llm_call", "model": "gpt-4o-mini", "prompt": "Plan: {{ input.q }}"},
        {"id": "web", "kind": "tool_call", "tool": "echo", "args": {"q": "{{ input.q }}"}, "needs": ["plan"]},
        {"id": "papers", "kind": "tool_call", "tool": "echo", "args": {"q": "{{ input.q }}"}, "needs": ["plan"]},
        {
            "id": "read",
            "kind": "llm_call",
            "model": "gpt-4o-mini",
            "needs": ["web", "papers"],
            "for_each": "{{ input.sources }}",
            "max_concurrency": 4,
            "prompt": "Read {{ item }} ({{ index }})",
        },
        {
            "id": "escalate",
            "kind": "deliver",
            "channel": "webhook",
            "url": "http://127.0.0.1:9000/hook",
            "needs": ["read"],
            "when": "steps.plan.output.text != ''",
            "body": {"plan": "{{ steps.plan.output.text }}"},
        },
    ],
    "output": "{{ steps.read.output }}",
}


def echo(step_id, **fields):
    return {"id": step_id, "kind": "tool_call", "tool": "echo", "args": {}, **fields}


def graph(*steps):
    return {"name": "graph", "steps": list(steps)}


def errors_by_loc(response) -> dict[str, list[str]]:
    body = assert_error(response, 422, "invalid_workflow")
    found: dict[str, list[str]] = {}
    for error in body["errors"]:
        found.setdefault(error["loc"], []).append(error["msg"])
    return found


def test_the_contracts_research_example_is_accepted_as_posted(operator):
    response = operator.post("/workflows", RESEARCH)
    assert response.status_code == 201, response.content
    assert response.json()["definition"] == RESEARCH


def test_posting_a_cycle_is_422_naming_the_step_and_needs(operator):
    response = operator.post("/workflows", graph(echo("a", needs=["b"]), echo("b", needs=["a"])))
    assert errors_by_loc(response) == {"steps[0] (a).needs": ["needs form a cycle: a needs b, b needs a"]}


def test_posting_an_unknown_need_is_422_naming_the_step_and_needs(operator):
    response = operator.post("/workflows", graph(echo("a"), echo("b", needs=["ghost"])))
    assert errors_by_loc(response) == {"steps[1] (b).needs": ["needs unknown step 'ghost'"]}


def test_posting_a_template_that_reads_a_non_ancestor_is_422_naming_the_step_and_field(operator):
    response = operator.post(
        "/workflows",
        graph(echo("a"), echo("b", needs=["a"]), echo("c", needs=["a"], args={"x": "{{ steps.b.output }}"})),
    )
    assert errors_by_loc(response) == {
        "steps[2] (c).args": [
            "template {{ steps.b.output }} refers to step 'b', which is not among this step's ancestors (its needs)"
        ]
    }


def test_posting_a_bad_when_is_422_naming_the_step_and_when(operator):
    response = operator.post("/workflows", graph(echo("a"), echo("b", when="input.__class__")))
    [message] = errors_by_loc(response)["steps[1] (b).when"]
    assert "'__class__' is not data" in message


def test_posting_a_when_with_a_syntax_error_is_422(operator):
    response = operator.post("/workflows", graph(echo("a", when="input.vip ==")))
    assert list(errors_by_loc(response)) == ["steps[0] (a).when"]


def test_posting_a_for_each_that_is_not_one_template_is_422_naming_the_step_and_for_each(operator):
    response = operator.post("/workflows", graph(echo("a", for_each="{{ input.a }} and {{ input.b }}")))
    assert errors_by_loc(response) == {
        "steps[0] (a).for_each": ['must be exactly one template that gives a list, e.g. "{{ input.sources }}"']
    }


def test_posting_a_bad_budget_and_concurrency_is_422_naming_each(operator):
    response = operator.post("/workflows", {**graph(echo("a")), "budget": {}, "concurrency": {"max_runs": 0}})
    assert set(errors_by_loc(response)) == {"budget", "concurrency.max_runs"}
