"""A URL configuration with one route that checks nothing, for the isolation sweep's own test
(tests/test_isolation_sweep.py): served only by the Daphne that test starts with tests/leaky_settings.py."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.urls import urlpatterns as console_urlpatterns
from ledger.models import Run

LEAK = "w/<slug:tenant>/<slug:workspace>/leak/"


def leak(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    runs = Run.objects.filter(workspace__tenant__slug=tenant, workspace__slug=workspace)
    return HttpResponse("\n".join(r.run_id for r in runs), content_type="text/plain")


urlpatterns = [path(LEAK, leak), *console_urlpatterns]
