"""/api/v1/ routes. Each feature module owns its own list of paths."""

from __future__ import annotations

from django.urls import include, path

urlpatterns: list = [
    path("", include("ledger.api.stream")),
    path("", include("ledger.api.runs")),
    path("", include("ledger.api.gateway")),
]
