"""/api/v1/runs: the workspace's runs, one run, its direct sub-runs (docs/api.md "Runs and events")."""

from __future__ import annotations

from typing import Any

from django.db.models import Model
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.models import Run, RunStatus, Workspace
from ledger.reads import attention, runlist, selectors, serialize, subruns

from .auth import access_for
from .base import ApiView, run_for
from .pagination import (
    InvalidCursor,
    InvalidParameter,
    decode_cursor,
    encode_cursor,
    keyset_cursor,
    limit_param,
    list_query,
)
from .schema import CURSOR, LIMIT, RUN_ID, WORKSPACE, RunListSerializer, RunSerializer, error_responses

# The runs list and a run's children hold the same kind of position, but each cursor opens only
# for its own list: the workspace's list, or that one run's children.
CURSOR_KIND = "runs"
CHILDREN_KIND = "run-children"
SORT = OpenApiParameter(
    "sort",
    OpenApiTypes.STR,
    enum=[f"{sign}{key}" for key in runlist.SORT_KEYS for sign in ("", "-")],
    description="started, duration, cost or tokens (input + output), ascending; `-` before "
    "the key for descending; none: -started (newest first). Runs without a value (still "
    "going, unpriced) come last either way",
)
ORDER = OpenApiParameter(
    "order",
    OpenApiTypes.STR,
    enum=["desc", "asc"],
    description="the direction as a parameter of its own (overrides a bare key's ascending; "
    "with a `-` key it must be desc)",
)


def _sort(request: Request) -> runlist.Sort:
    """The `sort` of docs/api.md: a key, `-` before it for descending (`-cost`), a bare key ascending; none is
    `-started`, newest first. `order=desc|asc` says the same in a second parameter (docs/api.md too); given
    with a `-` key it must agree."""
    raw = request.query_params.get("sort") or ""
    key = raw.removeprefix("-") if raw else "started"
    if key not in runlist.SORT_KEYS:
        keys = ", ".join(runlist.SORT_KEYS)
        raise InvalidParameter(f"sort must be one of {keys}, each with - before it for descending", parameter="sort")
    order = request.query_params.get("order") or None
    if order not in (None, "desc", "asc"):
        raise InvalidParameter("order must be desc or asc", parameter="order")
    if raw.startswith("-") and order == "asc":
        raise InvalidParameter(f"sort={raw} is descending and order=asc ascending: give one", parameter="order")
    if order is not None:
        descending = order == "desc"
    else:
        descending = raw.startswith("-") or not raw
    return runlist.Sort(key=key, descending=descending, nested=False)


# What a runs list's cursor is sealed with: a cursor of one filter or order opens under no other.
FILTERS = ("status", "workflow", "parentRunId", "q", "attention", "sort", "order")


def _position(request: Request, sort: runlist.Sort, kind: str, scope: Model, query: str) -> runlist.Position | None:
    if sort.default:
        return keyset_cursor(request, kind=kind, scope=scope, query=query)
    cursor = decode_cursor(request, kind=kind, scope=scope, query=query)
    if cursor is None:
        return None
    try:
        return runlist.load_position(sort, cursor)
    except (ValueError, TypeError, ArithmeticError):
        raise InvalidCursor("cursor is not one this API gave out") from None


def _runs_page(
    request: Request, workspace: Workspace, *, parent: Run | None = None, needs: str | None = None, **filters: Any
) -> dict[str, Any]:
    """A page of the workspace's runs, or of `parent`'s direct sub-runs."""
    kind, scope = (CURSOR_KIND, workspace) if parent is None else (CHILDREN_KIND, parent)
    if parent is not None:
        filters["parent_run_id"] = parent.run_id
    limit = limit_param(request)
    sort = _sort(request)
    query = list_query(request, *FILTERS)
    position = _position(request, sort, kind, scope, query)
    qs = selectors.filtered_runs(workspace, **filters)
    if needs is not None:
        qs = attention.matching(qs, workspace, needs)
    page, more = runlist.page(qs, sort, limit=limit, position=position)
    for row in page:
        row.workspace = workspace
    counts = selectors.children_counts(workspace, [r.run_id for r in page])
    shown = attention.for_runs(workspace, page)
    trees = subruns.tree_usages(workspace, page, counts)
    last = page[-1] if page else None
    next_cursor = (
        encode_cursor(runlist.dump_position(sort, last), kind=kind, scope=scope, query=query) if more and last else None
    )
    return {"runs": serialize.runs(page, counts, shown, trees), "next": next_cursor}


class RunListView(ApiView):
    @extend_schema(
        operation_id="list_runs",
        summary="Runs of the workspace, newest first or sorted (scope read)",
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, enum=list(RunStatus.values)),
            OpenApiParameter("workflow", OpenApiTypes.STR, description="exact workflowVersionId"),
            OpenApiParameter("parentRunId", OpenApiTypes.STR, description="exact parent run id"),
            OpenApiParameter(
                "q", OpenApiTypes.STR, description="case-insensitive substring of run id, workflow or label"
            ),
            OpenApiParameter(
                "attention",
                OpenApiTypes.STR,
                enum=[attention.ANY, *attention.KINDS],
                description="runs that need this of a person (`any`: any kind), whichever their attention shows first",
            ),
            SORT,
            ORDER,
            LIMIT,
            CURSOR,
            WORKSPACE,
        ],
        responses={
            200: RunListSerializer,
            **error_responses(
                e400=["invalid_parameter", "invalid_cursor", "workspace_required"],
                e403=["insufficient_scope"],
                e404=["not_found"],
            ),
        },
    )
    def get(self, request: Request) -> Response:
        caller = access_for(request, "read")
        status = request.query_params.get("status") or None
        if status is not None and status not in RunStatus.values:
            raise InvalidParameter(f"status must be one of {', '.join(RunStatus.values)}", parameter="status")
        needs = request.query_params.get("attention") or None
        if needs is not None and needs not in (attention.ANY, *attention.KINDS):
            raise InvalidParameter(
                f"attention must be one of {', '.join((attention.ANY, *attention.KINDS))}", parameter="attention"
            )
        return Response(
            _runs_page(
                request,
                caller.workspace,
                status=status,
                needs=needs,
                workflow=request.query_params.get("workflow") or None,
                parent_run_id=request.query_params.get("parentRunId") or None,
                q=request.query_params.get("q") or None,
            )
        )


class RunDetailView(ApiView):
    @extend_schema(
        operation_id="get_run",
        summary="The run, materialized from its log (scope read)",
        parameters=[RUN_ID, WORKSPACE],
        responses={
            200: RunSerializer,
            **error_responses(e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"]),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        counts = selectors.children_counts(run.workspace, [run.run_id])
        tree = subruns.tree_usages(run.workspace, [run], counts)[run.run_id]
        return Response(
            serialize.run(run, children=counts.get(run.run_id, 0), attention=attention.of_run(run), tree=tree)
        )


class RunChildrenView(ApiView):
    @extend_schema(
        operation_id="list_run_children",
        summary="Direct sub-runs, newest first or sorted (scope read)",
        parameters=[RUN_ID, SORT, ORDER, LIMIT, CURSOR, WORKSPACE],
        responses={
            200: RunListSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_parameter", "invalid_cursor"],
                e403=["insufficient_scope"],
                e404=["not_found"],
            ),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        return Response(_runs_page(request, run.workspace, parent=run))


urlpatterns = [
    path("runs", RunListView.as_view(), name="api-runs"),
    path("runs/<str:run_id>", RunDetailView.as_view(), name="api-run"),
    path("runs/<str:run_id>/children", RunChildrenView.as_view(), name="api-run-children"),
]
