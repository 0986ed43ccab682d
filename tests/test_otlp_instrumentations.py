"""OpenTelemetry as users send it (docs/otlp.md): the real `openai` SDK, instrumented by
opentelemetry-instrumentation-openai-v2 or openinference-instrumentation-openai, talks to a local
fake OpenAI server and exports with the SDK's OTLP/HTTP exporter, configured by the environment
alone, to a live Daphne. What the console and the API then show is what the spans said: the
prompts in the conversation, a dated model priced, tokens, the span times as durations; and, when
content was not captured, nothing invented in its place."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import date, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from ledger.interop.otlp.ingest import iso_time
from ledger.log import artifacts
from ledger.log.verify import verify_run
from ledger.models import CostEntry, Run, Step, Workspace
from ledger.reads import selectors, usage
from ledger.tenancy.services import create_key
from tests.fake_providers import OPENAI_MODEL, FakeProviders
from tests.servers import REPO_ROOT, Daphne

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def openai_server() -> Iterator[FakeProviders]:
    fake = FakeProviders().start()
    yield fake
    fake.stop()


def documented_environment(instrumentation: str) -> dict[str, str]:
    """The content-capture block docs/otlp.md gives for `instrumentation`, as an environment."""
    text = (REPO_ROOT / "docs" / "otlp.md").read_text()
    block = re.search(rf"```sh\n# content capture: {re.escape(instrumentation)}\n(.*?)```", text, re.S)
    assert block, f"docs/otlp.md has no content-capture block for {instrumentation}"
    return dict(line.split("=", 1) for line in block[1].splitlines() if line and not line.startswith("#"))


def run_agent(
    convention: str,
    server: Daphne,
    workspace: Workspace,
    openai_server: FakeProviders,
    env: dict[str, str],
    streaming: str | None = None,
) -> list[dict[str, Any]]:
    """tests/otel_agent.py in its own process (its chat calls streamed as `streaming` says),
    exporting to the live server; the spans it recorded."""
    key = create_key(workspace=workspace, scopes=["ingest"])[1]
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENINFERENCE_", "DJANGO_", "DATABASE_"))
    }
    environment.update(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{server.url}/api/v1/otlp/v1/traces",
        OTEL_EXPORTER_OTLP_TRACES_HEADERS=f"Authorization=Bearer%20{key}",
        OTEL_SERVICE_NAME="weather-agent",
        **env,
    )
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).with_name("otel_agent.py")),
            convention,
            openai_server.url,
            *([streaming] if streaming else []),
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "Failed to export" not in done.stderr, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run_of(workspace: Workspace, spans: list[dict[str, Any]]) -> Run:
    return Run.objects.get(workspace=workspace, run_id=f"run_otel_{spans[0]['traceId']}")


def _span(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(s for s in spans if s["name"] == name)


def _conversation(browser: Client, run: Run) -> str:
    ws = run.workspace
    page = browser.get(reverse("run-tab", args=[ws.tenant.slug, ws.slug, run.run_id, "conversation"]))
    assert page.status_code == 200
    return page.content.decode()


def _at(nanos: int) -> datetime:
    return datetime.fromisoformat(iso_time(nanos))


def test_openai_v2_instrumentation_with_the_documented_environment(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client, outsider: User
) -> None:
    spans = run_agent(
        "genai",
        server,
        workspace,
        openai_server,
        documented_environment("opentelemetry-instrumentation-openai-v2"),
    )
    run = _run_of(workspace, spans)
    assert run.status == "completed" and run.workflow_version_id == "otel:weather-agent"
    # Durations are the spans': the run is the request span, the step the agent span.
    root, agent = _span(spans, "handle request"), next(s for s in spans if s["name"].startswith("invoke_agent"))
    assert (run.started_at, run.finished_at) == (_at(root["start"]), _at(root["end"]))
    step = Step.objects.get(run=run, step_path=f"span-{agent['spanId']}")
    assert (step.started_at, step.finished_at) == (_at(agent["start"]), _at(agent["end"]))
    assert run.finished_at > run.started_at

    # The dated model the service answered with is priced, its tokens counted.
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.provider, c.model_id, c.input_tokens, c.output_tokens) for c in costs] == [
        ("openai", OPENAI_MODEL, 120, 30)
    ] * 2
    assert all(c.cost_usd is not None and c.cost_usd > 0 for c in costs)
    assert run.unpriced_calls == 0 and run.cost_usd == sum(c.cost_usd for c in costs)

    # The tool span's captured content, and the prompts in the conversation.
    started = next(e for e in selectors.events(run) if e["type"] == "harness.tool_call.started")
    assert started["payload"]["args"] == {"city": "Paris"} and started["payload"]["toolName"] == "get_weather"
    page = _conversation(browser, run)
    for text in ("You are a terse weather agent.", "Weather in Paris?", "21 °C and sunny in Paris.", "get_weather"):
        assert text in page
    assert all(check.status == "pass" for check in verify_run(run))

    # Another tenant's member does not see it.
    browser.force_login(outsider)
    ws = run.workspace
    assert (
        browser.get(reverse("run-tab", args=[ws.tenant.slug, ws.slug, run.run_id, "conversation"])).status_code == 404
    )


@pytest.mark.parametrize(
    "env",
    [{}, {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}],
    ids=["no capture", "capture=true, which these versions ignore"],
)
def test_content_not_captured_stays_absent(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client, env: dict[str, str]
) -> None:
    spans = run_agent("genai", server, workspace, openai_server, env)
    run = _run_of(workspace, spans)
    events = selectors.events(run)
    tool_started = next(e["payload"] for e in events if e["type"] == "harness.tool_call.started")
    tool_ended = next(e["payload"] for e in events if e["type"] == "harness.tool_call.succeeded")
    assert "args" not in tool_started and "result" not in tool_ended
    called = [e["payload"]["request"] for e in events if e["type"] == "harness.model.called"]
    assert called and all("messages" not in request for request in called)
    assert all(c.cost_usd is not None for c in CostEntry.objects.filter(run=run))  # tokens still priced

    key = create_key(workspace=workspace, scopes=["read"])[1]
    exported = httpx.get(
        f"{server.url}/api/v1/runs/{run.run_id}/otlp", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    tool = next(
        s for s in exported["resourceSpans"][0]["scopeSpans"][0]["spans"] if s["name"].startswith("execute_tool")
    )
    names = {a["key"] for a in tool["attributes"]}
    assert "gen_ai.tool.call.arguments" not in names and "gen_ai.tool.call.result" not in names
    assert "(not recorded)" in _conversation(browser, run)


def test_openinference_instrumentation(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client
) -> None:
    spans = run_agent(
        "openinference",
        server,
        workspace,
        openai_server,
        documented_environment("openinference-instrumentation-openai"),
    )
    run = _run_of(workspace, spans)
    assert run.status == "completed"
    types = [e["type"] for e in selectors.events(run)]
    assert "custom.otel.span" not in types
    assert types.count("harness.model.responded") == 2 and types.count("harness.tool_call.succeeded") == 1

    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.provider, c.model_id, c.input_tokens, c.output_tokens, c.cached_input_tokens) for c in costs] == [
        ("openai", OPENAI_MODEL, 120, 30, 20)
    ] * 2
    assert all(c.cost_usd is not None and c.cost_usd > 0 for c in costs)

    agent = _span(spans, "weather")  # @tracer.agent: a step, with the calls under it
    assert Step.objects.filter(run=run, step_path=f"span-{agent['spanId']}", status="completed").exists()
    tool = next(e["payload"] for e in selectors.events(run) if e["type"] == "harness.tool_call.started")
    assert tool["toolName"] == "get_weather" and tool["args"] == {"city": "Paris"}
    root = _span(spans, "handle request")
    assert (run.started_at, run.finished_at) == (_at(root["start"]), _at(root["end"]))

    page = _conversation(browser, run)
    for text in ("You are a terse weather agent.", "Weather in Paris?", "21 °C and sunny in Paris.", "get_weather"):
        assert text in page
    assert all(check.status == "pass" for check in verify_run(run))


def test_openinference_content_hidden_stays_absent(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client
) -> None:
    hidden = {"OPENINFERENCE_HIDE_INPUTS": "true", "OPENINFERENCE_HIDE_OUTPUTS": "true"}
    run = _run_of(workspace, run_agent("openinference", server, workspace, openai_server, hidden))
    events = selectors.events(run)
    tool_started = next(e["payload"] for e in events if e["type"] == "harness.tool_call.started")
    tool_ended = next(e["payload"] for e in events if e["type"] == "harness.tool_call.succeeded")
    assert "args" not in tool_started and "result" not in tool_ended  # not OpenInference's "__REDACTED__"
    assert "__REDACTED__" not in _conversation(browser, run)
    assert all(c.cost_usd is not None for c in CostEntry.objects.filter(run=run))  # tokens still counted


@pytest.mark.parametrize("convention", ["genai", "openinference"])
def test_a_stream_without_include_usage_is_unpriced_not_free(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client, convention: str
) -> None:
    """The openai SDK streaming without `stream_options={"include_usage": True}`: the service sends
    no usage, the instrumentation's span carries no token counts, and the ledger cannot know what
    the calls cost. They count unpriced, "usage not reported", never as priced $0."""
    instrumentation = {
        "genai": "opentelemetry-instrumentation-openai-v2",
        "openinference": "openinference-instrumentation-openai",
    }
    spans = run_agent(
        convention, server, workspace, openai_server, documented_environment(instrumentation[convention]), "stream"
    )
    assert all(r.get("stream") is True and "stream_options" not in r for r in openai_server.requests)
    run = _run_of(workspace, spans)
    assert run.status == "completed"
    responded = [e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded"]
    assert len(responded) == 2 and all(r["response"]["usage"] == {} for r in responded)
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.model_id, c.input_tokens, c.output_tokens, c.cost_usd, c.usage_reported) for c in costs] == [
        (OPENAI_MODEL, 0, 0, None, False)
    ] * 2
    assert (run.cost_usd, run.priced_calls, run.unpriced_calls) == (None, 0, 2)
    assert all(check.status == "pass" for check in verify_run(run))

    key = create_key(workspace=workspace, scopes=["read"])[1]
    evidence = httpx.get(
        f"{server.url}/api/v1/runs/{run.run_id}/evidence", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    assert [c["unpricedReason"] for c in evidence["costs"]] == ["usage_not_reported"] * 2
    assert evidence["run"]["usage"]["unpricedCalls"] == 2 and evidence["run"]["usage"]["costUsd"] is None
    page = _conversation(browser, run)
    assert page.count('<span class="usage">usage not reported</span>') == 2 and "21 °C and sunny in Paris." in page


@pytest.mark.parametrize(
    ("convention", "failure", "error"),
    [
        ("genai", "http-500", "openai.InternalServerError"),
        ("genai", "hang-up", "openai.APIConnectionError"),
        ("openinference", "http-500", "openai.InternalServerError"),
        ("openinference", "hang-up", "openai.APIConnectionError"),
    ],
)
def test_a_model_call_that_failed_after_its_request_left_is_unpriced_not_free(
    server: Daphne,
    workspace: Workspace,
    openai_server: FakeProviders,
    browser: Client,
    convention: str,
    failure: str,
    error: str,
) -> None:
    """The provider answered the agent's first call with an HTTP 500, or read it and hung up; the
    instrumentation ends that call's span with an error, and the agent asks again. The provider
    may bill the failed call: it is `requestLeft: true`, a call of unknown cost ("usage not
    reported", never $0) beside the two answered ones, which are priced (docs/otlp.md)."""
    openai_server.fail, openai_server.fail_times = failure, 1
    spans = run_agent(convention, server, workspace, openai_server, {}, "ask-again")
    assert len(openai_server.requests) == 3  # the failed call reached the provider
    run = _run_of(workspace, spans)
    assert run.status == "completed"
    failed = [e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.failed"]
    assert [(f["error"]["name"], f["requestLeft"], f["model"]["provider"]) for f in failed] == [(error, True, "openai")]
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.input_tokens, c.cost_usd is None, c.usage_reported) for c in costs] == [
        (0, True, False),
        (120, False, True),
        (120, False, True),
    ]
    assert (run.priced_calls, run.unpriced_calls) == (2, 1) and run.cost_usd == costs[1].cost_usd + costs[2].cost_usd
    assert all(check.status == "pass" for check in verify_run(run))
    key = create_key(workspace=workspace, scopes=["read"])[1]
    usage = httpx.get(
        f"{server.url}/api/v1/runs/{run.run_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()["usage"]
    assert (usage["pricedCalls"], usage["unpricedCalls"]) == (2, 1)


@pytest.mark.parametrize("convention", ["genai", "openinference"])
def test_a_stream_with_include_usage_is_priced(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, convention: str
) -> None:
    """The same agent asking for usage on its streams: the last chunk's counts reach the ledger."""
    spans = run_agent(convention, server, workspace, openai_server, {}, "stream-with-usage")
    assert all(r.get("stream_options") == {"include_usage": True} for r in openai_server.requests)
    run = _run_of(workspace, spans)
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.input_tokens, c.output_tokens, c.usage_reported) for c in costs] == [(120, 30, True)] * 2
    assert all(c.cost_usd is not None and c.cost_usd > 0 for c in costs)
    assert (run.priced_calls, run.unpriced_calls) == (2, 0)


def test_a_long_answer_is_priced_like_a_short_one(
    server: Daphne,
    workspace: Workspace,
    openai_server: FakeProviders,
    settings: Any,
    daphne_artifacts: Path,
) -> None:
    """An answer of ~2 MB: its payload passes the inline limit, so its text moves to an artifact;
    the usage stays in the event and the call is counted and priced as any other."""
    settings.ARTIFACTS_ROOT = daphne_artifacts  # where the server keeps them, for verify_run
    openai_server.answer = "All work and no play makes Jack a dull boy. ñ 漢字 🙂 " * 40_000
    spans = run_agent(
        "genai", server, workspace, openai_server, documented_environment("opentelemetry-instrumentation-openai-v2")
    )
    run = _run_of(workspace, spans)
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.input_tokens, c.output_tokens, c.usage_reported) for c in costs] == [(120, 30, True)] * 2
    assert all(c.cost_usd is not None and c.cost_usd > 0 for c in costs)
    assert (run.priced_calls, run.unpriced_calls) == (2, 0) and run.cost_usd == sum(c.cost_usd for c in costs)
    answered = [e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded"][-1]
    assert answered["response"]["usage"] == {"inputTokens": 120, "outputTokens": 30}
    assert "text" not in answered["response"] and answered["response"]["textRef"].startswith("artifact://art_")
    assert [c for c in verify_run(run) if c.status != "pass"] == []
    text = json.loads(artifacts.read_bytes(artifacts.get_by_ref(workspace, answered["response"]["textRef"])))
    assert text == openai_server.answer


@pytest.mark.parametrize("convention", ["genai", "openinference"])
def test_an_answer_of_two_choices_reads_as_its_first_not_both_run_together(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client, convention: str
) -> None:
    """A best-of-n agent asks for two choices (`n=2`): both instrumentations record one output
    message per choice. The call's text and tool calls are the first choice's, as the client's
    wrappers read them; both choices stay in `response.messages`, never glued into one text, and the
    conversation tab shows each, labelled "choice 1/2", "choice 2/2"."""
    instrumentation = {
        "genai": "opentelemetry-instrumentation-openai-v2",
        "openinference": "openinference-instrumentation-openai",
    }[convention]
    spans = run_agent(
        convention, server, workspace, openai_server, documented_environment(instrumentation), "two-choices"
    )
    assert openai_server.requests[-1]["n"] == 2
    run = _run_of(workspace, spans)
    answered = [e["payload"]["response"] for e in selectors.events(run) if e["type"] == "harness.model.responded"][-1]
    assert answered["text"] == openai_server.answer and "toolCalls" not in answered
    texts = [part["content"] for message in answered["messages"] for part in message["parts"]]
    assert texts == [openai_server.answer, f"{openai_server.answer} (candidate 2)"]
    page = _conversation(browser, run)
    assert f"{openai_server.answer}{openai_server.answer}" not in page and openai_server.answer in page
    # The conversation shows each choice apart, labelled.
    second = page.split("response · choice 2/2</span>", 1)[1]
    assert "response · choice 1/2</span>" in page and f"{openai_server.answer} (candidate 2)" in second
    assert all(check.status == "pass" for check in verify_run(run))


@pytest.mark.parametrize("convention", ["genai", "openinference"])
def test_model_calls_exported_after_the_root_span_count_in_the_run_cost(
    server: Daphne, workspace: Workspace, openai_server: FakeProviders, browser: Client, convention: str
) -> None:
    """The request span is another service's, sent as it ends; the agent's spans wait in a
    BatchSpanProcessor flushed after it, so its two model calls reach the ledger after the run ended.
    They were made and billed: they count in the run's cost, tokens and the usage rollups (the
    workspace report and the tenant's), the run stays completed at the root span's end, and the
    conversation shows them as late calls. The late tool and agent spans are kept as spans."""
    instrumentation = {
        "genai": "opentelemetry-instrumentation-openai-v2",
        "openinference": "openinference-instrumentation-openai",
    }[convention]
    spans = run_agent(convention, server, workspace, openai_server, documented_environment(instrumentation), "late")
    run = _run_of(workspace, spans)
    events = selectors.events(run)
    ended = next(i for i, e in enumerate(events) if e["type"] == "RunCompleted")
    after = events[ended + 1 :]
    assert [e["type"] for e in after if e["type"].startswith("harness.")] == [
        "harness.model.called",
        "harness.model.responded",
    ] * 2
    assert all(e["payload"]["late"] is True for e in after)

    root = _span(spans, "handle request")
    assert run.status == "completed" and run.finished_at == _at(root["end"])
    costs = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    assert [(c.provider, c.model_id, c.input_tokens, c.output_tokens) for c in costs] == [
        ("openai", OPENAI_MODEL, 120, 30)
    ] * 2
    assert all(c.cost_usd is not None and c.cost_usd > 0 for c in costs)
    assert (run.priced_calls, run.unpriced_calls) == (2, 0)
    assert (run.input_tokens, run.output_tokens) == (240, 60) and run.cost_usd == sum(c.cost_usd for c in costs)

    day = run.finished_at.date()
    for scope in ({"workspace": workspace}, {"tenant": workspace.tenant}):
        total = usage.report(start=day, end=date.today(), **scope).total  # type: ignore[arg-type]
        assert (total.priced_calls, total.unpriced_calls, total.cost_usd) == (2, 0, run.cost_usd)

    key = create_key(workspace=workspace, scopes=["read"])[1]
    answer = httpx.get(
        f"{server.url}/api/v1/runs/{run.run_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    assert answer["status"] == "completed"
    assert (answer["usage"]["pricedCalls"], answer["usage"]["inputTokens"]) == (2, 240)

    page = _conversation(browser, run)
    assert "Weather in Paris?" in page and page.count("late call") == 2
    ws = run.workspace
    timeline = browser.get(reverse("run", args=[ws.tenant.slug, ws.slug, run.run_id])).content.decode()
    assert timeline.count("late call, after the run ended · turn") == 4  # each call asked, then answered
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)
