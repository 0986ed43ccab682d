"""Reads, always scoped: every selector takes the workspace (or the user) it answers for.

An object outside the caller's workspace raises NotFound, never a permission error: its existence
is not revealed (DESIGN.md §2).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count, Q, QuerySet

from .envelopes import event_envelope
from .errors import NotFound
from .models import Event, Membership, Run, Workspace


def runs(workspace: Workspace) -> QuerySet[Run]:
    return Run.objects.filter(workspace=workspace)


def get_run(workspace: Workspace, run_id: str) -> Run:
    run = runs(workspace).filter(run_id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    return run


def events(run: Run, *, after: int = 0, limit: int | None = None, type_prefix: str | None = None) -> list[dict[str, Any]]:
    qs = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")
    if type_prefix:
        qs = qs.filter(type__startswith=type_prefix)
    if limit is not None:
        qs = qs[:limit]
    return [event_envelope(e, run.run_id) for e in qs]


def memberships(user: AbstractBaseUser) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("tenant").order_by("tenant__slug")


def workspaces_for(user: AbstractBaseUser) -> QuerySet[Workspace]:
    """The workspaces of every tenant the user is a member of."""
    if not user.is_authenticated:
        return Workspace.objects.none()
    return (
        Workspace.objects.filter(tenant__memberships__user=user)
        .select_related("tenant")
        .order_by("tenant__slug", "slug")
    )


def workspace_for(user: AbstractBaseUser, tenant_slug: str, workspace_slug: str) -> Workspace:
    ws = workspaces_for(user).filter(tenant__slug=tenant_slug, slug=workspace_slug).first()
    if ws is None:
        raise NotFound(f"workspace {tenant_slug}/{workspace_slug} not found")
    return ws


RUN_STATUSES = ("pending", "running", "completed", "failed")


def filtered_runs(
    workspace: Workspace,
    *,
    status: str | None = None,
    workflow: str | None = None,
    parent_run_id: str | None = None,
    q: str | None = None,
) -> QuerySet[Run]:
    """The workspace's runs, newest first (ties broken by the row id, so a cursor is stable)."""
    qs = runs(workspace).select_related("workspace__tenant")
    if status:
        qs = qs.filter(status=status)
    if workflow:
        qs = qs.filter(workflow_version_id=workflow)
    if parent_run_id:
        qs = qs.filter(parent_run_id=parent_run_id)
    if q:
        qs = qs.filter(Q(run_id__icontains=q) | Q(workflow_version_id__icontains=q) | Q(label__icontains=q))
    return qs.order_by("-created_at", "-pk")


def runs_page(qs: QuerySet[Run], *, limit: int, after: tuple[datetime, int] | None) -> tuple[list[Run], bool]:
    """One page of a newest-first run list, strictly after (created_at, pk); and whether more follow."""
    if after is not None:
        created_at, pk = after
        qs = qs.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=pk))
    page = list(qs[: limit + 1])
    return page[:limit], len(page) > limit


def children_counts(workspace: Workspace, run_ids: Iterable[str]) -> dict[str, int]:
    """Direct sub-runs per run, in one query for a whole page."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = (
        runs(workspace).filter(parent_run_id__in=ids).values("parent_run_id")
        .annotate(n=Count("pk")).values_list("parent_run_id", "n")
    )
    return dict(rows)
