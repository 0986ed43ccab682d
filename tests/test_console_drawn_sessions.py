"""A run's harness sessions are written in Python (console/sessions.py), not by the template
engine: the conversation's sessions, their turns, messages and tool calls (the conversation tab
and a share link's page, 25 sessions a page) and the replay plan's sessions (the steps tab and a
share link's page, up to 200). Each must be what its template wrote, byte for byte: the templates
they replaced are kept here and both are compared, on every session of the demo's runs and on
sessions made to hold what must be escaped or written out and every branch the templates had."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.template import Context, Engine

from console.pages.conversation import Message, SessionView, ToolView, TurnView, conversations
from console.pages.share import _strip_artifact_links
from console.sessions import render_plan_sessions, render_sessions
from ledger.demo import load_demo
from ledger.fold import ModelCall, ToolCallState
from ledger.fold.pricing import Usage
from ledger.models import Run
from ledger.replay import runlog
from ledger.replay.stored_plan import replay_plan_at

pytestmark = pytest.mark.django_db

# The loop of templates/console/run/conversation.html as it was, and the two templates it included
# (templates/console/run/tool_call.html and stored_member.html), the reference the Python must equal.
SESSIONS = """{% load console_format %}{% for s in sessions %}
  <section class="session-view" id="session-{{ s.first_sequence }}" aria-labelledby="session-{{ s.first_sequence }}-title">
    <h2 id="session-{{ s.first_sequence }}-title">{{ s.title|shown_text }}{% if s.step_path %} · step <span class="mono">{{ s.step_path|shown_name }}</span>{% endif %}
      {% if s.status %}<span class="status status-{{ s.status }}">{{ s.status }}</span>{% endif %}
      {% if s.attempt and s.attempt > 1 %}<span class="tag">attempt {{ s.attempt }}</span>{% endif %}
      <span class="muted session-cost">{% if s.turns %}{{ s.turns|length }} turn{{ s.turns|length|pluralize }} · {{ s.cost|money }}{% else %}{{ s.loose_tools|length }} tool call{{ s.loose_tools|length|pluralize }}, no model call{% endif %}</span></h2>
    {% if s.manifest_hash or s.system_prompt_hash %}<p class="hashes muted">
      {% if s.system_prompt_hash %}system prompt <span class="mono" title="{{ s.system_prompt_hash }}">{{ s.system_prompt_hash|truncatechars:23 }}</span>{% endif %}
      {% if s.manifest_hash %}· manifest <span class="mono" title="{{ s.manifest_hash }}">{{ s.manifest_hash|truncatechars:23 }}</span>{% endif %}</p>{% endif %}
    {% if s.error %}<div class="failure" role="note"><strong>Session failed</strong>{% long_text s.error %}</div>{% endif %}
    {% for tool in s.loose_tools %}{% include "tool_call" %}{% endfor %}
    <ol class="turns">
    {% for t in s.turns %}
      <li class="turn turn-{{ t.call.status }}{% if t.retried %} retried{% endif %}" id="{{ t.anchor|kept_value }}" data-turn="{{ t.call.turn|default_if_none:'' }}">
        <h3 class="turn-head">Turn {{ t.call.turn|default_if_none:"?" }}
          <span class="mono model">{% if t.call.model_id %}{{ t.call.provider|shown_name }}/{{ t.call.model_id|shown_name }}{% else %}model{% endif %}</span>
          <span class="origin origin-{{ t.origin }}">{{ t.origin }}</span>
          {% if t.call.status == "failed" %}<span class="status status-failed">failed</span>{% elif t.call.status == "called" %}<span class="status status-running">no response recorded</span>{% endif %}
          {% if t.retried %}<span class="tag retried-tag">retried below</span>{% endif %}{% if t.late %}<span class="tag late-tag" title="reported after the run ended; counted in its cost">late call</span>{% endif %}
          <span class="turn-facts muted">{{ t.called_at|timestamp }}{% if t.waited %}, answered {{ t.answered_at|timestamp }} ({{ t.waited }} later){% endif %}
          {% if t.call.usage and not t.call.usage_reported %}· <span class="usage">usage not reported</span> · <span class="cost">{{ t.call.cost|money }}</span>{% elif t.call.usage %}· <span class="usage">{{ t.call.usage.input_tokens|count }} in{% if t.call.usage.cached_input_tokens %} ({{ t.call.usage.cached_input_tokens|count }} cached){% endif %} / {{ t.call.usage.output_tokens|count }} out{% if t.call.usage.reasoning_tokens %} ({{ t.call.usage.reasoning_tokens|count }} reasoning){% endif %}</span> · <span class="cost">{{ t.call.cost|money }}</span>{% endif %}</span>
        </h3>
        {% if t.messages %}<div class="messages" aria-label="{% if t.incremental %}new messages{% else %}messages{% endif %} sent">
          <p class="label">{% if t.incremental %}New messages since the last turn{% else %}Messages sent{% endif %}</p>
          {% for m in t.messages %}
          {% if m.role == "system" %}<details class="msg role-system"><summary><span class="role">system</span> prompt</summary>{% long_text m.text %}</details>
          {% else %}<div class="msg role-{{ m.role }}"><span class="role">{{ m.role }}</span>
            {% if m.text %}{% long_text m.text %}{% endif %}
            {% if m.tool_calls %}<p class="label">tool calls requested</p>{% long_text m.tool_calls %}{% endif %}
            {% if m.result is not None %}<p class="label">tool result</p>{% long_text m.result %}{% endif %}
          </div>{% endif %}
          {% endfor %}
        </div>{% endif %}
        {% if t.call.status == "failed" %}<div class="failure" role="note"><strong>The model call failed</strong>{% long_text t.error %}</div>{% endif %}
        {% if t.choices %}{% for m in t.choices %}<div class="msg role-assistant response choice"><span class="role">response · choice {{ forloop.counter }}/{{ t.choices|length }}</span>
          {% if m.text %}{% long_text m.text %}{% endif %}
          {% if m.tool_calls %}<p class="label">tool calls requested</p>{% long_text m.tool_calls %}{% endif %}
        </div>{% endfor %}{% elif t.response_text or t.response_tool_calls %}<div class="msg role-assistant response"><span class="role">response</span>
          {% if t.response_text %}{% long_text t.response_text %}{% endif %}
          {% if t.response_tool_calls %}<p class="label">tool calls requested</p>{% long_text t.response_tool_calls %}{% endif %}
        </div>{% endif %}
        {% for a in t.stored %}{% include "stored_member" %}{% endfor %}
        {% for a in t.artifacts %}{% if a.url %}<a class="artifact mono" href="{{ a.url }}" title="verified download">{{ a.id|truncatechars:20 }}</a>{% else %}<span class="artifact mono" title="{{ a.id }}">{{ a.id|truncatechars:20 }}</span>{% endif %} {% endfor %}
        {% for tool in t.tools %}{% include "tool_call" %}{% endfor %}
      </li>
    {% endfor %}
    </ol>
  </section>
  {% endfor %}"""
TOOL_CALL = """{% load console_format %}<div class="tool-call tool-{{ tool.call.status }}" id="{{ tool.anchor|kept_value }}" data-tool="{{ tool.call.tool_name|default:''|kept_value }}">
  <p class="tool-head"><span aria-hidden="true">⚙</span> tool <strong class="mono tool-name">{{ tool.call.tool_name|default:"(unnamed)"|shown_name }}</strong>
    <span class="mono muted">{{ tool.call.call_id|shown_name }}</span>
    <span class="status status-{{ tool.call.status|slugify }}">{{ tool.call.status|words }}</span>
    <span class="origin origin-{{ tool.origin }}">{{ tool.origin }}</span>
    {% if tool.call.reconciled %}<span class="tag">reconciled by an operator</span>{% endif %}
    <span class="muted">{% if tool.call.caller %}called by {{ tool.call.caller|shown_name }} · {% endif %}{{ tool.started_at|timestamp }} · {{ tool.call.duration_ms|milliseconds }}</span></p>
  <div class="io"><p class="label">arguments</p>{% long_text tool.args %}</div>
  {% if tool.outcome is not None %}<div class="io{% if tool.call.status == 'failed' %} failure{% endif %}"><p class="label">{% if tool.call.status == "failed" %}error{% else %}result{% endif %}</p>{% long_text tool.outcome %}</div>
  {% elif tool.call.status == "in_doubt" %}<p class="failure">In doubt: the request left and no outcome was recorded. An operator must reconcile it (Evidence tab).</p>
  {% else %}<p class="muted">No outcome recorded yet.</p>{% endif %}
  {% for a in tool.stored %}{% include "stored_member" %}{% endfor %}
  {% for a in tool.artifacts %}{% if a.url %}<a class="artifact mono" href="{{ a.url }}" title="verified download">{{ a.id|truncatechars:20 }}</a>{% else %}<span class="artifact mono" title="{{ a.id }}">{{ a.id|truncatechars:20 }}</span>{% endif %} {% endfor %}
</div>
"""
STORED_MEMBER = """{% load console_format %}<p class="stored muted">{{ a.what|capfirst }} stored as an artifact, not loaded here: {% if a.url %}<a class="artifact mono" href="{{ a.url }}" title="verified download">{{ a.id|truncatechars:20 }}</a>{% else %}<span class="artifact mono" title="{{ a.id }}">{{ a.id|truncatechars:20 }}</span>{% endif %}</p>
"""
# The harness sessions of templates/console/run/steps.html as it was.
PLAN_SESSIONS = """{% load console_format %}{% for session in sessions %}
    <details class="session"{% if session.calls|length <= 50 %} open{% endif %}><summary><span class="mono">{{ session.stepPath|default:"(no step)"|shown_name }}</span> {% if session.role %}· role <span class="mono">{{ session.role|shown_name }}</span>{% endif %} · {{ session.calls|length }} call{{ session.calls|length|pluralize }}</summary>
      <table class="grid calls">
        <thead><tr><th>Kind</th><th class="num">Turn</th><th>Call</th><th>Would</th></tr></thead>
        <tbody>
        {% for call in session.calls %}
          <tr class="call action-{{ call.action }}"><td>{{ call.kind }}</td><td class="num">{{ call.turn|default_if_none:"" }}</td>
            <td class="mono">{{ call.callId|default:""|shown_name }}</td>
            <td>{% if call.in_doubt %}<strong class="blocked">⚠ in doubt: reconcile it first</strong>, then replay its outcome{% elif call.action == "replay" %}replay from the record{% else %}<strong>re-invoke</strong>{% endif %}</td></tr>
        {% empty %}<tr><td colspan="4" class="muted">no calls</td></tr>
        {% endfor %}
        </tbody>
      </table>
    </details>
  {% endfor %}"""

ENGINE = Engine(
    loaders=[("django.template.loaders.locmem.Loader", {"tool_call": TOOL_CALL, "stored_member": STORED_MEMBER})],
    libraries={"console_format": "console.templatetags.console_format"},
)


def _reference(template: str, **context: Any) -> str:
    return ENGINE.from_string(template).render(Context(context))


def _branches(views: list[SessionView]) -> set[str]:
    """Which of the templates' branches these sessions take."""
    seen: set[str] = set()
    for s in views:
        seen |= {name for name in ("step_path", "status", "manifest_hash", "error", "loose_tools") if getattr(s, name)}
        for t in s.turns:
            seen |= {
                name
                for name in ("retried", "late", "choices", "incremental", "messages", "stored", "artifacts", "tools")
                if getattr(t, name)
            }
            seen |= {f"turn {t.call.status}"} | ({"waited"} if t.waited else set())
            seen |= {f"message {m.role}" for m in t.messages}
            for tool in t.tools:
                seen |= {f"tool {tool.call.status}"} | ({"tool stored"} if tool.stored else set())
    return seen


def test_every_session_of_the_demo_runs_conversations_is_the_templates() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    seen: set[str] = set()
    for run in Run.objects.select_related("workspace__tenant").exclude(last_sequence=0):
        views = conversations(run.workspace, runlog.snapshot(run))
        assert render_sessions(views) == _reference(SESSIONS, sessions=views)
        seen |= _branches(views)
        _strip_artifact_links(views)  # as a share link's page shows them
        assert render_sessions(views) == _reference(SESSIONS, sessions=views)
    assert {"step_path", "status", "messages", "tools", "turn responded", "message user", "tool succeeded"} <= seen
    assert render_sessions([]) == _reference(SESSIONS, sessions=[])


def _change(call: Any, fields: dict[str, Any], changes: dict[str, Any]) -> None:
    """Each change on the call where it names one of its fields, else on the view's."""
    for name, value in changes.items():
        if hasattr(call, name) and name not in fields:
            setattr(call, name, value)
        else:
            fields[name] = value


def _tool(**changes: Any) -> ToolView:
    call = ToolCallState(
        call_id="call<1>&\u202e",
        tool_name="lookup_order",
        args={"orderId": "B-2"},
        caller="agent <x>",
        status="succeeded",
        duration_ms=1234.5,
    )
    fields: dict[str, Any] = {
        "call": call,
        "origin": "live",
        "args": '{\n  "orderId": "<B-2>"\n}',
        "outcome": "x" * 1600,
        "started_at": "2026-12-05T10:00:01.250000+00:00",
        "artifacts": [],
    }
    _change(call, fields, changes)
    return ToolView(**fields)


def _turn(**changes: Any) -> TurnView:
    call = ModelCall(
        turn=3,
        call_id="mc_1",
        status="responded",
        provider="openai",
        model_id="gpt-4o-mini\u200b",
        usage=Usage(input_tokens=12345, output_tokens=67, cached_input_tokens=1000, reasoning_tokens=5),
        cost=Decimal("0.0012345"),
        called_sequence=4,
        responded_sequence=5,
    )
    fields: dict[str, Any] = {
        "call": call,
        "origin": "recorded",
        "retried": False,
        "messages": [Message(role="user", text="hello <b>&</b>")],
        "incremental": False,
        "response_text": "answer \u202e",
        "response_tool_calls": None,
        "called_at": "2026-12-05T10:00:00+00:00",
        "answered_at": "2026-12-05T10:00:02.500000+00:00",
        "error": None,
        "artifacts": [],
    }
    _change(call, fields, changes)
    return TurnView(**fields)


STORED = [
    {"what": "response text", "id": "sha256:" + "a" * 64, "url": "/api/v1/artifacts/x/content?workspace=a/b&c=1"},
    {"what": "<result>", "id": 'imported"<ref>', "url": None},
]
LINKS = [
    {"id": "art_" + "b" * 40, "url": "/api/v1/artifacts/y/content?workspace=a/b"},
    {"id": "art_<short>", "url": None},
]


@pytest.mark.parametrize(
    "turn",
    [
        {},
        {"retried": True, "status": "failed", "error": '{\n  "message": "<boom>"\n}', "answered_at": None},
        {"status": "called", "usage": None, "cost": None, "turn": None, "model_id": None, "messages": []},
        {"usage": Usage(), "usage_reported": False, "cost": None, "incremental": True},
        {
            "usage": Usage(input_tokens=10, output_tokens=2),
            "cost": Decimal(0),
            "answered_at": "2026-12-05T10:00:00+00:00",
        },
        {
            "messages": [
                Message(role="system", text="You are <careful>.\n" * 40),
                Message(role="assistant", text="", tool_calls='lookup({"a": "<1>"})  #c1'),
                Message(role="tool", text="", result="null"),
                Message(role="<odd>\u202e", text="t\tab", result=""),
            ],
            "response_text": None,
            "response_tool_calls": 'lookup({"a": 1})  #c2',
            "stored": STORED,
            "artifacts": LINKS,
        },
        {"tools": [_tool(), _tool(status="failed", outcome="boom", reconciled=True, caller=None)]},
        {"turn": "7<", "origin": "simulated", "provider": None},
        {"late": True},
        {
            "choices": [
                Message(role="assistant", text="first <b>"),
                Message(role="assistant", text="", tool_calls='lookup({"a": "<1>"})  #c1'),
                Message(role="assistant", text="third\u202e", tool_calls="x()"),
            ]
        },
    ],
)
def test_a_turn_made_to_need_escaping_or_every_branch_is_the_templates(turn: dict[str, Any]) -> None:
    session = SessionView(
        title="triage <agent>\u202e",
        step_path="draft/<reply>",
        status="completed",
        attempt=2,
        manifest_hash="sha256:" + "c" * 64,
        system_prompt_hash="sha256:<" + "d" * 63,
        first_sequence=12,
        error=None,
        turns=[_turn(**turn), _turn()],
    )
    assert render_sessions([session]) == _reference(SESSIONS, sessions=[session])


@pytest.mark.parametrize(
    "tool",
    [
        {},
        {"status": "in_doubt", "outcome": None, "tool_name": None, "duration_ms": None, "started_at": None},
        {"status": "started", "outcome": None, "tool_name": "", "caller": ""},
        {"status": "waiting_approval", "outcome": None, "origin": "<x>"},
        {"stored": STORED, "artifacts": LINKS, "args": "(stored as an artifact)", "outcome": "(not recorded)"},
        {"status": "Weird Status<1>", "tool_name": "t\u202e<b>"},
    ],
)
def test_a_loose_tool_call_made_to_need_escaping_or_every_branch_is_the_templates(tool: dict[str, Any]) -> None:
    for attempt, hashes in ((None, None), (1, "sha256:" + "e" * 64), ("2", None), (3, "short")):
        session = SessionView(
            title="Outside a harness session",
            step_path=None,
            status=None,
            attempt=attempt,  # type: ignore[arg-type]
            manifest_hash=hashes,
            system_prompt_hash=None,
            first_sequence=3,
            error='{\n  "name": "<Crash>"\n}' if attempt else None,
            loose_tools=[_tool(**tool)],
        )
        assert render_sessions([session]) == _reference(SESSIONS, sessions=[session])


def test_the_replay_plans_sessions_of_the_demo_runs_are_the_templates() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    listed = 0
    for run in Run.objects.select_related("workspace__tenant").exclude(last_sequence=0):
        sessions = replay_plan_at(run, runlog.snapshot(run).state)["sessions"]
        listed += len(sessions)
        assert render_plan_sessions(sessions) == _reference(PLAN_SESSIONS, sessions=sessions)
        marked = [  # the steps tab marks the tool calls in doubt
            {**s, "calls": [{**c, "in_doubt": n % 2 == 0} for n, c in enumerate(s["calls"])]} for s in sessions
        ]
        assert render_plan_sessions(marked) == _reference(PLAN_SESSIONS, sessions=marked)
    assert listed


def test_plan_sessions_made_to_need_escaping_or_every_branch_are_the_templates() -> None:
    call = {"kind": "model", "turn": 1, "callId": "mc_<1>\u202e", "action": "replay"}
    sessions: list[dict[str, Any]] = [
        {"stepPath": 'a/"<b>"', "role": "triage\u200b", "calls": [call, {**call, "action": "reinvoke", "turn": None}]},
        {"stepPath": None, "calls": []},
        {"stepPath": "", "role": "", "calls": [{**call, "kind": "tool<x>", "in_doubt": True}] * 51},
        {"stepPath": "s", "calls": [{"kind": "tool", "action": "<odd>"}, {**call, "callId": None, "turn": "2<"}]},
    ]
    assert render_plan_sessions(sessions) == _reference(PLAN_SESSIONS, sessions=sessions)
    assert render_plan_sessions([]) == _reference(PLAN_SESSIONS, sessions=[])


def test_the_conversation_tab_and_the_steps_tab_draw_these_sessions(client: Any) -> None:
    """The pages answer the drawn sessions: the conversation tab holds the sessions as
    render_sessions writes them, the steps tab the plan's sessions as render_plan_sessions does."""
    load_demo(history_runs=1, evaluations_too=False)
    client.force_login(User.objects.get(username="dave"))  # the demo's viewer
    runs = Run.objects.select_related("workspace__tenant").filter(workspace__tenant__slug="acme")
    run = next(r for r in runs.exclude(last_sequence=0) if conversations(r.workspace, runlog.snapshot(r)))
    base = f"/w/{run.workspace.tenant.slug}/{run.workspace.slug}/runs/{run.run_id}/"
    views = conversations(run.workspace, runlog.snapshot(run))
    page = client.get(base + "conversation/")
    assert page.status_code == 200
    assert str(render_sessions(views)) in page.content.decode()
    sessions = replay_plan_at(run, runlog.snapshot(run).state)["sessions"]
    steps = client.get(base + "steps/")
    assert steps.status_code == 200 and sessions
    assert str(render_plan_sessions(sessions)).split("<tbody>")[0] in steps.content.decode()
