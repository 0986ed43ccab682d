"""/api/v1/audit (docs/api.md "Audit"): the tenant's audit log for its admins, as JSON pages or CSV."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import audit
from ledger.limits import FIRST_DAY, LAST_DAY, day_in_range
from ledger.models import Tenant
from ledger.tenancy.access import tenant_admin

from .auth import principal
from .base import require_accepted
from .csvcells import text_cell
from .pagination import InvalidParameter, encode_cursor, keyset_cursor, limit_param, list_query
from .schema import CURSOR, error_responses

CSV_COLUMNS = ["id", "at", "actor", "action", "tenant", "workspace", "target", "reason"]


class AuditEntrySerializer(serializers.Serializer):
    id = serializers.CharField(help_text="aud_ and 32 random hex digits, the same forever")
    at = serializers.DateTimeField()
    actor = serializers.CharField(help_text="a username, key:<prefix> for an API key, or system:<what>")
    action = serializers.CharField(help_text="a stable string, never renamed: " + ", ".join(audit.Action.values))
    tenant = serializers.CharField()
    workspace = serializers.CharField(allow_null=True, help_text="TENANT/WORKSPACE; null for tenant-wide actions")
    target = serializers.CharField(help_text="what was acted on: rx_…, user:NAME, key:PREFIX, RUN/CALL")
    reason = serializers.CharField(allow_blank=True, help_text="the reason or note given, if any")
    details = serializers.DictField(help_text="action-specific facts (run ids, roles, digest, …)")


class AuditPageSerializer(serializers.Serializer):
    entries = AuditEntrySerializer(many=True)
    next = serializers.CharField(allow_null=True)


def _tenant(request: Request) -> Tenant:
    """The tenant whose log an admin member reads (?tenant= when they belong to several)."""
    return tenant_admin(principal(request), tenant=request.query_params.get("tenant") or None, what="the audit log")


def _bound(request: Request, name: str, *, end: bool) -> datetime | None:
    """`from`/`to`: a date (whole days, `to` inclusive) or an ISO 8601 instant."""
    raw = request.query_params.get(name)
    if not raw:
        return None
    problem = InvalidParameter(
        f"{name} must be a date YYYY-MM-DD or an ISO 8601 time, from {FIRST_DAY} to {LAST_DAY}", parameter=name
    )
    try:
        if len(raw) == 10:
            day = date.fromisoformat(raw)
            moment = datetime.combine(day + timedelta(days=1 if end else 0), time.min, tzinfo=UTC)
        else:
            moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        raise problem from None
    # Off the calendar's edges, the database's conversions to UTC overflow (ledger.limits).
    if not day_in_range(moment.date()):
        raise problem
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


FORMAT_MEDIA_TYPES = {"json": "application/json", "csv": "text/csv"}


class AuditView(APIView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # ?format=csv is this view's own switch (answered with text/csv below), not DRF's renderer
        # override. An Accept that admits not the format's media type is 406.
        fmt = request.query_params.get("format") or "json"
        if not force and fmt in FORMAT_MEDIA_TYPES:
            require_accepted(request, FORMAT_MEDIA_TYPES[fmt], f"the audit log as {fmt}")
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        operation_id="list_audit_entries",
        parameters=[
            OpenApiParameter("from", OpenApiTypes.STR, description="YYYY-MM-DD or ISO 8601, inclusive"),
            OpenApiParameter("to", OpenApiTypes.STR, description="YYYY-MM-DD (that whole day) or ISO 8601, exclusive"),
            OpenApiParameter("actor", OpenApiTypes.STR, description="exact actor, e.g. bob or key:0a1b2c3d4e5f"),
            OpenApiParameter("action", OpenApiTypes.STR, enum=audit.Action.values),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="needed only by members of several tenants"),
            OpenApiParameter("limit", OpenApiTypes.INT, description="page size, default 50, 1..500"),
            CURSOR,
            OpenApiParameter(
                "format",
                OpenApiTypes.STR,
                enum=["json", "csv"],
                description="csv: every matching entry (no paging), columns "
                + ", ".join(CSV_COLUMNS)
                + "; a cell that begins with = + - @, a tab or a carriage return gets a leading '",
            ),
        ],
        responses={
            (200, "application/json"): OpenApiResponse(AuditPageSerializer, description="a page of entries"),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="with format=csv: every matching entry"),
            **error_responses(
                e400=["invalid_parameter", "invalid_cursor", "workspace_required"],
                e403=["forbidden"],
                e404=["not_found"],
                e406=["not_acceptable (an Accept that admits not the format's media type)"],
            ),
        },
        summary="The tenant's audit log, oldest first (admin session)",
        tags=["audit"],
    )
    def get(self, request: Request) -> Any:
        tenant = _tenant(request)
        fmt = request.query_params.get("format") or "json"
        if fmt not in ("json", "csv"):
            raise InvalidParameter("format must be json or csv", parameter="format")
        action = request.query_params.get("action") or None
        if action is not None and action not in audit.Action.values:
            raise InvalidParameter(f"action must be one of {', '.join(audit.Action.values)}", parameter="action")
        filters: dict[str, Any] = {
            "tenant": tenant,
            "start": _bound(request, "from", end=False),
            "end": _bound(request, "to", end=True),
            "actor": request.query_params.get("actor") or None,
            "action": action,
        }
        if fmt == "csv":
            return _csv([audit.as_dict(e) for e in audit.entries(**filters).iterator()])
        limit = limit_param(request)
        query = list_query(request, "from", "to", "actor", "action")
        after = keyset_cursor(request, kind="audit", scope=tenant, query=query)
        if after is not None:
            filters["after"] = after
        rows = list(audit.entries(**filters)[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = (
            encode_cursor({"t": rows[-1].at.isoformat(), "id": rows[-1].pk}, kind="audit", scope=tenant, query=query)
            if more
            else None
        )
        return Response({"entries": [audit.as_dict(e) for e in rows], "next": next_cursor})


def _csv(entries: list[dict[str, Any]]) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for entry in entries:
        writer.writerow(["" if entry[c] is None else text_cell(str(entry[c])) for c in CSV_COLUMNS])
    response = HttpResponse(out.getvalue().encode(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    return response


urlpatterns = [path("audit", AuditView.as_view(), name="audit")]
