"""/api/v1/ routes. Each resource module owns its own list of paths; a new resource is one more
name here."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

RESOURCES = [
    "stream",
    "runs",
    "events",
    "evidence",
    "feedback",
    "artifacts",
    "usage",
    "gateway",
    "reexecutions",
    "audit",
    "share_links",
    "otlp",
    "exports",
    "outer_loops",
    "run_control",
    "tool_approvals",
    "evaluations",
]

urlpatterns: list[URLPattern | URLResolver] = [path("", include(f"console.api.{name}")) for name in RESOURCES]
