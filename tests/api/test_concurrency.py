"""Concurrent identical POST /runs with one Idempotency-Key make one run (the unique constraint decides)."""

import threading

import pytest
from django.db import connection

from runs.models import Run
from tests.helpers import echo_step, make_workflow, needs_concurrent_database

from .conftest import Api, make_user, token_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def post_at_once(token: str, bodies: list[dict], key: str) -> list:
    barrier = threading.Barrier(len(bodies))
    answers: list = [None] * len(bodies)

    def post(index):
        api = Api(token)
        try:
            barrier.wait(timeout=10)
            answers[index] = api.post("/runs", bodies[index], headers={"Idempotency-Key": key})
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_concurrent_identical_posts_with_one_key_make_one_run():
    needs_concurrent_database()
    make_workflow(name="hello", steps=[echo_step("only")])
    token = token_for(make_user("otto", "runs.operate"))
    answers = post_at_once(token, [{"workflow": "hello", "input": {"n": 1}}] * 8, key="same-key")
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 7 + [201], [a.content for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert Run.objects.count() == 1


def test_concurrent_posts_with_one_key_and_other_bodies_make_one_run_and_409s():
    needs_concurrent_database()
    make_workflow(name="hello", steps=[echo_step("only")])
    token = token_for(make_user("otto", "runs.operate"))
    answers = post_at_once(token, [{"workflow": "hello", "input": {"n": n}} for n in range(6)], key="k")
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [409] * 5, [a.content for a in answers]
    assert Run.objects.count() == 1
