"""The outer loops of a workspace (a list, newest first, keyset pages) and the outer-loop page: a loop's goal, its cycles (each a run, linked) with status, cost and the
supervise verdicts, the pending cycle's reserved run, and the usage summed across cycles.

Everything on it is read from the ledger (ledger/runtime/outer_loop.py, `read_loop`): the loop's
record run and its cycle runs. The page is the record run's, for access: another tenant's loop
and one that does not exist are the same 404.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_safe

from ledger.canonical import canonical_json
from ledger.errors import LedgerError
from ledger.interop.little_loops import imported_loop
from ledger.reads import selectors
from ledger.runtime.outer_loop import (
    RECORD_VERSION_PREFIX,
    Cycle,
    OuterLoopManifestCorrupt,
    check_outer_loop_id,
    read_loop,
    record_run_id,
)

from ..rows import run_rows
from .filters import NOT_THESE_FILTERS, DateRangePageForm, clean_address, list_query, page_cursor, page_query
from .guard import member_access, switcher, workspace_or_404

PREVIEW = 240  # characters of a cycle's output or a final output shown in the table


def _preview(value: Any) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= PREVIEW else text[:PREVIEW] + "…"


def _cycle_row(tenant: str, workspace: str, cycle: Cycle) -> dict[str, Any]:
    verdict = cycle.supervise
    note = None
    if verdict is not None and verdict.get("kind") == "continue":
        note = verdict.get("promptNote")
    final = _preview(verdict.get("finalOutput")) if verdict is not None and verdict.get("kind") == "done" else None
    return {
        "cycle": cycle,
        "url": reverse("run", args=[tenant, workspace, cycle.run_id]) if cycle.status != "pending" else None,
        "verdict": verdict.get("kind") if verdict is not None else None,
        "note": note,
        "final": final,
        "output": _preview(cycle.output) if cycle.output is not None else None,
        "error": cycle.error.get("message") if isinstance(cycle.error, dict) else cycle.error,
    }


@login_required
@require_safe
def loop_page(request: HttpRequest, tenant: str, workspace: str, outer_loop_id: str) -> HttpResponse:
    try:
        check_outer_loop_id(outer_loop_id)
    except LedgerError:
        raise Http404("not found") from None
    try:
        member = member_access(request, tenant, workspace, run_id=record_run_id(outer_loop_id))
    except Http404:
        # No record run: a loop imported from Little Workflow, read from its cycle runs (or none).
        return _imported_loop_page(request, tenant, workspace, outer_loop_id)
    record = member.run
    assert record is not None
    context: dict[str, Any] = {
        "workspace": record.workspace,
        "outer_loop_id": outer_loop_id,
        "record": record,
        "record_url": reverse("run", args=[tenant, workspace, record.run_id]),
        "workspaces": switcher(request),
    }
    try:
        loop = read_loop(record.workspace, outer_loop_id, record)
    except OuterLoopManifestCorrupt as exc:
        context["corrupt"] = exc.message
        return render(request, "console/loop.html", context, status=409)
    error = loop.error if isinstance(loop.error, dict) else {}
    context.update(
        {
            "loop": loop,
            "usage": loop.usage,
            "rows": [_cycle_row(tenant, workspace, c) for c in loop.cycles],
            "final": _preview(loop.result.get("finalOutput")) if loop.result is not None else None,
            "error_code": error.get("causeCode"),
            "error_message": error.get("message"),
            "recorded": len(loop.completed_cycles),
        }
    )
    return render(request, "console/loop.html", context)


def _imported_loop_page(request: HttpRequest, tenant: str, workspace: str, outer_loop_id: str) -> HttpResponse:
    """The page of a loop `ledger import-little` brought in: its cycles, read from the cycle runs
    (ledger/interop/little_loops.py). Another tenant's loop, and one no run names, are 404."""
    space = workspace_or_404(request, tenant, workspace)
    loop = imported_loop(space, outer_loop_id)
    if loop is None:
        raise Http404("not found")
    context: dict[str, Any] = {
        "workspace": space,
        "outer_loop_id": outer_loop_id,
        "record": None,
        "imported": True,
        "workspaces": switcher(request),
        "loop": loop,
        "usage": loop.usage,
        "rows": [_cycle_row(tenant, workspace, c) for c in loop.cycles],
        "final": _preview(loop.result.get("finalOutput")) if loop.result is not None else None,
        "recorded": len(loop.completed_cycles),
    }
    return render(request, "console/loop.html", context)


LOOPS_PAGE = 50
CURSOR_KIND = "page:loops"
FILTERS = ("from", "to")


class LoopFilterForm(DateRangePageForm):
    """From/To, UTC days, inclusive: loops started on those days (their record run's creation, the
    list's order), as the runs list's dates select runs."""

    broken = NOT_THESE_FILTERS


def _loops_query(request: HttpRequest, **changes: str) -> str:
    """This list's URL with these changes: its filters, then the page, so a view is one link."""
    return list_query(request.GET, FILTERS, **changes)


@login_required
@require_safe
def loops_list(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """The workspace's outer loops: their record runs (workflow `outer_loop:…`), newest first,
    of the days From/To asked; a page link is sealed with those days (filters.page_query)."""
    ws = member_access(request, tenant, workspace).workspace
    if (clean := clean_address(request, FILTERS)) is not None:
        return clean
    query = page_query(request.GET, FILTERS)
    form = LoopFilterForm(request.GET, cursor_kind=CURSOR_KIND, cursor_scope=ws, cursor_query=query)
    context: dict[str, Any] = {
        "workspace": ws,
        "workspaces": switcher(request),
        "form": form,
        "first_url": _loops_query(request),
        "filtered": bool(query),
    }
    if not form.is_valid():
        context["rows"] = []
        return render(request, "console/loops.html", context, status=400)
    days = form.cleaned_data
    qs = selectors.search_runs(ws, start=days["from"], end=days["to"])
    qs = qs.filter(workflow_version_id__startswith=RECORD_VERSION_PREFIX)
    page, more = selectors.runs_page(qs, limit=LOOPS_PAGE, after=days["cursor"])
    rows = run_rows(ws, page)
    context.update(
        {
            "rows": [
                {
                    "row": row,
                    "loop_id": row.run.run_id.removeprefix("run_"),
                    "workflow": row.run.workflow_version_id.removeprefix(RECORD_VERSION_PREFIX),
                }
                for row in rows
            ],
            "next_url": _loops_query(
                request, cursor=page_cursor(page[-1].created_at, page[-1].pk, kind=CURSOR_KIND, scope=ws, query=query)
            )
            if more and page
            else None,
            "first_page": days["cursor"] is None,
        }
    )
    return render(request, "console/loops.html", context)


urlpatterns = [
    path("w/<slug:tenant>/<slug:workspace>/loops/", loops_list, name="outer-loops"),
    path("w/<slug:tenant>/<slug:workspace>/loops/<str:outer_loop_id>/", loop_page, name="outer-loop"),
]
