"""The workspace navigation's numbers, for base.html on every page: how many decisions wait on
the Approvals page (re-execution requests, a batch counting once, and tool calls), whether the member may open the tenant's audit log, and whether they
may request re-executions (the runs list's batch form).

A tag rather than a value each view passes, so no page can forget the count."""

from __future__ import annotations

from typing import Any

from django import template

from ledger.models import Role, Workspace
from ledger.reads import reexecutions, selectors
from ledger.replay import toolapproval

register = template.Library()


NOTHING = {"pending": 0, "admin": False, "operator": False}


def waiting_decisions(workspace: Workspace) -> int:
    """What the Approvals page lists as waiting: one per pending re-execution request (a batch is
    one decision) and one per tool call waiting for an approver."""
    groups = {b or p for b, p in reexecutions.pending_approval(workspace).values_list("batch_id", "public_id")}
    return len(groups) + toolapproval.waiting_count(workspace)


@register.simple_tag(takes_context=True)
def workspace_nav(context: Any, user: Any, workspace: Workspace | None) -> dict[str, Any]:
    if workspace is None or not getattr(user, "is_authenticated", False):
        return NOTHING
    # Asked by the navigation and by the page's own content: two queries per page, not four.
    request = context.get("request")
    cache: dict[int, dict[str, Any]] = getattr(request, "_workspace_nav", {}) if request is not None else {}
    if workspace.pk not in cache:
        membership = selectors.membership(user, workspace.tenant)
        cache[workspace.pk] = (
            NOTHING
            if membership is None
            else {
                "pending": waiting_decisions(workspace),
                "admin": membership.allows(Role.ADMIN),
                "operator": membership.allows(Role.OPERATOR),
            }
        )
        if request is not None:
            request._workspace_nav = cache
    return cache[workspace.pk]
