"""OpenAPI pieces shared by the API modules: the error envelope, error responses, the auth schemes."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="snake_case, stable; clients branch on it")
    message = serializers.CharField(help_text="for a person")
    details = serializers.DictField(help_text="machine-readable specifics, e.g. index/field or expected/actual")


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


STATUS_TEXT = {
    400: "Bad request", 401: "No or unknown credentials", 403: "Authenticated but not allowed",
    404: "Not found, or not in the caller's workspace (never 403)", 406: "Not acceptable",
    409: "Conflict with the run's state", 410: "Gone", 413: "Request body over 10 MiB",
    500: "Server-side failure",
}


def error_responses(**codes: str | list[str]) -> dict[int, OpenApiResponse]:
    """`{status: OpenApiResponse(error envelope)}` from `e400=[codes…]`-style keywords; 401 is
    always added (every endpoint needs credentials)."""
    out: dict[int, OpenApiResponse] = {}
    merged: dict[str, Any] = {"e401": ["unauthenticated"], **codes}
    for key, value in sorted(merged.items(), key=lambda kv: int(kv[0][1:])):
        status = int(key[1:])
        names = [value] if isinstance(value, str) else value
        description = f"{STATUS_TEXT.get(status, '')}. Error codes: " + ", ".join(f"`{n}`" for n in names)
        out[status] = OpenApiResponse(ErrorSerializer, description=description)
    return out


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A workspace API key (`manage.py ledger create-key`), scopes ingest/read/execute.",
        }


class ConsoleSessionScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.auth.CsrfSessionAuthentication"
    name = "consoleSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": "sessionid",
            "description": "The console's login session; unsafe methods also need the `X-CSRFToken` header "
                           "(value of the `csrftoken` cookie). Members with several workspaces pass "
                           "`?workspace=TENANT/WORKSPACE`.",
        }
