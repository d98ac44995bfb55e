"""pal.web resolves a request's address once, on the event loop, and hands the match to Django with the request: a
page still knows its own address (request.resolver_match), under a root path too, exactly as through Django's own
handler, and an address that matches nothing is still Django's 404."""

import asyncio

import httpx
import pytest
from django.test import Client

from tests.api.conftest import make_user
from tests.pal.test_web import app  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def call(application, path: str, *, sync_path: bool, root_path: str = "", cookies=None) -> httpx.Response:
    async def go():
        application.sync_path = sync_path
        transport = httpx.ASGITransport(app=application, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", cookies=cookies) as client:
            return await client.get(path)

    return asyncio.run(go())


@pytest.fixture
def session():
    client = Client()
    client.force_login(make_user("nora", superuser=True))
    return {"sessionid": client.cookies["sessionid"].value}


def test_a_page_marks_its_own_address_on_the_sync_path_as_on_djangos_handler(app, session):  # noqa: F811
    fast = call(app, "/runs/", sync_path=True, cookies=session)
    stock = call(app, "/runs/", sync_path=False, cookies=session)
    assert fast.status_code == stock.status_code == 200
    for page in (fast, stock):
        assert 'href="/runs/" aria-current="page">Runs</a>' in page.text
        assert page.text.count('aria-current="page"') == 1


def test_an_address_under_a_root_path_resolves_as_on_djangos_handler(app, session):  # noqa: F811
    for path in ("/pal/runs/", "/pal/api/v1/no-such-call", "/pal/no-such-page/"):
        fast = call(app, path, sync_path=True, root_path="/pal", cookies=session)
        stock = call(app, path, sync_path=False, root_path="/pal", cookies=session)
        assert fast.status_code == stock.status_code, path
        assert fast.text.count('aria-current="page"') == stock.text.count('aria-current="page"'), path
    assert call(app, "/pal/no-such-page/", sync_path=True, root_path="/pal").status_code == 404
