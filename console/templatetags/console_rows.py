"""The tags that write a page's long tables, each row drawn in Python by console/rows.py or
console/sessions.py (which draw with console_format's filters): a builtin of every template, as console_format is. Apart
from console_format so that it needs nothing of those modules (no import cycle)."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import SafeString, mark_safe

from console.rows import render_cost_rows, render_event_row, render_step_cost_rows, render_step_rows
from console.sessions import render_plan_sessions, render_sessions

register = template.Library()


@register.simple_tag
def event_rows(rows: list[dict[str, Any]], shared: Any = False) -> SafeString:
    """`{% event_rows rows shared %}`: the timeline's rows (console/rows.py `render_event_row`)."""
    return mark_safe("".join(render_event_row(row, shared=bool(shared)) for row in rows))  # escaped there


@register.simple_tag
def cost_rows(costs: list[dict[str, Any]]) -> SafeString:
    """`{% cost_rows costs %}`: the evidence tab's cost entries (console/rows.py `render_cost_rows`)."""
    return render_cost_rows(costs)


@register.simple_tag
def step_rows(steps: list[dict[str, Any]]) -> SafeString:
    """`{% step_rows steps %}`: the steps table's rows (console/rows.py `render_step_rows`)."""
    return render_step_rows(steps)


@register.simple_tag
def step_cost_rows(steps: list[dict[str, Any]]) -> SafeString:
    """`{% step_cost_rows steps %}`: the per-step costs' rows (console/rows.py `render_step_cost_rows`)."""
    return render_step_cost_rows(steps)


@register.simple_tag
def conversation_sessions(sessions: list[Any]) -> SafeString:
    """`{% conversation_sessions sessions %}`: the conversation's sessions (console/sessions.py)."""
    return render_sessions(sessions)


@register.simple_tag
def plan_sessions(sessions: list[dict[str, Any]]) -> SafeString:
    """`{% plan_sessions sessions %}`: the replay plan's harness sessions (console/sessions.py)."""
    return render_plan_sessions(sessions)
