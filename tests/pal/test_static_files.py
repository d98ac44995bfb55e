"""Static files: from the apps until collectstatic has filled STATIC_ROOT, then from STATIC_ROOT (pal/settings.py).

A STATIC_ROOT not made yet is the plan under make run and in tests, so WhiteNoise must not warn about it (the
suite turns every warning into an error)."""

import warnings

from django.http import HttpResponse
from django.test import RequestFactory

from pal.middleware import StaticFilesMiddleware


def not_static(request):
    return HttpResponse("not a static file", status=404)


def body(response) -> bytes:
    try:
        return b"".join(response.streaming_content)
    finally:
        response.close()


def test_static_files_come_from_the_apps_without_a_warning_while_static_root_does_not_exist(settings, tmp_path):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "not-collected-yet"
    settings.WHITENOISE_USE_FINDERS = True

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        middleware = StaticFilesMiddleware(not_static)
    response = middleware(RequestFactory().get("/static/pal.css"))

    assert response.status_code == 200
    assert body(response) == (settings.BASE_DIR / "static" / "pal.css").read_bytes()


def test_static_files_come_from_static_root_once_collectstatic_has_filled_it(settings, tmp_path):
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path
    settings.WHITENOISE_USE_FINDERS = False
    (tmp_path / "only-collected.txt").write_text("collected")

    response = StaticFilesMiddleware(not_static)(RequestFactory().get("/static/only-collected.txt"))

    assert response.status_code == 200
    assert body(response) == b"collected"
