"""/api/v1/usage: tokens and cost over time, grouped, as JSON pages or CSV (docs/api.md "Usage")."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.limits import FIRST_DAY
from ledger.reads.usage import GROUPINGS, usage_page, usage_rows
from ledger.tenancy.access import tenant_admin

from .auth import access_for, principal
from .base import ApiView
from .csvcells import text_cell
from .fastjson import JsonRenderer
from .pagination import InvalidParameter, date_param, encode_cursor, limit_param, list_query, row_cursor
from .schema import CURSOR, LIMIT, WORKSPACE, UsageReportSerializer, error_responses

CSV_COLUMNS = [
    "key",
    "inputTokens",
    "outputTokens",
    "cachedInputTokens",
    "reasoningTokens",
    "costUsd",
    "pricedCalls",
    "unpricedCalls",
]


class CsvRenderer(BaseRenderer):
    """Usage rows as CSV with a header line; an unpriced cost is an empty cell."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for row in data if isinstance(data, list) else []:
            writer.writerow(["" if row.get(c) is None else _csv_cell(row[c]) for c in CSV_COLUMNS])
        return out.getvalue().encode()


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.12f}".rstrip("0").rstrip(".") or "0"
    if isinstance(value, str):  # a key: a model, workflow or workspace name anyone with ingest may choose
        return text_cell(value)
    return str(value)


class UsageView(ApiView):
    renderer_classes = [JsonRenderer, CsvRenderer]

    @extend_schema(
        operation_id="get_usage",
        summary="Tokens and cost over time, grouped (scope read)",
        description=(
            "Aggregated in SQL from the cost entries (one per answered model call) by the time they were "
            "recorded. `from` and `to` are UTC days, both inclusive; default the 30 days ending today. "
            "`groupBy=week` (ISO weeks, Monday to Sunday) and `groupBy=month` (calendar months) give a row per "
            "period with calls, keyed by the period's first day (YYYY-MM-DD), or by `from` for a period the range "
            "begins inside; the first and last periods count only their days inside the range. Rows are "
            "ordered by key and paged with `limit`/`cursor`; `total` covers the whole range. A row's costUsd is "
            "null only when every call in it is unpriced. `?format=csv` (or `Accept: text/csv`) gives every row "
            "of the range as CSV, unpaged, header `" + ",".join(CSV_COLUMNS) + "`, an unpriced cost as an empty "
            "cell, a key that begins with = + - @, a tab or a carriage return written with a leading ' (so no "
            "spreadsheet runs it as a formula). Days run from 1900-01-01 to 9998-12-31; others are 400 "
            "`invalid_parameter`. By default the caller's workspace; `?scope=tenant` (admin members in a console session only; "
            "`?tenant=T` when a member of several) covers every workspace of the tenant."
        ),
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="first day, YYYY-MM-DD"),
            OpenApiParameter(
                "to", OpenApiTypes.DATE, description="last day (inclusive), YYYY-MM-DD; default today (UTC)"
            ),
            OpenApiParameter(
                "groupBy",
                OpenApiTypes.STR,
                enum=list(GROUPINGS),
                description="default day; week and month are additions to docs/api.md's four",
            ),
            OpenApiParameter("scope", OpenApiTypes.STR, enum=["workspace", "tenant"], description="default workspace"),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="with scope=tenant: which tenant"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            LIMIT,
            CURSOR,
            WORKSPACE,
        ],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="the rows as CSV"),
            **error_responses(
                e400=["invalid_parameter", "invalid_cursor", "workspace_required"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
            ),
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        group_by = params.get("groupBy") or "day"
        if group_by not in GROUPINGS:
            raise InvalidParameter(f"groupBy must be one of {', '.join(GROUPINGS)}", parameter="groupBy")
        end = date_param(request, "to", timezone.now().date())
        start = date_param(request, "from", max(end - timedelta(days=29), FIRST_DAY))
        if start > end:
            raise InvalidParameter("from must not be after to", parameter="from")
        scope = params.get("scope") or "workspace"
        where: dict[str, Any]
        if scope == "tenant":
            chosen = params.get("tenant") or params.get("workspace", "").partition("/")[0] or None
            where = {"tenant": tenant_admin(principal(request), tenant=chosen)}
        elif scope == "workspace":
            where = {"workspace": access_for(request, "read").workspace}
        else:
            raise InvalidParameter("scope must be workspace or tenant", parameter="scope")
        if request.accepted_renderer.format == CsvRenderer.format:
            rows, _ = usage_rows(group_by=group_by, start=start, end=end, **where)
            filename = f"usage-{start}-{end}-{group_by}.csv"
            return Response(
                [r.to_json() for r in rows], headers={"Content-Disposition": f'attachment; filename="{filename}"'}
            )
        limit = limit_param(request)
        listed = where["tenant"] if scope == "tenant" else where["workspace"]  # what a cursor opens for
        query = list_query(request, "from", "to", "groupBy")
        offset = row_cursor(request, "o", kind="usage", scope=listed, query=query)
        page, total, more = usage_page(group_by=group_by, start=start, end=end, offset=offset, limit=limit, **where)
        return Response(
            {
                "rows": [r.to_json() for r in page],
                "total": {k: v for k, v in total.to_json().items() if k != "key"},
                "next": encode_cursor({"o": offset + limit}, kind="usage", scope=listed, query=query) if more else None,
            }
        )


urlpatterns = [
    path("usage", UsageView.as_view(), name="api-usage"),
]
