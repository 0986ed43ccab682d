"""The console's URL configuration plus one route that fails, for the 500 page's test
(tests/test_console_errors.py): a real exception through Django's whole handler."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import handler400, handler403, handler404, handler500  # noqa: F401 - the handlers
from console.urls import urlpatterns as console_urlpatterns


def crash(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed: a detail for the log only")


urlpatterns = [path("crash/", crash), *console_urlpatterns]
