"""Every page action refused for lack of the operator permission answers 403 with a message that says why: a line
of text for htmx (its flash bar shows it), a page for a form posted without JavaScript; nothing changes."""

import re
import uuid

import pytest
from django.urls import URLPattern, get_resolver

from runs.models import Run

from .conftest import htmx

pytestmark = pytest.mark.django_db

SAMPLE = {"uuid": str(uuid.uuid4()), "int": "1", "str": "s"}
# Pages that show a form on GET and act on POST: their POST is an action all the same.
FORMS = ["/schedules/", "/pauses/", "/reruns/start/", f"/runs/{SAMPLE['uuid']}/move/"]


def action_urls() -> list[str]:
    urls = []
    for pattern in get_resolver().url_patterns:
        for inner in getattr(pattern, "url_patterns", [pattern]):
            if isinstance(inner, URLPattern) and getattr(inner.callback, "pal_operator", False):
                route = str(getattr(pattern, "pattern", "")) if pattern is not inner else ""
                route += str(inner.pattern)
                urls.append("/" + re.sub(r"<(\w+):\w+>", lambda m: SAMPLE[m.group(1)], route))
    return sorted(urls)


def test_the_actions_are_found():
    urls = action_urls()
    assert len(urls) >= 12, urls
    assert any(url.endswith("/cancel/") for url in urls) and any("/approvals/" in url for url in urls)


@pytest.mark.parametrize("url", action_urls() + FORMS)
def test_a_viewer_posting_an_action_is_told_why_with_a_page_and_with_a_line(viewer, url):
    page = viewer.post(url, {"reason": "r"})
    assert page.status_code == 403, url
    assert "this action needs the operator permission (runs.operate)" in page.content.decode(), url
    assert page["Content-Type"].startswith("text/html")

    line = viewer.post(url, {"reason": "r"}, headers=htmx("run-actions"))
    assert line.status_code == 403 and line["Content-Type"].startswith("text/plain"), url
    assert line.content.decode().startswith("Refused: this action needs the operator permission"), url
    assert not Run.objects.exists()
