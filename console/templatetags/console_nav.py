"""The workspace navigation's numbers, for base.html on every page: how many things wait for an
approver (re-execution requests and tool calls, as the Approvals page lists them), whether the member may open the tenant's audit log, whether they
may request re-executions (the runs list's batch form), and whether they may decide on Approvals
(a run's attention links there only for them).

A tag rather than a value each view passes, so no page can forget the count."""

from __future__ import annotations

from typing import Any

from django import template

from ledger.models import Role, Workspace
from ledger.reads import attention, selectors

register = template.Library()


NOTHING = {"pending": 0, "admin": False, "approver": False, "operator": False}


@register.simple_tag(takes_context=True)
def workspace_nav(context: Any, user: Any, workspace: Workspace | None) -> dict[str, Any]:
    if workspace is None or not getattr(user, "is_authenticated", False):
        return NOTHING
    # Asked by the navigation and by the page's own content: two queries per page, not four.
    request = context.get("request")
    cache: dict[int, dict[str, Any]] = getattr(request, "_workspace_nav", {}) if request is not None else {}
    if workspace.pk not in cache:
        # The membership the page's own check resolved (console/pages/guard.py), else asked here.
        known = getattr(request, "_memberships", {}).get(workspace.tenant_id)
        if known is not None and known.user_id == user.pk:
            membership = known
        else:
            membership = selectors.membership(user, workspace.tenant_id)
        cache[workspace.pk] = (
            NOTHING
            if membership is None
            else {
                "pending": attention.waiting_for_approvers(workspace),
                "admin": membership.allows(Role.ADMIN),
                "approver": membership.allows(Role.APPROVER),
                "operator": membership.allows(Role.OPERATOR),
            }
        )
        if request is not None:
            request._workspace_nav = cache
    return cache[workspace.pk]
