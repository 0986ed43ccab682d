"""A run's harness sessions as the console draws them: the conversation's sessions (their turns,
messages and tool calls; console/pages/conversation.py builds them) and the replay plan's sessions
of the steps tab and a share link's page.

Written out here rather than by templates, as console/rows.py writes the timeline's rows: a page
draws 25 conversation sessions or 200 plan sessions, and Django's engine took most of those pages'
time (a lookup, a filter and localisation per value; an include per tool call). Every value is
escaped as the engine escaped it and goes through the filters the templates used.
tests/test_console_drawn_rows.py keeps the templates these replaced and compares the output byte
for byte.
"""

from __future__ import annotations

from typing import Any

from django.utils.formats import localize
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator, capfirst, slugify

from .templatetags.console_format import (
    count,
    escaped,
    kept_value,
    long_text,
    milliseconds,
    money,
    shown_name,
    shown_text,
    timestamp,
)

RECONCILED = '<span class="tag">reconciled by an operator</span>'
RETRIED = '<span class="tag retried-tag">retried below</span>'
LATE = '<span class="tag late-tag" title="reported after the run ended; counted in its cost">late call</span>'
ROLE = '· role <span class="mono">{}</span>'


def _value(value: Any) -> str:
    """`{{ value }}`: localized (a number as the engine writes it), then escaped."""
    return escaped(value if isinstance(value, str) else localize(value))


def _plural(n: int) -> str:
    return "" if n == 1 else "s"


def _above_one(value: Any) -> bool:
    """`{% if value and value > 1 %}`: a value that does not compare is false, as in the engine."""
    try:
        return bool(value) and value > 1
    except TypeError:
        return False


def _artifact_links(artifacts: list[dict[str, Any]]) -> str:
    out = []
    for a in artifacts:
        short = escaped(Truncator(a["id"]).chars(20))
        if a.get("url"):
            out.append(f'<a class="artifact mono" href="{escaped(a["url"])}" title="verified download">{short}</a> ')
        else:
            out.append(f'<span class="artifact mono" title="{_value(a["id"])}">{short}</span> ')
    return "".join(out)


def _stored_members(stored: list[dict[str, Any]]) -> str:
    out = []
    for a in stored:
        short = escaped(Truncator(a["id"]).chars(20))
        if a.get("url"):
            link = f'<a class="artifact mono" href="{escaped(a["url"])}" title="verified download">{short}</a>'
        else:
            link = f'<span class="artifact mono" title="{_value(a["id"])}">{short}</span>'
        out.append(
            f'<p class="stored muted">{escaped(capfirst(str(a["what"])))} stored as an artifact, not loaded here: '
            f"{link}</p>\n"
        )
    return "".join(out)


def render_tool(tool: Any) -> str:
    """One tool call of the conversation (a ToolView), as templates/console/run/tool_call.html wrote it."""
    call = tool.call
    status = call.status
    name = call.tool_name
    head = (
        f'<div class="tool-call tool-{_value(status)}" id="{escaped(kept_value(tool.anchor))}" '
        f'data-tool="{escaped(kept_value(name or ""))}">\n'
        f'  <p class="tool-head"><span aria-hidden="true">⚙</span> tool <strong class="mono tool-name">'
        f"{escaped(shown_name(name or '(unnamed)'))}</strong>\n"
        f'    <span class="mono muted">{escaped(shown_name(call.call_id))}</span>\n'
        f'    <span class="status status-{escaped(slugify(str(status)))}">{escaped(str(status).replace("_", " "))}'
        "</span>\n"
        f'    <span class="origin origin-{_value(tool.origin)}">{_value(tool.origin)}</span>\n'
        f"    {RECONCILED if call.reconciled else ''}\n"
        f'    <span class="muted">{f"called by {escaped(shown_name(call.caller))} · " if call.caller else ""}'
        f"{escaped(timestamp(tool.started_at))} · {escaped(milliseconds(call.duration_ms))}</span></p>\n"
        f'  <div class="io"><p class="label">arguments</p>{long_text(tool.args)}</div>\n  '
    )
    if tool.outcome is not None:
        failed = status == "failed"
        outcome = (
            f'<div class="io{" failure" if failed else ""}"><p class="label">{"error" if failed else "result"}</p>'
            f"{long_text(tool.outcome)}</div>\n  "
        )
    elif status == "in_doubt":
        outcome = (
            '<p class="failure">In doubt: the request left and no outcome was recorded. An operator must '
            "reconcile it (Evidence tab).</p>\n  "
        )
    else:
        outcome = '<p class="muted">No outcome recorded yet.</p>'
    return f"{head}{outcome}\n  {_stored_members(tool.stored)}\n  {_artifact_links(tool.artifacts)}\n</div>\n"


def _message(m: Any) -> str:
    if m.role == "system":
        return (
            '<details class="msg role-system"><summary><span class="role">system</span> prompt</summary>'
            f"{long_text(m.text)}</details>\n          "
        )
    role = _value(m.role)
    text = long_text(m.text) if m.text else ""
    calls = f'<p class="label">tool calls requested</p>{long_text(m.tool_calls)}' if m.tool_calls else ""
    result = f'<p class="label">tool result</p>{long_text(m.result)}' if m.result is not None else ""
    return (
        f'<div class="msg role-{role}"><span class="role">{role}</span>\n            {text}\n            {calls}\n'
        f"            {result}\n          </div>"
    )


def _usage(call: Any) -> str:
    usage = call.usage
    if usage and not call.usage_reported:
        return (
            f'· <span class="usage">usage not reported</span> · <span class="cost">{escaped(money(call.cost))}</span>'
        )
    if not usage:
        return ""
    cached = f" ({escaped(count(usage.cached_input_tokens))} cached)" if usage.cached_input_tokens else ""
    reasoning = f" ({escaped(count(usage.reasoning_tokens))} reasoning)" if usage.reasoning_tokens else ""
    return (
        f'· <span class="usage">{escaped(count(usage.input_tokens))} in{cached} / '
        f"{escaped(count(usage.output_tokens))} out{reasoning}</span> · "
        f'<span class="cost">{escaped(money(call.cost))}</span>'
    )


def _turn(t: Any) -> str:
    call = t.call
    status = call.status
    turn = call.turn
    model = f"{escaped(shown_name(call.provider))}/{escaped(shown_name(call.model_id))}" if call.model_id else "model"
    if status == "failed":
        state = '<span class="status status-failed">failed</span>'
    elif status == "called":
        state = '<span class="status status-running">no response recorded</span>'
    else:
        state = ""
    waited = t.waited
    answered = f", answered {escaped(timestamp(t.answered_at))} ({_value(waited)} later)" if waited else ""
    out = [
        f'\n      <li class="turn turn-{_value(status)}{" retried" if t.retried else ""}" '
        f'id="{escaped(kept_value(t.anchor))}" data-turn="{"" if turn is None else _value(turn)}">\n'
        f'        <h3 class="turn-head">Turn {"?" if turn is None else _value(turn)}\n'
        f'          <span class="mono model">{model}</span>\n'
        f'          <span class="origin origin-{_value(t.origin)}">{_value(t.origin)}</span>\n'
        f"          {state}\n"
        f"          {RETRIED if t.retried else ''}{LATE if t.late else ''}\n"
        f'          <span class="turn-facts muted">{escaped(timestamp(t.called_at))}{answered}\n'
        f"          {_usage(call)}</span>\n"
        "        </h3>\n        "
    ]
    if t.messages:
        label = "new messages" if t.incremental else "messages"
        caption = "New messages since the last turn" if t.incremental else "Messages sent"
        out.append(
            f'<div class="messages" aria-label="{label} sent">\n          <p class="label">{caption}</p>\n          '
        )
        out.extend(f"\n          {_message(m)}\n          " for m in t.messages)
        out.append("\n        </div>")
    out.append("\n        ")
    if status == "failed":
        out.append(f'<div class="failure" role="note"><strong>The model call failed</strong>{long_text(t.error)}</div>')
    out.append("\n        ")
    if t.choices:
        n = len(t.choices)
        for i, m in enumerate(t.choices, 1):
            text = long_text(m.text) if m.text else ""
            calls = f'<p class="label">tool calls requested</p>{long_text(m.tool_calls)}' if m.tool_calls else ""
            out.append(
                f'<div class="msg role-assistant response choice"><span class="role">response · choice {i}/{n}</span>\n'
                f"          {text}\n          {calls}\n        </div>"
            )
    elif t.response_text or t.response_tool_calls:
        text = long_text(t.response_text) if t.response_text else ""
        calls = (
            f'<p class="label">tool calls requested</p>{long_text(t.response_tool_calls)}'
            if t.response_tool_calls
            else ""
        )
        out.append(
            f'<div class="msg role-assistant response"><span class="role">response</span>\n          {text}\n'
            f"          {calls}\n        </div>"
        )
    out.append(f"\n        {_stored_members(t.stored)}\n        {_artifact_links(t.artifacts)}\n        ")
    out.extend(render_tool(tool) for tool in t.tools)
    out.append("\n      </li>\n    ")
    return "".join(out)


def _session(s: Any) -> str:
    first = _value(s.first_sequence)
    step = f' · step <span class="mono">{escaped(shown_name(s.step_path))}</span>' if s.step_path else ""
    status = f'<span class="status status-{_value(s.status)}">{_value(s.status)}</span>' if s.status else ""
    attempt = f'<span class="tag">attempt {_value(s.attempt)}</span>' if _above_one(s.attempt) else ""
    if s.turns:
        n = len(s.turns)
        summary = f"{n} turn{_plural(n)} · {escaped(money(s.cost))}"
    else:
        n = len(s.loose_tools)
        summary = f"{n} tool call{_plural(n)}, no model call"
    hashes = ""
    if s.manifest_hash or s.system_prompt_hash:
        prompt = (
            f'system prompt <span class="mono" title="{_value(s.system_prompt_hash)}">'
            f"{escaped(Truncator(s.system_prompt_hash).chars(23))}</span>"
            if s.system_prompt_hash
            else ""
        )
        manifest = (
            f'· manifest <span class="mono" title="{_value(s.manifest_hash)}">'
            f"{escaped(Truncator(s.manifest_hash).chars(23))}</span>"
            if s.manifest_hash
            else ""
        )
        hashes = f'<p class="hashes muted">\n      {prompt}\n      {manifest}</p>'
    error = (
        f'<div class="failure" role="note"><strong>Session failed</strong>{long_text(s.error)}</div>' if s.error else ""
    )
    out = [
        f'\n  <section class="session-view" id="session-{first}" aria-labelledby="session-{first}-title">\n'
        f'    <h2 id="session-{first}-title">{escaped(shown_text(s.title))}{step}\n'
        f"      {status}\n      {attempt}\n"
        f'      <span class="muted session-cost">{summary}</span></h2>\n'
        f"    {hashes}\n    {error}\n    ",
        *(render_tool(tool) for tool in s.loose_tools),
        '\n    <ol class="turns">\n    ',
        *(_turn(t) for t in s.turns),
        "\n    </ol>\n  </section>\n  ",
    ]
    return "".join(out)


def render_sessions(sessions: list[Any]) -> SafeString:
    """The conversation's sessions (console/pages/conversation.py's SessionViews), as the loop of
    templates/console/run/conversation.html wrote them."""
    return mark_safe("".join(_session(s) for s in sessions))  # every value in it is escaped above


def render_plan_sessions(sessions: list[dict[str, Any]]) -> SafeString:
    """The replay plan's harness sessions (the plan's session dicts, a call's `in_doubt` marked on
    the steps tab), as the loop of templates/console/run/steps.html wrote them."""
    out = []
    for session in sessions:
        calls = session["calls"]
        n = len(calls)
        role = session.get("role")
        out.append(
            f'\n    <details class="session"{" open" if n <= 50 else ""}><summary><span class="mono">'
            f"{escaped(shown_name(session.get('stepPath') or '(no step)'))}</span> "
            f"{ROLE.format(escaped(shown_name(role))) if role else ''} · "
            f"{n} call{_plural(n)}</summary>\n"
            '      <table class="grid calls">\n'
            '        <thead><tr><th>Kind</th><th class="num">Turn</th><th>Call</th><th>Would</th></tr></thead>\n'
            "        <tbody>\n        "
        )
        for call in calls:
            turn = call.get("turn")
            action = call.get("action")
            if call.get("in_doubt"):
                would = '<strong class="blocked">⚠ in doubt: reconcile it first</strong>, then replay its outcome'
            elif action == "replay":
                would = "replay from the record"
            else:
                would = "<strong>re-invoke</strong>"
            out.append(
                f'\n          <tr class="call action-{_value(action if action is not None else "")}">'
                f"<td>{_value(call.get('kind', ''))}</td>"
                f'<td class="num">{"" if turn is None else _value(turn)}</td>\n'
                f'            <td class="mono">{escaped(shown_name(call.get("callId") or ""))}</td>\n'
                f"            <td>{would}</td></tr>\n        "
            )
        if not calls:
            out.append('<tr><td colspan="4" class="muted">no calls</td></tr>\n        ')
        out.append("\n        </tbody>\n      </table>\n    </details>\n  ")
    return mark_safe("".join(out))  # every value in it is escaped above
