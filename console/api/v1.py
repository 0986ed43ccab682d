"""/api/v1/ routes. Each feature module owns its own list of paths."""

from __future__ import annotations

from django.urls import include, path

urlpatterns: list = [
    path("", include("console.api.stream")),
    path("", include("console.api.runs")),
    path("", include("console.api.gateway")),
    path("", include("console.api.reexecutions")),
    path("", include("console.api.audit")),
]
