"""/api/: the REST API (v1), its OpenAPI schema and docs."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny

urlpatterns = [
    # The contract is public: clients we did not write read it before they hold a key.
    path("schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny], authentication_classes=[]),
         name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[AllowAny],
                                                 authentication_classes=[]), name="api-docs"),
    path("v1/", include("console.api.v1")),
]
