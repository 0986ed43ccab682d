"""Run data a harness wrote with a bidi control or an invisible character in it — a label, a
workflow, a step path, a tool or model name, a call id, an error's name — reads in the console as
it is stored: each such character written out (`U+202E`), as the tenant's own names are
(console_format.shown_name), never raw, where it would reverse or hide what follows it. So does
what a member wrote (a username, a note, a comment), and so do the places that can hold no markup
(a tooltip, an option, a form's value: console_format.shown_attr and kept_value), which the crawl
at the end checks on every page."""

from __future__ import annotations

import re
import unicodedata
from collections import deque
from html import unescape
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.html import escape

from ledger import limits, log
from ledger.evaluation import datasets
from ledger.models import ApiKey, ReexecutionRequest, Run, Tenant, Workspace
from ledger.reexecution import services
from ledger.replay.feedback import record_feedback
from ledger.runtime.outer_loop import start_outer_loop
from ledger.tenancy.services import create_key
from ledger.tenancy.sharing import create_link
from tests.conftest import ev, named_user, started
from tests.loop_workflows import reset_loop_registrations

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
            ev(
                "harness.tool_call.started",
                stepPath=STEP,
                callId=CALL,
                toolName=TOOL,
                caller="model",
                args={"to": f"ann{RLO}moc.elpmaxe", "note": f"{ZWSP}"},
            ),
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


# --- payloads in <pre>: each hidden character kept (a copy is the data) but marked ---------------

MARKED = re.compile(r'<span class="hidden-char" data-code="U\+([0-9A-F]{4,6})">(.)</span>', re.S)


def _pres(html: str) -> list[str]:
    return re.findall(r"<pre\b[^>]*>(.*?)</pre>", html, flags=re.S)


def _all_marked(html: str) -> list[str]:
    """The hidden characters of the page's `<pre>` blocks, each checked to sit alone in a marked span
    naming its own code point; none may be left bare."""
    found = []
    for pre in _pres(html):
        for code, ch in MARKED.findall(pre):
            assert f"{ord(ch):04X}" == code
            found.append(ch)
        assert not HIDDEN.search(MARKED.sub("", pre)), pre
    return found


def test_payloads_in_pre_blocks_keep_each_hidden_character_inside_a_marked_span(
    client: Client, viewer: User, bidi_run: str
) -> None:
    client.force_login(viewer)
    timeline = _page(client, f"/w/acme/support/runs/{RUN}/timeline/")
    assert RLO in _all_marked(timeline) and LRI in _all_marked(timeline)
    assert f'<span class="hidden-char" data-code="U+202E">{RLO}</span>gpj.exe' in timeline
    for tab in ("conversation", "evidence", "steps", "waterfall"):
        _all_marked(_page(client, f"/w/acme/support/runs/{RUN}/{tab}/"))
    evidence = _page(client, f"/w/acme/support/runs/{RUN}/evidence/")
    assert ZWSP in _all_marked(evidence), "the tool's arguments"


def test_a_payload_without_hidden_characters_is_left_as_it_is(
    client: Client, viewer: User, workspace: Workspace
) -> None:
    log.append(workspace=workspace, run_id="run_plain", events=[started("wfver_plain", label="a\tb <c>\n")])
    client.force_login(viewer)
    html = _page(client, "/w/acme/support/runs/run_plain/timeline/")
    assert "hidden-char" not in html
    assert any(escape('"label": "a\\tb <c>\\n"') in pre for pre in _pres(html)), "the JSON as it was, escaped"


# --- the Approvals page, the outer loops, an evaluation's dataset, the audit log -------------------

WAITING = "run_bidi_waiting"
REASON = f"try {RLO}niaga"


@pytest.fixture
def waiting(workspace: Workspace, bidi_run: str, operator: User) -> ReexecutionRequest:
    """A tool call of the log waiting for an approver, and a fork of the run asked for, both with
    hidden characters in what a harness or a requester wrote."""
    log.append(
        workspace=workspace,
        run_id=WAITING,
        events=[
            started(WORKFLOW, label=LABEL),
            ev("StepScheduled", stepPath=STEP),
            ev("StepAttemptStarted", stepPath=STEP, attempt=1),
            ev(
                "harness.tool_call.approval_requested",
                stepPath=STEP,
                callId=CALL,
                toolName=TOOL,
                args={"to": f"ann{RLO}moc.elpmaxe"},
                argsDigest="sha256:x",
            ),
        ],
    )
    return services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="fork", from_step=STEP, reason=REASON, by=operator
    )


def test_the_approvals_page_writes_out_hidden_characters(
    client: Client, approver: User, waiting: ReexecutionRequest
) -> None:
    client.force_login(approver)
    html = _page(client, "/w/acme/support/approvals/")
    shown = _shown(html)
    assert not HIDDEN.search(shown), shown[HIDDEN.search(shown).start() - 200 :][:300]
    card = re.search(
        rf'<article class="request pending tool-call-approval".*?data-run="{WAITING}".*?</article>', html, re.S
    )
    assert card, "the waiting call has its card"
    assert (
        f'<strong class="mono">{_written(TOOL)}</strong> in <span class="mono">{_written(STEP)}</span>' in card.group(0)
    )
    assert f'<dd class="mono">{_written(CALL)}</dd>' in card.group(0)
    assert RLO in _all_marked(card.group(0)), "the arguments, marked in place"
    request = re.search(r'<article class="request pending" id="rx-.*?</article>', html, re.S).group(0)
    assert f'from <span class="mono">{_written(STEP)}</span>' in request
    assert f"Reason:</span> {_written(REASON)}" in request
    assert f'<td class="mono">{_written(STEP)}</td>' in request, "the plan's steps"


def test_the_approvals_page_is_a_404_for_another_tenant(
    client: Client, outsider: User, waiting: ReexecutionRequest
) -> None:
    client.force_login(outsider)
    assert client.get("/w/acme/support/approvals/").status_code == 404


def test_the_audit_log_writes_out_hidden_characters_in_reasons(
    client: Client, admin: User, waiting: ReexecutionRequest
) -> None:
    client.force_login(admin)
    html = _page(client, "/t/acme/audit/")
    assert _written(REASON) in html
    shown = _shown(html)
    assert not HIDDEN.search(shown), shown[HIDDEN.search(shown).start() - 200 :][:300]


GOAL = f"a tight {RLO}hpargarap"


@pytest.fixture
def loop(workspace: Workspace) -> Any:
    reset_loop_registrations()
    return start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input={"topic": f"tides{LRI}"},
        goal=GOAL,
        max_cycles=4,
        supervise="rt_until_third",
        outer_loop_id="ol_bidi",
    )


def test_the_loop_pages_write_out_hidden_characters(client: Client, viewer: User, loop: Any) -> None:
    client.force_login(viewer)
    page = _page(client, "/w/acme/support/loops/ol_bidi/")
    assert f'<dd id="loop-goal">{_written(GOAL)}</dd>' in page
    for html in (page, _page(client, "/w/acme/support/loops/")):
        shown = _shown(html)
        assert not HIDDEN.search(shown), shown[HIDDEN.search(shown).start() - 200 :][:300]


def test_the_loop_page_is_a_404_for_another_tenant(client: Client, outsider: User, loop: Any) -> None:
    client.force_login(outsider)
    assert client.get("/w/acme/support/loops/ol_bidi/").status_code == 404


def test_a_dataset_writes_out_hidden_characters_in_expected_outputs(
    client: Client, viewer: User, admin: User, workspace: Workspace
) -> None:
    output = {"reply": f"refund {RLO}gpj.exe"}
    log.append(
        workspace=workspace,
        run_id="run_done",
        events=[started(WORKFLOW, label=LABEL), ev("RunCompleted", output=output)],
    )
    datasets.add_runs(workspace=workspace, name="bidi", run_ids=["run_done"], by=admin)
    client.force_login(viewer)
    for path in ("/w/acme/support/evaluations/", "/w/acme/support/datasets/bidi/"):
        shown = _shown(_page(client, path))
        assert not HIDDEN.search(shown), (path, shown[HIDDEN.search(shown).start() - 200 :][:300])
    assert _written(escape('{"reply": "refund \u202egpj.exe"}')) in _page(client, "/w/acme/support/datasets/bidi/")
    client.force_login(admin)
    assert client.get("/w/acme/support/datasets/bidi/").status_code == 200


# --- every page: no hidden character reaches the HTML bare, attributes included -------------------

BARE = re.compile("[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
HREF = re.compile(r'<a\b[^>]*?\bhref="([^"#]*)|\bhx-get="([^"#]*)')
NOT_PAGES = ("/static/", "/api/", "//")
MALLORY = f"mallory{RLO}nimda"


def _bare(html: str) -> list[str]:
    """Each hidden character of `html` left bare (outside the marked span that `shown_data` keeps
    one in, `<pre>` payloads), with what surrounds it, for the message."""
    rest = MARKED.sub("", html)
    return [rest[max(0, m.start() - 120) : m.end() + 40] for m in BARE.finditer(rest)]


@pytest.fixture
def hostile(workspace: Workspace, waiting: ReexecutionRequest, loop: Any, admin: User, operator: User) -> str:
    """What a client's harness and a hostile member can write, each with a bidi control or an
    invisible character: run data (waiting, loop, bidi_run), a member's username (and so the
    audit log's actor, a requester), the workspace's and tenant's names, a key's name, a dataset, a
    rating's category and comment, an approver's note, a failed step's message and a step's
    output. Returns the token of a share link to the run."""
    log.append(
        workspace=workspace,
        run_id="run_bidi_step_failed",
        events=[
            started(WORKFLOW, label=LABEL),
            ev("StepScheduled", stepPath=STEP),
            ev("StepAttemptStarted", stepPath=STEP, attempt=1),
            ev("StepCompleted", stepPath=STEP, attempt=1, output=f"paid {RLO}ot {ZWSP}ann"),
            ev("StepScheduled", stepPath=f"{STEP}2"),
            ev("StepAttemptStarted", stepPath=f"{STEP}2", attempt=1),
            ev("StepFailed", stepPath=f"{STEP}2", attempt=1, error={"name": f"Bad{LRI}", "message": f"boom {RLO}x"}),
            ev("RunFailed", error={"name": f"Bad{LRI}", "message": f"boom {RLO}x"}),
        ],
    )
    mallory = named_user("mallory", "operator")
    # A username stored before the user model's rules were checked (or by a custom user model).
    type(mallory).objects.filter(pk=mallory.pk).update(username=MALLORY)
    mallory.refresh_from_db()
    services.request_reexecution(workspace=workspace, run_id=RUN, mode="simulate", reason=f"again {RLO}won", by=mallory)
    record_feedback(
        run=Run.objects.get(workspace=workspace, run_id=RUN),
        rating=2,
        category=f"cat{RLO}",
        comment=f"bad {RLO}kcab",
        author=mallory,
    )
    key, _ = create_key(workspace=workspace, scopes=["read"], name="ci key", by=admin)
    ApiKey.objects.filter(pk=key.pk).update(name=f"ci {RLO}yek")
    datasets.add_runs(workspace=workspace, name="bidi", run_ids=[RUN], by=admin)
    services.deny(workspace=workspace, reexecution_id=waiting.public_id, by=admin, note=f"no {RLO}eton")
    Workspace.objects.filter(pk=workspace.pk).update(name=f"Support {RLO}ksed")
    Tenant.objects.filter(pk=workspace.tenant_id).update(name=f"Acme {LRI}corp")
    _, token = create_link(
        workspace=workspace, run=Run.objects.get(workspace=workspace, run_id=RUN), by=admin, expires_in_hours=1
    )
    return token


def _crawl_pages(client: Client, start: list[str]) -> dict[str, str]:
    """{page: its HTML} for every console page reached from `start`, following each link once per
    path and set of query parameters."""
    queue = deque(start)
    seen = {(urlsplit(p).path, ()) for p in start}
    pages = {}
    while queue:
        link = queue.popleft()
        response = client.get(link, follow=True)
        if not response.get("Content-Type", "").startswith("text/html"):
            continue
        html = response.content.decode()
        pages[link] = html
        for link_href, hx_get in HREF.findall(html):
            href = (link_href or hx_get).replace("&amp;", "&")
            if not href.startswith("/") or href.startswith(NOT_PAGES) or "/logout" in href:
                continue
            parts = urlsplit(href)
            query = parse_qsl(parts.query)
            # A link that carries a hidden character (a drill-down by a model's name) is followed
            # as well as the others of its kind: the page echoes it in its filters.
            kind = (parts.path, tuple(sorted({key for key, _ in query})), any(BARE.search(v) for _, v in query))
            if kind not in seen:
                seen.add(kind)
                queue.append(href)
    return pages


@pytest.mark.backend_independent  # what a page writes is its template's and view's; about 9 s
def test_no_page_holds_a_hidden_character_bare(client: Client, admin: User, hostile: str) -> None:
    client.force_login(admin)
    start = [
        f"/s/{hostile}/",
        "/",
        "/t/acme/audit/",
        "/w/acme/support/settings/",
        "/w/acme/support/settings/members/",
        "/w/acme/support/settings/prices/",
        "/w/acme/support/approvals/",
        "/w/acme/support/loops/",
        "/w/acme/support/evaluations/",
        "/w/acme/support/datasets/bidi/",
        f"/w/acme/support/runs/{RUN}/reexecute/",
        f"/w/acme/support/runs/{RUN}/share-links/",
        "/w/acme/support/runs/run_bidi_step_failed/steps/",
        "/w/acme/support/runs/run_bidi_step_failed/waterfall/",
    ]
    pages = _crawl_pages(client, start)
    assert len(pages) > 40
    assert any(BARE.search(unquote(page)) for page in pages), "a drill-down by a hostile model's name"
    bare = {page: found for page, html in pages.items() if (found := _bare(html))}
    assert bare == {}


def _attribute(html: str, pattern: str) -> str:
    found = re.search(pattern, html)
    assert found, pattern
    return found.group(1)


def test_shown_attributes_and_options_write_hidden_characters_out(client: Client, admin: User, hostile: str) -> None:
    """Where a page can hold no markup but shows the text (a tooltip, an `<option>`, a confirmation,
    the page's title), each hidden character is written out in brackets."""
    client.force_login(admin)
    runs = _page(client, "/w/acme/support/")
    assert 'title="Refund[U+202E]Error: no [U+202E]money\nat line 2"' in runs
    reexecute = _page(client, f"/w/acme/support/runs/{RUN}/reexecute/")
    assert '<option value="charge&#x202E;dnuf">charge[U+202E]dnuf</option>' in reexecute
    members = _page(client, "/w/acme/support/settings/members/")
    assert 'hx-confirm="Remove mallory[U+202E]nimda from acme?' in members
    assert f'<td class="member-name">{_written(MALLORY)}</td>' in members
    waterfall = _page(client, "/w/acme/support/runs/run_bidi_step_failed/waterfall/")
    assert f'title="step {STEP.replace(RLO, "[U+202E]")}2: ' in waterfall
    detail = _attribute(waterfall, r'hx-get="([^"]*)"[^>]*\n?[^>]*title="step charge\[U\+202E\]dnuf2')
    assert f'<p class="wf-error">{_written(f"Bad{LRI}: boom {RLO}x")}</p>' in _page(client, unescape(detail))
    steps = _page(client, "/w/acme/support/runs/run_bidi_step_failed/steps/")
    assert f'<span class="mono">{_written(f"paid {RLO}ot {ZWSP}ann")}</span>' in steps
    assert f'<span class="failure">{_written(f"Bad{LRI}: boom {RLO}x")}</span>' in steps


def test_values_a_page_hands_back_are_kept_exact(client: Client, admin: User, hostile: str) -> None:
    """A form's value and a `data-` attribute hold each hidden character as a character reference:
    none is bare in the page, and what the browser posts back is the value as stored (the member's
    role changes, by the username the page holds)."""
    client.force_login(admin)
    members = _page(client, "/w/acme/support/settings/members/")
    assert 'data-username="mallory&#x202E;nimda"' in members
    username = _attribute(members, r'<input type="hidden" name="username" value="(mallory[^"]*)">')
    assert unescape(username) == MALLORY
    client.post("/w/acme/support/settings/members/role/", {"username": unescape(username), "role": "viewer"})
    members = _page(client, "/w/acme/support/settings/members/")
    assert f'data-username="{username}" data-role="viewer"' in members
    # What a URL carries comes back in the filter's field the same way (Django's widgets, overridden).
    runs = _page(client, "/w/acme/support/?model=open%E2%80%AEai%2Fgpt-4o-mini")
    assert 'name="model" value="open&#x202E;ai/gpt-4o-mini"' in runs
    assert not _bare(runs)


@pytest.mark.parametrize(
    "text",
    ["", "plain ascii", "tab\tline\nreturn\r", "".join(map(chr, range(128))) * 2, "mixed \u202e\x07\n\u200b\x7f"],
)
def test_hidden_characters_of_ascii_text_are_those_of_the_category_lookup(text: str) -> None:
    """ASCII text is searched by one regular expression (the timeline asks it of every payload);
    the answer is the Unicode categories' answer, in order, each character once."""
    categories = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co"}
    found = dict.fromkeys(ch for ch in text if unicodedata.category(ch) in categories)
    assert limits.hidden_characters(text) == [f"U+{ord(ch):04X}" for ch in found]
