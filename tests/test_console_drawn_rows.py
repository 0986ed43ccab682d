"""A timeline row (console/rows.py `render_event_row`), a waterfall bar (console/pages/waterfall.py
`render_bars`), a folded text (`{% long_text %}`), the evidence tab's cost rows
(`render_cost_rows`), the state tab's steps (console/pages/at.py `render_steps`) and the steps and
per-step costs tables (`render_step_rows`, `render_step_cost_rows`) are written in Python, not by
the template engine (a page draws 200 rows or up to 1,000 bars; the engine took ~0.3 ms a row).
Each must be what its template wrote, byte for byte: the templates they replaced are kept here and
both are compared, on every event, bar, cost entry, step and state (after each event) of the
demo's runs (gaps, call pairs, origins, artifacts, offsets, sub-runs, usage) and on rows made to
hold what must be escaped or written out."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.template import engines

from console.format import preview
from console.pages import share
from console.pages.at import render_steps, state_after
from console.pages.waterfall import Axis, Bar, render_bars, waterfall
from console.rows import event_row, render_event_row
from console.timeline import annotate
from ledger import clock, log
from ledger.demo import load_demo
from ledger.fold.state import StepState
from ledger.models import CostEntry, Run, Step, Workspace
from ledger.reads import selectors, serialize
from ledger.replay import runlog
from tests.conftest import started

pytestmark = pytest.mark.django_db

# templates/console/run/event_row.html as it was, the reference the Python row must equal.
TEMPLATE = """{% load console_format %}{% if row.gap %}<tr class="gap" data-before="{{ row.sequence }}"><td colspan="6"><span class="gap-mark" aria-hidden="true">⋯</span> {{ row.gap }}</td></tr>
{% endif %}<tr class="event" id="event-{{ row.sequence }}" data-sequence="{{ row.sequence }}"{% if row.call %} data-call="{{ row.call|kept_value }}"{% if row.pair_end %} data-pair="end"{% endif %}{% endif %}>
  <td class="num"><a href="#event-{{ row.sequence }}" title="{{ row.event_id }}">{{ row.sequence }}</a></td>
  <td class="mono ev-type">{{ row.type|shown_name }}</td>
  <td class="mono ev-step">{{ row.step_path|shown_name }}</td>
  <td class="mono ev-time">{% if row.offset %}<time datetime="{{ row.occurred_at.isoformat }}" title="{{ row.absolute }}">{{ row.offset }}</time>{% else %}{{ row.recorded_at|timestamp:"ms" }}{% endif %}</td>
  <td>{% if row.origin %}<span class="origin origin-{{ row.origin }}">{{ row.origin }}</span>{% endif %}</td>
  <td class="ev-payload">
    {% if row.summary %}<span class="ev-summary">{{ row.summary|shown_text }}</span>{% endif %}
    <details><summary>payload</summary>
      {% if not shared %}<button type="button" class="copy" aria-label="Copy the payload of event {{ row.sequence }}">Copy</button>{% endif %}
      <pre class="mono json">{{ row.pretty|shown_data }}</pre>
    </details>
    {% for a in row.artifacts %}{% if a.url %}<a class="artifact mono" href="{{ a.url }}" title="verified download">{{ a.id|truncatechars:20 }}</a>{% else %}<span class="artifact mono" title="{{ a.id }}">{{ a.id|truncatechars:20 }}</span>{% endif %} {% endfor %}
  </td>
</tr>
"""


def _reference(row: dict[str, Any], *, shared: bool | None) -> str:
    context: dict[str, Any] = {"row": row} if shared is None else {"row": row, "shared": shared}
    return engines["django"].from_string(TEMPLATE).render(context)


def _assert_same(row: dict[str, Any]) -> None:
    assert render_event_row(row) == _reference(row, shared=None)  # the push and the rows fragment
    for shared in (False, True):
        assert render_event_row(row, shared=shared) == _reference(row, shared=shared)


def test_every_row_of_the_demo_runs_is_the_templates_row() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    seen: set[str] = set()
    for run in Run.objects.select_related("workspace__tenant"):
        envelopes = selectors.events(run)
        rows = [event_row(e, run.workspace) for e in envelopes]
        annotate(rows, envelopes, run)
        for row in rows:
            _assert_same(row)
            seen.update(key for key, value in row.items() if value)
    # The demo's rows took every branch: a gap, a call and its pair, an offset, an origin, a summary.
    assert {"gap", "call", "pair_end", "offset", "origin", "summary"} <= seen


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"gap": "3m 2s without events — <b>&</b>", "call": 'c"1<\u202e', "pair_end": True},
        {"call": "c2", "pair_end": False, "origin": "recorded"},
        {"summary": "line\tone\nline two \u202e<script>", "step_path": "step\u200b<a>", "type": "x.\u2066y"},
        {"pretty": '{\n  "a": "<\u202e>&\'"\n}'},
        {"recorded_at": "2026-12-05T10:00:00.123456+00:00"},
        {
            "artifacts": [
                {"id": "art_" + "a" * 64, "url": "/api/v1/artifacts/x/content?workspace=a/b&c=<d>"},
                {"id": 'art_<short>"', "url": None},
                {"id": "a\u202eb", "url": ""},
            ]
        },
    ],
)
def test_a_row_with_what_must_be_escaped_or_written_out_is_the_templates_row(changes: dict[str, Any]) -> None:
    at = datetime(2026, 12, 5, 10, 0, 1, 500000, tzinfo=UTC)
    row: dict[str, Any] = {
        "sequence": 12345,
        "event_id": 'evt_"<1>&',
        "type": "harness.model.responded",
        "step_path": "draft/<reply>",
        "recorded_at": "2026-12-05T10:00:01.500000+00:00",
        "origin": None,
        "pretty": '{\n  "text": "<b>bold</b> & more"\n}',
        "artifacts": [],
        "summary": "",
        "call": "",
    }
    if "recorded_at" not in changes:
        row.update(offset="+1.5s", occurred_at=at, absolute="2026-12-05 10:00:01.500 UTC")
    row.update(changes)
    _assert_same(row)


# templates/console/run/waterfall_rows.html as it was.
BARS_TEMPLATE = """{% load console_format %}{% for bar in rows %}<div class="wf-row kind-{{ bar.kind }} wf-{{ bar.status|slugify }} pattern-{{ bar.pattern }}{% if bar.critical %} critical{% endif %}" role="listitem" data-depth="{{ bar.depth }}" data-kind="{{ bar.kind }}"{% if bar.subrun %} data-subrun="{{ bar.subrun.run_id }}"{% endif %}>
  <span class="wf-label">{% if bar.subrun %}<button type="button" class="wf-expand" aria-expanded="false" aria-controls="wf-sub-{{ bar.subrun.run_id }}"
      aria-label="Show the bars of sub-run {{ bar.subrun.run_id }}"
      hx-get="{% url 'run-waterfall-rows' bar.subrun.workspace.tenant.slug bar.subrun.workspace.slug bar.subrun.run_id %}?from={{ axis.start.isoformat|urlencode }}&amp;to={{ axis.end.isoformat|urlencode }}&amp;depth={{ bar.depth|add:1 }}"
      hx-target="#wf-sub-{{ bar.subrun.run_id }}" hx-trigger="click once">▸</button>{% endif %}
    <span class="wf-kind">{{ bar.kind }}</span> <a class="wf-link{% if bar.kind == 'subrun' %} mono{% endif %}" href="{{ bar.href }}">{{ bar.label|shown_name }}</a>
    {% if bar.detail %}<span class="muted mono">{{ bar.detail|shown_name }}</span>{% endif %}
    <span class="muted took">{{ bar.took }}</span>{% if bar.has_usage %} <span class="wf-usage">{% if bar.cost is not None %}{{ bar.cost|money }}{% endif %}{% if bar.tokens_in is not None %} · {{ bar.tokens_in|count }} in / {{ bar.tokens_out|count }} out{% elif not bar.usage_reported %}n/a · usage not reported{% endif %}</span>{% endif %}{% if bar.status %} <span class="status status-{{ bar.status|slugify }}">{{ bar.status|words }}</span>{% endif %}{% if bar.critical %} <span class="visually-hidden">on the critical path</span>{% endif %}</span>
  <span class="wf-track">{% if bar.detail_url %}<button type="button" class="wf-bar wf-expand" aria-expanded="false" aria-controls="{{ bar.detail_id }}"
      aria-label="Details of {{ bar.kind }} {{ bar.label|shown_attr }}" hx-get="{{ bar.detail_url }}" hx-target="#{{ bar.detail_id }}" hx-trigger="click once"
      data-left="{{ bar.left|stringformat:'.3f' }}" data-width="{{ bar.width|stringformat:'.3f' }}" title="{{ bar.kind }} {{ bar.label|shown_attr }}: {{ bar.took }}{% if bar.cost is not None %} · {{ bar.cost|money }}{% endif %}{% if bar.tokens_in is not None %} · {{ bar.tokens_in|count }} in / {{ bar.tokens_out|count }} out tokens{% elif not bar.usage_reported %} · n/a, usage not reported{% endif %}"></button>{% else %}<a class="wf-bar" href="{{ bar.href }}" tabindex="-1" aria-hidden="true" data-left="{{ bar.left|stringformat:'.3f' }}" data-width="{{ bar.width|stringformat:'.3f' }}" title="{{ bar.kind }} {{ bar.label|shown_attr }}: {{ bar.took }}"></a>{% endif %}</span>
</div>{% if bar.detail_url %}<div class="wf-children wf-detail" id="{{ bar.detail_id }}" role="listitem" aria-label="Details of {{ bar.kind }} {{ bar.label|shown_attr }}"></div>{% endif %}{% if bar.subrun %}<div class="wf-children" id="wf-sub-{{ bar.subrun.run_id }}" role="presentation"></div>{% endif %}
{% endfor %}
"""


def _bars_reference(rows: list[Bar], axis: Axis | None) -> str:
    return engines["django"].from_string(BARS_TEMPLATE).render({"rows": rows, "axis": axis})


def test_every_bar_of_the_demo_runs_waterfalls_is_the_templates_bar() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    drawn: set[str] = set()
    for run in Run.objects.select_related("workspace__tenant").exclude(last_sequence=0):
        view = waterfall(run, runlog.snapshot(run), runlog.children_of(run), start=0)
        for depth in (0, 2):  # a sub-run's bars drawn in place are deeper
            for bar in view["rows"]:
                bar.depth += depth
            assert render_bars(view["rows"], view["axis"]) == _bars_reference(view["rows"], view["axis"])
        for bar in view["rows"]:
            drawn.update(
                name
                for name in ("subrun", "detail", "detail_url", "critical", "cost", "tokens_in", "status")
                if getattr(bar, name)
            )
            drawn.update({"unreported"} if not bar.usage_reported else set())
    assert {"subrun", "detail", "detail_url", "critical", "cost", "tokens_in", "status"} <= drawn
    assert render_bars([], None) == _bars_reference([], None)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"status": "in_doubt", "cost": Decimal("0.0012345"), "tokens_in": 1234567, "tokens_out": 0},
        {"status": "", "end": None, "usage_reported": False, "critical": True},
        {"label": 'step "<b>" & \u202eevil', "detail": "model <x>\u200b", "kind": "model"},
        {"detail_url": "/w/a/b/runs/r/waterfall/detail/?kind=step&id=<p>", "detail_id": 'wf-detail-r-step-"3'},
        {"cost": Decimal("0"), "tokens_in": None, "detail_url": "/d?x=1&y=2", "detail_id": "d1"},
        {"kind": "subrun", "subrun": "child", "label": "run_child<1>", "href": "/w/acme/support/runs/run_child/"},
    ],
)
def test_a_bar_with_what_must_be_escaped_or_written_out_is_the_templates_bar(
    workspace: Workspace, changes: dict[str, Any]
) -> None:
    log.append(workspace=workspace, run_id="run_child", events=[started()])
    start = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)
    axis = Axis(start, start + timedelta(seconds=7))
    if changes.get("subrun") == "child":
        changes = {**changes, "subrun": Run.objects.select_related("workspace__tenant").get(run_id="run_child")}
    bar = Bar(
        kind="step",
        label="draft/reply",
        status="completed",
        start=start + timedelta(seconds=1),
        end=start + timedelta(seconds=3, milliseconds=250),
        href="/w/acme/support/runs/run_x/timeline/?after=3#event-4",
        depth=1,
    )
    for name, value in changes.items():
        setattr(bar, name, value)
    axis.place(bar)
    assert render_bars([bar, bar], axis) == _bars_reference([bar, bar], axis)


# templates/console/long_text.html as it was (the context its inclusion tag gave it), each <pre>
# since given dir="auto".
LONG_TEXT_TEMPLATE = (
    '{% load console_format %}{% if preview is None %}<pre class="text" dir="auto">{{ text|shown_data }}</pre>'
    '{% else %}<div class="fold"><pre class="text preview" dir="auto">{{ preview|shown_data }}…</pre><details><summary>'
    'Show all {{ size|count }} characters</summary><pre class="text" dir="auto">{{ text|shown_data }}</pre></details></div>'
    "{% endif %}\n"
)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "short <b>&</b> \"quoted\" 'single'",
        "tabs\tand\nlines \u202e\u200b hidden",
        "x" * 1500,
        "y" * 1501 + "<end>",
        "\n".join(f"line {n} <{n}>" for n in range(25)),
        "é" * 3000 + "\u2066",
    ],
)
def test_a_long_text_is_what_its_template_wrote(text: str) -> None:
    page = engines["django"].from_string("{% load console_format %}[{% long_text text %}]")
    reference = engines["django"].from_string(LONG_TEXT_TEMPLATE)
    context = {"text": text, "preview": preview(text), "size": len(text)}
    assert page.render({"text": text}) == f"[{reference.render(context)}]"


@pytest.mark.parametrize("text", ["مرحبا، أين طلبي؟", "שלום! " * 400])
def test_a_right_to_left_text_reads_in_its_own_direction(text: str) -> None:
    """A message in Arabic or Hebrew in a left-to-right page: each <pre> it is shown in (the preview
    of a long one, and its whole) takes its direction from the text."""
    html = engines["django"].from_string("{% load console_format %}{% long_text text %}").render({"text": text})
    pres = re.findall(r"<pre [^>]*>", html)
    assert pres and all('dir="auto"' in pre for pre in pres)
    assert len(pres) == (1 if preview(text) is None else 2)


# The evidence tab's cost rows as templates/console/run/evidence.html wrote them.
COSTS_TEMPLATE = """{% load console_format %}<tbody>{% for c in costs %}
      <tr><td class="num">{{ c.sequence }}</td><td class="mono">{{ c.provider|shown_name }}/{{ c.modelId|shown_name }}</td><td class="mono">{{ c.stepPath|default:""|shown_name }}</td>
        <td class="num">{{ c.inputTokens|count }}</td><td class="num">{{ c.outputTokens|count }}</td><td class="num">{{ c.cachedInputTokens|count }}</td><td class="num">{{ c.reasoningTokens|count }}</td>
        <td>{{ c.costUsd|call_cost:c.unpricedReason }}</td><td class="mono muted">{{ c.priceTableVersion }}</td></tr>
    {% endfor %}</tbody>"""


def test_every_cost_row_of_the_demo_runs_is_the_templates_row() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    costs = [serialize.cost(c) for c in CostEntry.objects.order_by("pk")]
    made = {
        **costs[0],
        "provider": None,
        "modelId": "m<1>\u202e",
        "stepPath": None,
        "inputTokens": None,
        "costUsd": None,
        "unpricedReason": "usage_not_reported",
        "priceTableVersion": None,
    }
    priced = {**costs[0], "stepPath": 'a/"b"&c', "costUsd": "0.000123", "unpricedReason": None}
    costs += [made, priced]
    assert {c["unpricedReason"] is None for c in costs} == {True, False}
    page = engines["django"].from_string("{% load console_format %}<tbody>{% cost_rows costs %}</tbody>")
    reference = engines["django"].from_string(COSTS_TEMPLATE)
    assert page.render({"costs": costs}) == reference.render({"costs": costs})
    assert page.render({"costs": []}) == reference.render({"costs": []})


# The state tab's steps as templates/console/run/state.html wrote them.
STATE_STEPS_TEMPLATE = """{% load console_format %}{% for s in steps %}<tr data-step="{{ s.step_path|kept_value }}"><td class="mono">{{ s.step_path|shown_name }}</td>
      <td><span class="status status-{{ s.status }}">{{ s.status }}</span></td><td class="num">{{ s.attempts|length }}</td>
      <td>{{ s.usage.cost_usd|money }}</td></tr>{% endfor %}"""


def test_the_state_tabs_steps_at_every_event_of_the_demo_runs_are_the_templates_rows() -> None:
    load_demo(history_runs=1, evaluations_too=False)
    reference = engines["django"].from_string(STATE_STEPS_TEMPLATE)
    statuses: set[str] = set()
    for run in Run.objects.select_related("workspace__tenant").exclude(last_sequence=0):
        for at in range(1, run.last_sequence + 1):
            shown = state_after(run, at)
            assert shown["steps_rows"] == reference.render({"steps": shown["steps"]})
            statuses.update(s.status for s in shown["steps"])
    assert {"running", "completed", "failed"} <= statuses
    weird = StepState(step_path='a/"<b>"&\u202e', status="failed<x>")
    assert render_steps([weird]) == reference.render({"steps": [weird]})


# The steps tables' rows as templates/console/run/steps.html and costs.html wrote them.
STEPS_TEMPLATE = """{% load console_format %}    {% for s in steps %}
      <tr class="step" data-step="{{ s.path|kept_value }}">
        <td class="mono">{{ s.path|shown_name }}</td>
        <td><span class="status status-{{ s.status }}">{{ s.status }}</span></td>
        <td class="num">{{ s.attempts|count }}</td>
        <td class="num">{{ s.visit|default_if_none:"" }}</td>
        <td>{{ s.step|elapsed }}</td>
        <td class="num">{{ s.tokens.input|count }}</td><td class="num">{{ s.tokens.output|count }}</td>
        <td class="num">{{ s.tokens.cached|count }}</td><td class="num">{{ s.tokens.reasoning|count }}</td>
        <td>{{ s.step.cost_usd|money }} <span class="muted">{{ s.step|coverage }}</span></td>
        <td class="step-output">{% if s.output_line %}{% if s.output_line == s.output_text %}<span class="mono">{{ s.output_line|shown_text }}</span>{% else %}<details><summary class="mono">{{ s.output_line|shown_text }}</summary>{% long_text s.output_text %}</details>{% endif %}{% elif s.step.output_ref %}<span class="mono muted">{{ s.step.output_ref|shown_name }}</span>{% else %}<span class="muted">—</span>{% endif %}</td>
        <td class="step-error">{% if s.error_line %}<span class="failure">{{ s.error_line|shown_text }}</span>{% endif %}</td>
        <td class="should-run">{% if s.should_run %}<strong>yes</strong> (would run){% else %}no (reused){% endif %}</td>
      </tr>
    {% endfor %}
"""
STEP_COSTS_TEMPLATE = """{% load console_format %}<tbody>{% for s in steps %}
      <tr><td class="mono">{{ s.path|shown_name }}</td><td class="num">{{ s.tokens.input|count }}</td><td class="num">{{ s.tokens.output|count }}</td>
        <td class="num">{{ s.tokens.cached|count }}</td><td class="num">{{ s.tokens.reasoning|count }}</td><td>{{ s.step.cost_usd|money }}</td><td>{{ s.step|coverage }}</td></tr>
    {% endfor %}</tbody>"""


def test_the_steps_and_per_step_costs_of_the_demo_runs_are_the_templates_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    load_demo(history_runs=1, evaluations_too=False)
    now = clock.now()  # a running step's time so far reads the clock: the same for both renderings
    monkeypatch.setattr("ledger.clock.now", lambda: now)
    rows: list[dict[str, Any]] = []
    for run in Run.objects.select_related("workspace__tenant").exclude(last_sequence=0):
        rows += share._steps(run)["steps"]  # a share link's rows (no output or error line)
    step = Step.objects.filter(output_ref="").exclude(cost_usd=None).first()
    assert step is not None
    long = "line <1>\n" * 400
    rows += [  # the steps tab's rows (console/pages/run.py), with an output and an error line
        {**rows[0], "step": step, "output_line": "ok\u202e", "output_text": "ok\u202e", "error_line": "", "visit": 2},
        {**rows[0], "step": step, "output_line": "line <1> …", "output_text": long, "error_line": 'E: "<x>"\u200b'},
        {**rows[0], "path": 'a/"<b>"\u202e', "status": "failed", "should_run": False, "visit": None},
    ]
    assert {r["should_run"] for r in rows} == {True, False}
    for template, tag in ((STEPS_TEMPLATE, "step_rows"), (STEP_COSTS_TEMPLATE, "step_cost_rows")):
        mine = engines["django"].from_string(f"{{% load console_format %}}{{% {tag} steps %}}")
        reference = engines["django"].from_string(template)
        for shown in (rows, []):
            expected = reference.render({"steps": shown})
            if tag == "step_rows":  # the loop's own indentation and line end, around the tag
                assert f"    {mine.render({'steps': shown})}\n" == expected
            else:
                assert f"<tbody>{mine.render({'steps': shown})}</tbody>" == expected
