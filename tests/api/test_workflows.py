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
