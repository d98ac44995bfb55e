"""GET /runs renders its page without validating it against RunListOut again (runs.api.runs._rendered): the same JSON,
byte for byte, as ninja makes of the validated page, for runs in every state, on every page of a cursor walk."""

import pytest
from django.db import connection
from django.test import RequestFactory

from pal.api import api as ninja_api
from runs import selectors
from runs.api.runs import run_summary
from runs.api.schemas import RunListOut
from tests.helpers import make_run

from .test_read_path import _states, viewer  # noqa: F401  (the fixture)


def _validated_bytes(*, limit: int, cursor: str | None) -> bytes:
    """What ninja answers for the page when it validates the handler's dict against RunListOut (the path before)."""
    runs, next_cursor = selectors.run_list(limit=limit, cursor=cursor)
    page = {"items": [run_summary(run) for run in runs], "next_cursor": next_cursor}
    dumped = RunListOut.model_validate(page).model_dump()
    return ninja_api.create_response(RequestFactory().get("/"), dumped, status=200).content


def test_every_page_of_the_list_is_byte_for_byte_what_ninja_makes_of_the_validated_page(viewer):  # noqa: F811
    assert len(_states()) == 8
    cursor, pages = None, 0
    while True:
        response = viewer.get("/runs", {"limit": 3, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.content
        assert response["Content-Type"] == "application/json; charset=utf-8"
        assert response.content == _validated_bytes(limit=3, cursor=cursor)
        pages += 1
        cursor = response.json()["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    statuses = {item["status"] for item in viewer.get("/runs", {"limit": 50}).json()["items"]}
    assert statuses == {"queued", "running", "waiting", "succeeded", "failed"}


@pytest.mark.integration  # the plan mode is Postgres's: run in make test's Postgres pass
def test_a_list_is_planned_for_the_values_it_filters_on_not_with_the_generic_plan_of_a_prepared_statement(viewer):  # noqa: F811
    run = make_run(input={"customer": "acme"})
    seen = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        if 'FROM "runs"' in sql and "ORDER BY" in sql:
            with connection.cursor() as cursor:
                cursor.execute("SHOW plan_cache_mode")
                seen.append(f"mode {cursor.fetchone()[0]}")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        for _ in range(7):  # past psycopg's prepare_threshold (5): the statement is prepared by then
            assert (
                viewer.get("/runs", {"workflow": run.workflow.name, "input": '{"customer": "acme"}'}).status_code == 200
            )
    modes = [line for line in seen if line.startswith("mode ")]
    assert modes == ["mode force_custom_plan"] * 7, seen
