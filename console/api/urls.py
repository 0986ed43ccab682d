"""/api/: the REST API (v1), its OpenAPI schema and docs."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.permissions import AllowAny

urlpatterns = [
    # The contract is public: clients we did not write read it before they hold a key.
    path(
        "schema/",
        SpectacularAPIView.as_view(permission_classes=[AllowAny], authentication_classes=[]),
        name="api-schema",
    ),
    # Swagger UI from drf-spectacular-sidecar's static files; the split view serves its init script
    # at ?script, so the page has no inline script (CSP), and our template has no inline style.
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(
            url_name="api-schema",
            template_name="console/swagger_ui.html",
            permission_classes=[AllowAny],
            authentication_classes=[],
            # A page: its renderer has no answer to OPTIONS (DRF's metadata), which was a 500.
            http_method_names=["get", "head"],
        ),
        name="api-docs",
    ),
    path("v1/", include("console.api.v1")),
]
