"""A URL configuration with one plain Django view under /api/ that Django's CSRF middleware guards
(every real /api/ view is DRF's, which checks a session's token itself): for
tests/test_console_errors.py, which shows Django's own 403 under /api/ is the API's error body."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import urlpatterns as console_urlpatterns


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("posted", content_type="text/plain")


urlpatterns = [path("api/v1/plain", plain), *console_urlpatterns]
