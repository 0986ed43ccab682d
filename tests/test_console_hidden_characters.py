"""Run data a harness wrote with a bidi control or an invisible character in it — a label, a
workflow, a step path, a tool or model name, a call id, an error's name — reads in the console as
it is stored: each such character written out (`U+202E`), as the tenant's own names are
(console_format.shown_name), never raw, where it would reverse or hide what follows it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger import log
from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

RLO, LRI, PDI, LRM, ZWSP = "\u202e", "\u2066", "\u2069", "\u200e", "\u200b"
HIDDEN = re.compile("[\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
RUN = "run_bidi"
CHILD = "run_bidi_child"
LABEL = f"refund {RLO}gpj.exe"
WORKFLOW = f"wfver_{LRI}pay{PDI}"
STEP = f"charge{RLO}dnuf"
TOOL = f"send{ZWSP}_money"
CALL = f"call{LRM}1"
MODEL = {"provider": f"open{RLO}ai", "modelId": "gpt-4o-mini"}


def _written(text: str) -> str:
    """`text` as the console writes it: each hidden character as its code point, marked."""
    return HIDDEN.sub(lambda m: f'<span class="hidden-char">U+{ord(m.group()):04X}</span>', text)


def _shown(html: str) -> str:
    """What a page shows as its names: without the payloads' JSON and long texts (`<pre>`, read as
    data) and without the attributes (an address, a data-step), which are not shown."""
    html = re.sub(r"<pre\b.*?</pre>", "", html, flags=re.S)
    html = re.sub(r"<textarea\b.*?</textarea>", "", html, flags=re.S)
    return re.sub(r'\s[\w:.-]+="[^"]*"', "", html)


@pytest.fixture
def bidi_run(workspace: Workspace) -> str:
    log.append(
        workspace=workspace,
        run_id=RUN,
        events=[
            started(WORKFLOW, label=LABEL),
            ev("StepScheduled", stepPath=STEP),
            ev("StepAttemptStarted", stepPath=STEP, attempt=1),
            ev("harness.session.started", stepPath=STEP, role="payer", task="pay", manifest={}, manifestHash="h"),
            ev("harness.model.called", stepPath=STEP, turn=1, callId="m1", promptHash="p", request={}),
            ev(
                "harness.model.responded",
                stepPath=STEP,
                turn=1,
                callId="m1",
                model=MODEL,
                response={"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 2}},
            ),
            ev("harness.tool_call.started", stepPath=STEP, callId=CALL, toolName=TOOL, caller="model", args={}),
            ev("harness.tool_call.succeeded", stepPath=STEP, callId=CALL, result={"ok": True}, durationMs=5),
            ev("harness.session.completed", stepPath=STEP),
            ev("StepCompleted", stepPath=STEP, attempt=1, output="done"),
            ev("RunFailed", error={"name": f"Refund{RLO}Error", "message": f"no {RLO}money\nat line 2"}),
        ],
    )
    log.append(workspace=workspace, run_id=CHILD, events=[started(WORKFLOW, parentRunId=RUN, label=LABEL)])
    return RUN


def _page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, path
    return response.content.decode()


def test_the_runs_list_writes_out_hidden_characters_in_labels_and_workflows(
    client: Client, viewer: User, bidi_run: str
) -> None:
    client.force_login(viewer)
    html = _page(client, "/w/acme/support/")
    row = re.search(rf'<tr class="run" data-run-id="{RUN}".*?</tr>', html, re.S)
    assert row, "the run is listed"
    assert f'<span class="label">{_written(LABEL)}</span>' in row.group(0)
    assert f'<td class="mono workflow" data-label="Workflow">{_written(WORKFLOW)}</td>' in row.group(0)
    assert _written("Refund\u202eError") in row.group(0)
    assert _written("no \u202emoney\nat line 2") in row.group(0)  # a line break stays a space on the page
    assert not HIDDEN.search(_shown(html))


@pytest.mark.parametrize(
    "tab", ["timeline", "steps", "costs", "conversation", "evidence", "state", "waterfall", "subruns"]
)
def test_the_run_header_and_tabs_write_out_hidden_characters(
    client: Client, viewer: User, bidi_run: str, tab: str
) -> None:
    client.force_login(viewer)
    html = _page(client, f"/w/acme/support/runs/{RUN}/{tab}/")
    shown = _shown(html)
    assert not HIDDEN.search(shown), HIDDEN.search(shown) and shown[HIDDEN.search(shown).start() - 200 :][:300]
    header = re.search(r'<header class="run-head".*?</header>', html, re.S).group(0)
    assert f'<dd class="mono">{_written(WORKFLOW)}</dd>' in header
    assert _written("Refund\u202eError") in header
    expected = {
        "timeline": [_written(STEP), _written(f"run started: {WORKFLOW} · {LABEL}"), _written(f"tool {TOOL} {CALL}")],
        "steps": [f'<td class="mono">{_written(STEP)}</td>'],
        "costs": [f'<td class="mono">{_written(STEP)}</td>', _written(f"{MODEL['provider']}/gpt-4o-mini")],
        "conversation": [_written(STEP), _written(TOOL), _written(CALL), _written(MODEL["provider"])],
        "evidence": [f'<td class="mono">{_written(CALL)}</td>', f'<td class="mono">{_written(TOOL)}</td>'],
        "state": [_written(STEP), _written(TOOL)],
        "waterfall": [_written(STEP), _written(TOOL)],
        "subruns": [_written(WORKFLOW)],
    }[tab]
    for written in expected:
        assert written in html, (tab, written)


def test_a_name_without_hidden_characters_is_left_as_it_is(client: Client, viewer: User, workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_plain", events=[started("wfver_plain", label="nightly <b>")])
    client.force_login(viewer)
    html = _page(client, "/w/acme/support/")
    assert '<span class="label">nightly &lt;b&gt;</span>' in html
    assert "hidden-char" not in html


def test_another_tenant_gets_404_for_such_a_run(client: Client, outsider: User, bidi_run: str) -> None:
    client.force_login(outsider)
    assert client.get(f"/w/acme/support/runs/{RUN}/").status_code == 404
