"""The usage report (not built yet: see issue 6)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
