"""Reads, always scoped: every selector takes the workspace (or the user) it answers for.

An object outside the caller's workspace raises NotFound, never a permission error: its existence
is not revealed (DESIGN.md §2).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

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
