"""OpenTelemetry interop (docs/otlp.md), against a live Daphne: the real OpenTelemetry SDK's OTLP/HTTP
exporter sends GenAI spans to `POST /api/v1/otlp/v1/traces` and they become the run's events;
OTLP/JSON works too; a retried export writes nothing twice; bad input is refused with the log
untouched; and `GET /api/v1/runs/{runId}/otlp` gives spans that parse with opentelemetry-proto's
own JSON mapping and come back in as the same run."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db.models import Sum
from django.test import Client as DjangoClient
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from ledger.log.verify import verify_run
from ledger.models import AuditEntry, CostEntry, DailyUsage, Event, Run, Step, Workspace
from ledger.reads import selectors
from ledger.tenancy.services import create_key
from tests import readme
from tests.conftest import ev, started
from tests.otlp_support import any_value, json_span
from tests.otlp_support import attributes as _attributes
from tests.otlp_support import parse_otlp_json as _parse_otlp_json
from tests.servers import REPO_ROOT, Daphne, database_url, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

TRACES = "/api/v1/otlp/v1/traces"


def _key(workspace: Workspace, scopes: list[str]) -> str:
    return create_key(workspace=workspace, scopes=scopes)[1]


@pytest.fixture
def key(workspace: Workspace) -> str:
    return _key(workspace, ["ingest", "read"])


def _agent_trace(provider: TracerProvider, *, fail_tool: bool = False) -> str:
    """A GenAI agent as an instrumented harness records it: a request span holding an agent span
    holding two model calls with a tool call between them, and a database span. Returns the trace id."""
    tracer = provider.get_tracer("tests.agent", "1.0")
    with tracer.start_as_current_span("handle request") as root:
        with tracer.start_as_current_span(
            "invoke_agent weather",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "weather",
                "gen_ai.provider.name": "openai",
            },
        ):
            with tracer.start_as_current_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.response.model": "gpt-4o-2024-08-06",
                    "gen_ai.request.temperature": 0.2,
                    "gen_ai.usage.input_tokens": 120,
                    "gen_ai.usage.output_tokens": 30,
                    "gen_ai.response.id": "chatcmpl-1",
                    "gen_ai.response.finish_reasons": ["tool_calls"],
                    "gen_ai.input.messages": json.dumps(
                        [{"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}]
                    ),
                    "gen_ai.output.messages": json.dumps(
                        [
                            {
                                "role": "assistant",
                                "parts": [
                                    {
                                        "type": "tool_call",
                                        "id": "call_1",
                                        "name": "get_weather",
                                        "arguments": {"city": "Paris"},
                                    }
                                ],
                            }
                        ]
                    ),
                },
            ):
                pass
            with tracer.start_as_current_span(
                "execute_tool get_weather",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "get_weather",
                    "gen_ai.tool.call.id": "call_1",
                    "gen_ai.tool.call.arguments": '{"city": "Paris"}',
                    "gen_ai.tool.call.result": '{"celsius": 21}',
                },
            ) as tool:
                if fail_tool:
                    tool.set_attribute("error.type", "TimeoutError")
                    tool.set_status(Status(StatusCode.ERROR, "the weather service timed out"))
            with tracer.start_as_current_span("SELECT weather_cache", attributes={"db.system.name": "postgresql"}):
                pass
            with tracer.start_as_current_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system": "openai",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 200,
                    "gen_ai.usage.output_tokens": 15,
                    "gen_ai.output.messages": json.dumps(
                        [{"role": "assistant", "parts": [{"type": "text", "content": "21 °C and sunny."}]}]
                    ),
                },
            ):
                pass
        return format(root.get_span_context().trace_id, "032x")


def _provider(exporter: Any) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _run(workspace: Workspace, trace: str) -> Run:
    return Run.objects.get(workspace=workspace, run_id=f"run_otel_{trace}")


def _types(run: Run) -> list[str]:
    return [e["type"] for e in selectors.events(run)]


EXPECTED_TYPES = [
    "RunStarted",
    "StepScheduled",
    "StepAttemptStarted",
    "harness.model.called",
    "harness.model.responded",
    "harness.tool_call.started",
    "harness.tool_call.succeeded",
    "custom.otel.span",
    "harness.model.called",
    "harness.model.responded",
    "StepCompleted",
    "RunCompleted",
]


def test_sdk_exporter_spans_become_the_runs_events(server: Daphne, workspace: Workspace, key: str) -> None:
    """The SDK's http/protobuf exporter, gzip, one export per ended span: children reach the server
    before their parents, in six exports, and the run still reads in order of time."""
    exporter = OTLPSpanExporter(
        endpoint=server.url + TRACES,
        headers={"Authorization": f"Bearer {key}"},
        compression=Compression.Gzip,
        timeout=30,
    )
    provider = _provider(exporter)
    trace = _agent_trace(provider)
    provider.shutdown()

    run = _run(workspace, trace)
    assert run.status == "completed"
    assert run.workflow_version_id == "otel:weather-agent"
    events = selectors.events(run)
    # Six exports, each its own append: the log keeps arrival order, a span's end events at its end.
    assert [e["type"] for e in events] == [
        "RunStarted",
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "custom.otel.span",
        "harness.model.called",
        "harness.model.responded",
        "StepScheduled",
        "StepAttemptStarted",
        "StepCompleted",
        "RunCompleted",
    ]
    by_type = {e["type"]: e["payload"] for e in events}
    responded = [e["payload"] for e in events if e["type"] == "harness.model.responded"]
    assert responded[0]["model"] == {"provider": "openai", "modelId": "gpt-4o-2024-08-06"}
    assert responded[0]["response"]["usage"] == {"inputTokens": 120, "outputTokens": 30}
    assert responded[0]["response"]["toolCalls"] == [
        {"callId": "call_1", "toolName": "get_weather", "args": {"city": "Paris"}}
    ]
    assert responded[1]["model"] == {"provider": "openai", "modelId": "gpt-4o"}  # gen_ai.system, the older name
    assert responded[1]["response"]["text"] == "21 °C and sunny."
    assert [p["turn"] for p in responded] == [1, 2]
    called = next(e["payload"] for e in events if e["type"] == "harness.model.called")
    assert called["request"]["parameters"] == {"temperature": 0.2}
    assert called["request"]["messages"] == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]}
    ]
    agent_step = by_type["StepScheduled"]["stepPath"]
    assert by_type["StepScheduled"]["stepId"] == "invoke_agent weather"
    assert all(p.get("stepPath") == agent_step for p in responded)
    assert by_type["harness.tool_call.started"] == {
        **by_type["harness.tool_call.started"],
        "callId": "call_1",
        "toolName": "get_weather",
        "args": {"city": "Paris"},
    }
    assert by_type["harness.tool_call.succeeded"]["result"] == {"celsius": 21}
    assert by_type["custom.otel.span"]["otel"]["attributes"] == {"db.system.name": "postgresql"}

    run.refresh_from_db()
    assert (run.input_tokens, run.output_tokens) == (320, 45)
    step = run.steps.get(step_path=agent_step)
    assert step.status == "completed" and (step.input_tokens, step.output_tokens) == (320, 45)
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)


def test_one_batched_export_is_ordered_by_time(server: Daphne, workspace: Workspace, key: str) -> None:
    memory = InMemorySpanExporter()
    trace = _agent_trace(_provider(memory))
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    assert _types(_run(workspace, trace)) == EXPECTED_TYPES


def test_a_retried_export_writes_nothing_twice(server: Daphne, workspace: Workspace, key: str) -> None:
    memory = InMemorySpanExporter()
    trace = _agent_trace(_provider(memory), fail_tool=True)
    spans: tuple[ReadableSpan, ...] = memory.get_finished_spans()
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert exporter.export(spans[:3]) == SpanExportResult.SUCCESS
    assert exporter.export(spans[:3]) == SpanExportResult.SUCCESS  # the exporter's retry after a lost answer
    run = _run(workspace, trace)
    first = list(Event.objects.filter(run=run).order_by("sequence").values_list("event_id", flat=True))
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # all of it, the first three again among them
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    run.refresh_from_db()
    events = selectors.events(run)
    assert [e["eventId"] for e in events][: len(first)] == first
    assert len({e["payload"].get("otel", {}).get("spanId") for e in events if e["type"].startswith("harness.")}) == 3
    assert run.status == "completed" and run.last_sequence == len(EXPECTED_TYPES)
    failed = next(e["payload"] for e in events if e["type"] == "harness.tool_call.failed")
    assert failed["error"] == {"name": "TimeoutError", "message": "the weather service timed out"}
    assert all(check.status == "pass" for check in verify_run(run))


# --- OTLP/JSON ---------------------------------------------------------------------------------

TRACE = "5b8efff798038103d269b633813fc60c"
ROOT, CHAT = "eee19b7ec3c1b174", "eee19b7ec3c1b173"


def _json_export(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-agent"}}]},
                "scopeSpans": [{"scope": {"name": "manual"}, "spans": list(spans)}],
            }
        ]
    }


def _json_span(
    span_id: str, name: str, start: int, end: int, parent: str = "", trace: str = TRACE, **attributes: Any
) -> dict[str, Any]:
    named = {k.replace("__", "."): v for k, v in attributes.items()}  # gen_ai__system: gen_ai.system
    return json_span(span_id, name, start, end, parent, trace, named)


T0 = 1_764_547_200_000_000_000  # 2025-12-01T00:00:00Z


def _chat_trace(trace: str = TRACE) -> dict[str, Any]:
    return _json_export(
        _json_span(
            CHAT,
            "chat claude",
            T0 + 1_000_000,
            T0 + 900_000_000,
            parent=ROOT,
            trace=trace,
            gen_ai__operation__name="chat",
            gen_ai__provider__name="anthropic",
            gen_ai__request__model="claude-sonnet-4",
            gen_ai__usage__input_tokens=50,
            gen_ai__usage__output_tokens=7,
        ),
        _json_span(ROOT, "agent", T0, T0 + 1_000_000_000, trace=trace),
    )


def test_otlp_json_with_gzip_is_accepted(server: Daphne, workspace: Workspace, key: str) -> None:
    body = gzip.compress(json.dumps(_chat_trace()).encode())
    response = httpx.post(
        server.url + TRACES,
        content=body,
        timeout=30,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {}
    run = _run(workspace, TRACE)
    assert _types(run) == [
        "RunStarted",
        "StepScheduled",
        "StepAttemptStarted",
        "harness.model.called",
        "harness.model.responded",
        "StepCompleted",
        "RunCompleted",
    ]
    assert (run.input_tokens, run.output_tokens, run.status) == (50, 7, "completed")
    started_payload = selectors.events(run)[0]["payload"]
    assert started_payload["workflowVersionId"] == "otel:json-agent"
    assert started_payload["otel"]["traceId"] == TRACE


def test_unknown_fields_are_ignored_whatever_keys_they_hold(server: Daphne, workspace: Workspace, key: str) -> None:
    """As the specification asks receivers; an unknown field holding a key named `spanId` (a vendor's,
    a later OTLP's) was read as an id and refused the whole export. The ids themselves are still
    checked, and the refusal names where, once."""
    body = _chat_trace()
    body["vendorExtension"] = {"spanId": "not hex", "traceId": 7}
    span = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["vendorDetail"] = {"parentSpanId": "zz"}
    span["links"] = [{"traceId": TRACE, "spanId": ROOT, "vendor": {"spanId": "?"}}]
    auth = {"Authorization": f"Bearer {key}"}
    response = httpx.post(server.url + TRACES, json=body, headers=auth, timeout=30)
    assert (response.status_code, response.json()) == (200, {}), response.text
    assert _run(workspace, TRACE).status == "completed"
    span["links"][0]["spanId"] = "not hex"
    refused = httpx.post(server.url + TRACES, json=body, headers=auth, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_otlp"
    assert refused.json()["error"]["details"]["field"] == "resourceSpans[0].scopeSpans[0].spans[0].links[0].spanId"


def test_partial_success_names_the_refused_spans(server: Daphne, workspace: Workspace, key: str) -> None:
    export = _chat_trace()
    export["resourceSpans"][0]["scopeSpans"][0]["spans"].append(_json_span("0000000000000000", "broken", T0, T0 + 1))
    response = httpx.post(server.url + TRACES, json=export, timeout=30, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "spanId must be 8 bytes" in partial["errorMessage"]
    assert _run(workspace, TRACE).status == "completed"


def test_a_trace_the_log_refuses_is_rejected_alone(server: Daphne, workspace: Workspace, key: str) -> None:
    """A tool name longer than its column (the write path refuses it): that trace's spans are
    counted as rejected and nothing of it is written; the other trace of the same export is."""
    other = "0af7651916cd43dd8448eb211c80319c"
    export = _chat_trace()
    bad = _json_span(
        "bbbbbbbbbbbbbbbb",
        "bad",
        T0,
        T0 + 5,
        trace=other,
        gen_ai__operation__name="execute_tool",
        gen_ai__tool__name="t" * 201,
    )
    export["resourceSpans"][0]["scopeSpans"][0]["spans"].append(bad)
    response = httpx.post(server.url + TRACES, json=export, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert partial["errorMessage"].startswith(f"trace {other}: invalid_event: ")
    assert _run(workspace, TRACE).status == "completed"
    assert not Run.objects.filter(run_id=f"run_otel_{other}").exists()


def _one_chat(provider: TracerProvider, name: str, **attributes: Any) -> str:
    """A request span holding one chat span with `attributes`; the trace id."""
    tracer = provider.get_tracer("tests.agent", "1.0")
    with tracer.start_as_current_span("handle request") as root:
        with tracer.start_as_current_span(
            name,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                **attributes,
            },
        ):
            pass
    return format(root.get_span_context().trace_id, "032x")


def test_a_nul_in_a_span_is_kept_as_u_fffd_and_the_trace_recorded(
    server: Daphne, workspace: Workspace, key: str
) -> None:
    """The exporter does not report a partial success: a trace refused for one NUL in a model's
    answer would vanish without a word."""
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    provider = _provider(exporter)
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": "Z\u00fcrich \u0000? no"}]}]
    trace = _one_chat(
        provider,
        "chat gpt-4o\x00",
        **{
            "gen_ai.output.messages": json.dumps(answer),
            "gen_ai.usage.input_tokens": 120,
            "gen_ai.usage.output_tokens": 30,
            "note\x00": "a\x00b",
        },
    )
    provider.shutdown()
    run = _run(workspace, trace)
    assert run.status == "completed"
    responded = next(e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded")
    assert responded["response"]["text"] == "Z\u00fcrich \ufffd? no"
    assert responded["otel"]["name"] == "chat gpt-4o\ufffd"
    assert responded["otel"]["attributes"]["note\ufffd"] == "a\ufffdb"
    assert run.priced_calls == 1 and (run.input_tokens, run.output_tokens) == (120, 30)
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)


# JSON texts in attributes that parse, but not into what the log holds (Python's json.dumps writes
# NaN and Infinity by default; a tool result may hold an integer past a double), or that nest past the
# API's depth limit, or name a key twice (the parsed document would lose the first value).
UNHOLDABLE_JSON = {
    "nan": json.dumps([{"role": "tool", "parts": [{"type": "tool_call_response", "response": {"score": math.nan}}]}]),
    "infinity": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "x"}], "limit": math.inf}]),
    "integer past a double": '[{"role": "user", "parts": [], "id": 123456789012345678901234567890}]',
    "lone surrogate": '[{"role": "user", "parts": [{"type": "text", "content": "\\ud800"}]}]',
    "deep": "[" * 5000 + "]" * 5000,
    "key twice": '[{"role": "user", "role": "system", "parts": []}]',
}


@pytest.mark.parametrize("text", UNHOLDABLE_JSON.values(), ids=UNHOLDABLE_JSON.keys())
def test_json_text_the_log_cannot_hold_stays_text_and_the_call_counts(
    server: Daphne, workspace: Workspace, key: str, text: str
) -> None:
    """Such a prompt was a 500 (its promptHash), such an answer refused the whole trace: the exporter
    retried or dropped it, and a call that was made and billed never reached the run."""
    memory = InMemorySpanExporter()
    trace = _one_chat(
        _provider(memory),
        "chat gpt-4o",
        **{
            "gen_ai.input.messages": text,
            "gen_ai.output.messages": text,
            "gen_ai.usage.input_tokens": 120,
            "gen_ai.usage.output_tokens": 30,
        },
    )
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    run = _run(workspace, trace)
    events = {e["type"]: e["payload"] for e in selectors.events(run)}
    assert events["harness.model.called"]["request"]["messages"] == text
    assert events["harness.model.responded"]["response"]["messages"] == text
    assert run.status == "completed" and run.priced_calls == 1 and (run.input_tokens, run.output_tokens) == (120, 30)
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)


def _kvlist(**values: Any) -> dict[str, Any]:
    return {"kvlistValue": {"values": [{"key": k, "value": any_value(v)} for k, v in values.items()]}}


# Attributes of a shape neither convention writes, where the mapping reads messages.
ODD_SHAPES = {
    "openinference index past int()": {"llm.input_messages." + "9" * 5000 + ".message.role": "user"},
    "openinference tool_calls whole, then flattened": {
        "llm.output_messages.0.message.tool_calls": "x",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "call_1",
    },
    "openinference contents as a kvlist of numbers": {"llm.input_messages.0.message.contents": _kvlist(a=5)},
    "openinference tool_calls as a kvlist of numbers": {"llm.output_messages.0.message.tool_calls": _kvlist(a=5)},
    "genai parts a number": {"gen_ai.output.messages": '[{"role": "assistant", "parts": 5}]'},
    "genai parts null": {"gen_ai.output.messages": '[{"role": "assistant", "parts": null}]'},
}


@pytest.mark.parametrize("odd", ODD_SHAPES.values(), ids=ODD_SHAPES.keys())
def test_messages_of_an_odd_shape_are_kept_in_the_attributes_never_a_500(
    server: Daphne, workspace: Workspace, key: str, odd: dict[str, Any]
) -> None:
    convention = (
        {"openinference.span.kind": "LLM", "llm.provider": "openai", "llm.model_name": "gpt-4o"}
        | {"llm.token_count.prompt": 120, "llm.token_count.completion": 30}
        if any(k.startswith("llm.") for k in odd)
        else {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o"}
        | {"gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 30}
    )
    body = _json_export(
        json_span(ROOT, "handle request", T0, T0 + 900_000_000, "", TRACE),
        json_span(CHAT, "chat gpt-4o", T0 + 1, T0 + 800_000_000, ROOT, TRACE, {**convention, **odd}),
    )
    response = httpx.post(server.url + TRACES, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert (response.status_code, response.json()) == (200, {}), response.text
    run = _run(workspace, TRACE)
    responded = next(e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded")
    assert set(odd) <= set(responded["otel"]["attributes"])
    assert run.status == "completed" and run.priced_calls == 1 and (run.input_tokens, run.output_tokens) == (120, 30)


def test_a_long_answer_is_moved_to_artifacts_and_the_conversation_names_each_in_words(
    server: Daphne, workspace: Workspace, key: str, admin: Any
) -> None:
    """A span too large for the log keeps its members as artifacts (docs/operations.md "Large
    payloads"); the conversation links each one and says what it is, the span included."""
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    provider = _provider(exporter)
    long = "".join(f"Finding {n}: the parcel left depot {n % 7}.\n" for n in range(9000))
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": long}], "finish_reason": "stop"}]
    trace = _one_chat(
        provider,
        "chat gpt-4o",
        **{
            "gen_ai.output.messages": json.dumps(answer),
            "gen_ai.usage.input_tokens": 1,
            "gen_ai.usage.output_tokens": 2,
        },
    )
    provider.shutdown()
    client = DjangoClient()
    client.force_login(admin)
    page = client.get(f"/w/acme/support/runs/run_otel_{trace}/conversation/").content.decode()
    for what in ("The span as exported (OpenTelemetry)", "Response text", "Response messages"):
        assert f"{what} stored as an artifact, not loaded here: <a " in page, what
    assert "Otel stored" not in page


def test_a_token_count_past_the_bound_leaves_the_call_unpriced_and_says_why(
    server: Daphne, workspace: Workspace, key: str
) -> None:
    """Past 2^53 an int attribute is kept as a string; the call was once priced on its output alone."""
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    provider = _provider(exporter)
    trace = _one_chat(
        provider, "chat gpt-4o", **{"gen_ai.usage.input_tokens": 9 * 10**18, "gen_ai.usage.output_tokens": 30}
    )
    provider.shutdown()
    run = _run(workspace, trace)
    responded = next(e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded")
    assert responded["response"]["usage"] == {}
    assert responded["response"]["usageNotCounted"].startswith(
        "gen_ai.usage.input_tokens is '9000000000000000000', not a token count from 0 to 100,000,000,000"
    )
    assert (run.priced_calls, run.unpriced_calls, run.cost_usd) == (0, 1, None)
    assert (run.input_tokens, run.output_tokens) == (0, 0)


def _late_spans() -> dict[str, Any]:
    """Three spans of TRACE that end after its root: a priced chat call under the root's step, a
    chat call that failed (its request left: unknown cost), and a tool call."""
    failed = _json_span(
        "aaaaaaaaaaaaaaab",
        "chat gpt-4o",
        T0 + 2_000_000_000,
        T0 + 3_000_000_000,
        parent=ROOT,
        gen_ai__operation__name="chat",
        gen_ai__provider__name="openai",
        gen_ai__request__model="gpt-4o",
        error__type="openai.InternalServerError",
    )
    failed["status"] = {"code": 2, "message": "upstream 500"}
    return _json_export(
        _json_span(
            "aaaaaaaaaaaaaaaa",
            "chat gpt-4o",
            T0 + 1_500_000_000,
            T0 + 2_500_000_000,
            parent=ROOT,
            gen_ai__operation__name="chat",
            gen_ai__provider__name="openai",
            gen_ai__request__model="gpt-4o",
            gen_ai__usage__input_tokens=1000,
            gen_ai__usage__output_tokens=100,
        ),
        failed,
        _json_span(
            "aaaaaaaaaaaaaaac",
            "execute_tool lookup",
            T0 + 2_000_000_000,
            T0 + 2_100_000_000,
            parent=ROOT,
            gen_ai__operation__name="execute_tool",
            gen_ai__tool__name="lookup",
        ),
    )


def test_a_model_call_after_the_root_ended_counts_in_the_run_as_a_late_call(
    server: Daphne, workspace: Workspace, other_workspace: Workspace, key: str
) -> None:
    """A span of the trace that arrives after its root span: a model call counts (its tokens and
    cost, a failed one as a call of unknown cost) in the run, its step and the usage rollups, marked
    late; the run stays completed at its root's end; a tool call is kept as a late span. Sent again,
    nothing is counted twice; sent with another tenant's key, this run is untouched."""
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.post(server.url + TRACES, json=_chat_trace(), headers=auth, timeout=30).status_code == 200
    before = _run(workspace, TRACE)
    response = httpx.post(server.url + TRACES, json=_late_spans(), headers=auth, timeout=30)
    assert response.status_code == 200
    # Nothing refused (a zero rejectedSpans is omitted, as protobuf's JSON omits defaults): a warning only.
    assert response.json() == {
        "partialSuccess": {
            "errorMessage": "3 span(s) arrived after their trace's root span ended: 2 model call(s) counted in the "
            "run as late calls, 1 kept as custom.otel.span"
        }
    }
    run = _run(workspace, TRACE)
    assert (run.status, run.finished_at, run.started_at) == ("completed", before.finished_at, before.started_at)
    late = selectors.events(run)[before.last_sequence :]
    assert [e["type"] for e in late] == [
        "harness.model.called",
        "harness.model.responded",
        "harness.model.called",
        "harness.model.failed",
        "custom.otel.span",
    ]
    assert all(e["payload"]["late"] is True for e in late)
    assert {e["payload"].get("stepPath") for e in late} == {f"span-{ROOT}", None}
    assert [e["payload"]["turn"] for e in late if e["type"] == "harness.model.called"] == [2, 3]
    # gpt-4o: 1,000 in at $2.50 and 100 out at $10 per million tokens.
    assert (run.input_tokens, run.output_tokens) == (1050, 107)
    # The trace's own call (claude-sonnet-4, which the price table does not price) was unpriced.
    assert (before.priced_calls, before.unpriced_calls, run.priced_calls, run.unpriced_calls) == (0, 1, 1, 2)
    late_cost = CostEntry.objects.get(run=run, call_id="aaaaaaaaaaaaaaaa").cost_usd
    assert late_cost == Decimal("0.0035") and run.cost_usd == late_cost
    failed = CostEntry.objects.get(run=run, call_id="aaaaaaaaaaaaaaab")
    assert (failed.cost_usd, failed.usage_reported) == (None, False)
    step = Step.objects.get(run=run, step_path=f"span-{ROOT}")
    assert (step.status, step.input_tokens, step.priced_calls, step.unpriced_calls) == ("completed", 1050, 1, 2)
    day = DailyUsage.objects.filter(workspace=workspace).aggregate(calls=Sum("calls"), tokens=Sum("input_tokens"))
    assert day == {"calls": 3, "tokens": 1050}
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)

    again = httpx.post(server.url + TRACES, json=_late_spans(), headers=auth, timeout=30)
    assert again.status_code == 200 and again.json() == {}
    assert _run(workspace, TRACE).last_sequence == run.last_sequence

    outsider = {"Authorization": f"Bearer {_key(other_workspace, ['ingest'])}"}
    assert httpx.post(server.url + TRACES, json=_late_spans(), headers=outsider, timeout=30).status_code == 200
    assert _run(workspace, TRACE).last_sequence == run.last_sequence
    assert Run.objects.get(workspace=other_workspace, run_id=f"run_otel_{TRACE}").input_tokens == 1000


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"Content-Type": "application/x-protobuf"}, b"\xff\xff\xff\xff", 400, "invalid_otlp"),
        ({"Content-Type": "application/json"}, b"{not json", 400, "invalid_otlp"),
        ({"Content-Type": "application/json"}, b"[1, 2]", 400, "invalid_otlp"),
        (
            {"Content-Type": "application/json"},
            json.dumps(
                {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "not-hex", "spanId": ROOT}]}]}]}
            ).encode(),
            400,
            "invalid_otlp",
        ),
        ({"Content-Type": "application/json"}, json.dumps({"resourceSpans": "many"}).encode(), 400, "invalid_otlp"),
        (
            {"Content-Type": "application/json"},
            b'{"resourceSpans": ' + b"[" * 70 + b"]" * 70 + b"}",
            400,
            "invalid_otlp",
        ),
        ({"Content-Type": "application/json"}, b"[" * 5000 + b"]" * 5000, 400, "invalid_otlp"),
        ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"not gzip", 400, "invalid_otlp"),
        # A gzip header then junk, a stream cut short, a stream with bytes after its end: never "taken".
        (
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            b"\x1f\x8b\x08\x00junk",
            400,
            "invalid_otlp",
        ),
        (
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            gzip.compress(json.dumps(_chat_trace()).encode())[:-9],
            400,
            "invalid_otlp",
        ),
        (
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            gzip.compress(json.dumps(_chat_trace()).encode()) + b"trailing",
            400,
            "invalid_otlp",
        ),
        (
            {"Content-Type": "application/json", "Content-Encoding": "deflate"},
            zlib.compress(json.dumps(_chat_trace()).encode()) + b"\x00",
            400,
            "invalid_otlp",
        ),
        ({"Content-Type": "application/json", "Content-Encoding": "br"}, b"{}", 415, "unsupported_media_type"),
        ({"Content-Type": "text/plain"}, b"{}", 415, "unsupported_media_type"),
        (
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
            gzip.compress(b" " * (11 * 1024 * 1024)),
            413,
            "payload_too_large",
        ),
    ],
)
def test_bad_input_is_refused_with_the_error_body(
    server: Daphne, workspace: Workspace, key: str, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    response = httpx.post(
        server.url + TRACES, content=body, timeout=30, headers={"Authorization": f"Bearer {key}", **headers}
    )
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == code
    assert not Event.objects.exists()


def test_keys_credentials_and_tenants(
    server: Daphne, workspace: Workspace, other_workspace: Workspace, key: str
) -> None:
    body = json.dumps(_chat_trace()).encode()

    def post(headers: dict[str, str]) -> httpx.Response:
        return httpx.post(
            server.url + TRACES, content=body, timeout=30, headers={"Content-Type": "application/json", **headers}
        )

    assert post({}).status_code == 401
    assert post({"Authorization": "Bearer rl_not_a_key"}).status_code == 401
    read_only = post({"Authorization": f"Bearer {_key(workspace, ['read'])}"})
    assert read_only.status_code == 403 and read_only.json()["error"]["code"] == "insufficient_scope"
    assert not Event.objects.exists()
    # Another tenant's key writes the same trace into its own workspace, and cannot read ours.
    outsider = _key(other_workspace, ["ingest", "read"])
    assert post({"Authorization": f"Bearer {key}"}).status_code == 200
    assert post({"Authorization": f"Bearer {outsider}"}).status_code == 200
    ours, theirs = _run(workspace, TRACE), _run(other_workspace, TRACE)
    assert ours.pk != theirs.pk and ours.last_sequence == theirs.last_sequence == 7


def test_an_operators_session_sends_protobuf_and_gzip_like_a_key(operator: Any, outsider: Any) -> None:
    """The session's CSRF check reads the body's form fields, through a parser for its Content-Type:
    with the API's JSON parser only, protobuf was 415 and gzipped OTLP/JSON 400, for bytes a key's
    export has taken."""
    protobuf = _parse_otlp_json(_chat_trace()).SerializeToString()
    gzipped = gzip.compress(json.dumps(_chat_trace("5b8efff798038103d269b633813fc60d")).encode())
    session = DjangoClient(enforce_csrf_checks=True)
    session.force_login(operator)
    assert session.get("/w/acme/support/").status_code == 200  # the csrftoken cookie, as a browser holds it
    csrf = {"X-CSRFToken": session.cookies["csrftoken"].value}
    answer = session.post(TRACES, protobuf, content_type="application/x-protobuf", headers=csrf)
    assert (answer.status_code, answer["Content-Type"]) == (200, "application/x-protobuf"), answer.content
    answer = session.post(
        TRACES, gzipped, content_type="application/json", headers={**csrf, "Content-Encoding": "gzip"}
    )
    assert (answer.status_code, answer.json()) == (200, {}), answer.content
    assert (
        Run.objects.filter(run_id__startswith="run_otel_5b8efff798038103d269b633813fc60", status="completed").count()
        == 2
    )
    refused = session.post(TRACES, protobuf, content_type="application/x-protobuf")  # no token
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    # A member of another tenant naming our workspace: not found, as every workspace it is not in.
    theirs = DjangoClient(enforce_csrf_checks=True)
    theirs.force_login(outsider)
    assert theirs.get("/w/globex/main/").status_code == 200
    other = {"X-CSRFToken": theirs.cookies["csrftoken"].value}
    before = Event.objects.count()
    for workspace in ("acme/support", "acme/nothing"):
        named = theirs.post(
            f"{TRACES}?workspace={workspace}", protobuf, content_type="application/x-protobuf", headers=other
        )
        assert named.status_code == 404 and named.json()["error"]["code"] == "not_found", named.content
    assert Event.objects.count() == before


# --- export ------------------------------------------------------------------------------------


def _native_run(append: Any) -> None:
    append(
        "run_native",
        started("wfver_support"),
        ev("StepScheduled", stepPath="answer", stepId="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev(
            "harness.model.called",
            turn=1,
            promptHash="sha256:p",
            request={"model": "gpt-4o-mini"},
            stepPath="answer",
            callId="m1",
        ),
        ev(
            "harness.model.responded",
            turn=1,
            callId="m1",
            stepPath="answer",
            model={"provider": "openai", "modelId": "gpt-4o-mini"},
            response={"text": "hi", "usage": {"inputTokens": 40, "outputTokens": 9}},
        ),
        ev(
            "harness.tool_call.started",
            callId="t1",
            caller="agent",
            toolName="lookup",
            args={"q": "x"},
            stepPath="answer",
        ),
        ev("harness.tool_call.succeeded", callId="t1", durationMs=12, result={"hits": 2}, stepPath="answer"),
        ev("StepCompleted", stepPath="answer", attempt=1),
        ev("RunCompleted", output={"ok": True}),
    )


def test_a_run_exports_as_otlp_json_and_comes_back_in(
    server: Daphne, workspace: Workspace, other_workspace: Workspace, key: str, append: Any
) -> None:
    _native_run(append)
    url = f"{server.url}/api/v1/runs/run_native/otlp"
    auth = {"Authorization": f"Bearer {key}"}
    response = httpx.get(url, headers=auth, timeout=30)
    assert response.status_code == 200, response.text
    document = response.json()
    assert httpx.get(url, headers=auth, timeout=30).json() == document  # stable ids, same spans
    parsed = _parse_otlp_json(document)
    spans = parsed.resource_spans[0].scope_spans[0].spans
    assert len({s.trace_id for s in spans}) == 1 and len(spans[0].trace_id) == 16
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"wfver_support", "answer", "chat gpt-4o-mini", "execute_tool lookup"}
    root, step, chat, tool = (
        by_name[n] for n in ("wfver_support", "answer", "chat gpt-4o-mini", "execute_tool lookup")
    )
    assert not root.parent_span_id and step.parent_span_id == root.span_id
    assert chat.parent_span_id == tool.parent_span_id == step.span_id
    events = {e["type"]: e for e in selectors.events(Run.objects.get(run_id="run_native"))}
    assert chat.span_id.hex() == events["harness.model.called"]["eventId"][4:]
    assert chat.kind == chat.SPAN_KIND_CLIENT
    assert _attributes(chat) | {} == {
        **_attributes(chat),
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini",
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 9,
    }
    assert _attributes(tool)["gen_ai.tool.name"] == "lookup" and _attributes(tool)["gen_ai.tool.call.id"] == "t1"
    assert chat.start_time_unix_nano <= chat.end_time_unix_nano
    entries = AuditEntry.objects.filter(action="run.otlp_exported", target="run_native")
    assert len(entries) == 2  # one per export
    assert all(e.workspace == workspace and e.actor.startswith("key:") and e.details["spans"] == 4 for e in entries)

    # Posted as it is to the OTLP endpoint of another workspace, it is the same run again.
    theirs = _key(other_workspace, ["ingest", "read"])
    back = httpx.post(server.url + TRACES, json=document, headers={"Authorization": f"Bearer {theirs}"}, timeout=30)
    assert back.status_code == 200 and back.json() == {}
    copy = _run(other_workspace, root.trace_id.hex())
    assert (copy.status, copy.input_tokens, copy.output_tokens) == ("completed", 40, 9)
    assert list(copy.steps.values_list("status", flat=True)) == ["completed"]
    copied = selectors.events(copy)
    assert [e["type"] for e in copied] == [
        "RunStarted",
        "StepScheduled",
        "StepAttemptStarted",
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "StepCompleted",
        "RunCompleted",
    ]
    assert next(e for e in copied if e["type"] == "harness.tool_call.succeeded")["payload"]["result"] == {"hits": 2}

    # An ingested run exports with its own trace and span ids, and posting that back writes nothing.
    again = httpx.get(
        f"{server.url}/api/v1/runs/{copy.run_id}/otlp", headers={"Authorization": f"Bearer {theirs}"}, timeout=30
    ).json()
    respans = _parse_otlp_json(again).resource_spans[0].scope_spans[0].spans
    assert {(s.span_id, s.parent_span_id) for s in respans} == {(s.span_id, s.parent_span_id) for s in spans}
    before = copy.last_sequence
    assert (
        httpx.post(server.url + TRACES, json=again, headers={"Authorization": f"Bearer {theirs}"}, timeout=30).json()
        == {}
    )
    copy.refresh_from_db()
    assert copy.last_sequence == before


def test_a_failed_calls_request_left_survives_the_export_and_its_ingest(
    server: Daphne, workspace: Workspace, other_workspace: Workspace, key: str, append: Any
) -> None:
    """A model call refused before it left (`requestLeft: false`) and one that failed after
    (`true`): the export says which on each error span (`runledger.request_left`), so the copy
    another workspace ingests counts the same unknown-cost call, not two; an error span that does
    not say is one that may have left (docs/otlp.md)."""
    model = {"provider": "openai", "modelId": "gpt-4o-mini"}
    calls = []
    for n, left in ((1, False), (2, True)):
        called = ev("harness.model.called", turn=n, promptHash="sha256:p", request={}, stepPath="ask", callId=f"m{n}")
        error = {"name": "ProviderError", "message": "no answer"}
        failed = ev("harness.model.failed", turn=n, callId=f"m{n}", stepPath="ask", model=model, error=error)
        failed["payload"]["requestLeft"] = left
        calls += [called, failed]
    append(
        "run_fails",
        started("wfver_support"),
        ev("StepScheduled", stepPath="ask", stepId="ask"),
        ev("StepAttemptStarted", stepPath="ask", attempt=1),
        *calls,
        ev("StepFailed", stepPath="ask", attempt=1, error={"name": "ProviderError", "message": "no answer"}),
        ev("RunFailed", error={"name": "ProviderError", "message": "no answer"}),
    )
    original = Run.objects.get(workspace=workspace, run_id="run_fails")
    assert (original.priced_calls, original.unpriced_calls) == (0, 1)
    document = httpx.get(
        f"{server.url}/api/v1/runs/run_fails/otlp", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    spans = _parse_otlp_json(document).resource_spans[0].scope_spans[0].spans
    said = sorted(
        (_attributes(s)["runledger.turn"], _attributes(s).get("runledger.request_left"))
        for s in spans
        if "runledger.turn" in _attributes(s)
    )
    assert said == [(1, False), (2, True)]

    theirs = _key(other_workspace, ["ingest", "read"])
    back = httpx.post(server.url + TRACES, json=document, headers={"Authorization": f"Bearer {theirs}"}, timeout=30)
    assert back.status_code == 200 and back.json() == {}
    copy = _run(other_workspace, spans[0].trace_id.hex())
    failed = [e["payload"] for e in selectors.events(copy) if e["type"] == "harness.model.failed"]
    assert sorted((f["otel"]["attributes"]["runledger.turn"], f["requestLeft"]) for f in failed) == [
        (1, False),
        (2, True),
    ]
    assert (copy.status, copy.priced_calls, copy.unpriced_calls) == ("failed", 0, 1)


def test_an_ingested_trace_exports_with_its_own_ids(server: Daphne, workspace: Workspace, key: str) -> None:
    memory = InMemorySpanExporter()
    trace = _agent_trace(_provider(memory))
    originals = {format(s.context.span_id, "016x"): s for s in memory.get_finished_spans()}
    exporter = OTLPSpanExporter(endpoint=server.url + TRACES, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    document = httpx.get(
        f"{server.url}/api/v1/runs/run_otel_{trace}/otlp", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ).json()
    spans = _parse_otlp_json(document).resource_spans[0].scope_spans[0].spans
    assert {s.trace_id.hex() for s in spans} == {trace}
    assert {s.span_id.hex() for s in spans} == set(originals)
    for span in spans:
        original = originals[span.span_id.hex()]
        assert span.name == original.name
        assert span.start_time_unix_nano == original.start_time and span.end_time_unix_nano == original.end_time
        parent = original.parent.span_id if original.parent else None
        assert (span.parent_span_id.hex() if span.parent_span_id else None) == (
            format(parent, "016x") if parent else None
        )
        # Every original attribute comes back; the GenAI names a backend may look for are added.
        exported = _attributes(span)
        assert (
            exported | {k: list(v) if isinstance(v, tuple) else v for k, v in (original.attributes or {}).items()}
            == exported
        )


def test_the_run_export_is_not_for_outsiders(
    server: Daphne, workspace: Workspace, other_workspace: Workspace, key: str, append: Any
) -> None:
    _native_run(append)
    url = f"{server.url}/api/v1/runs/run_native/otlp"
    outsider = httpx.get(url, headers={"Authorization": f"Bearer {_key(other_workspace, ['read'])}"}, timeout=30)
    assert outsider.status_code == 404 and outsider.json()["error"]["code"] == "not_found"
    assert httpx.get(url, timeout=30).status_code == 401
    ingest_only = httpx.get(url, headers={"Authorization": f"Bearer {_key(workspace, ['ingest'])}"}, timeout=30)
    assert ingest_only.status_code == 403
    assert (
        httpx.get(
            f"{server.url}/api/v1/runs/bad id/otlp", headers={"Authorization": f"Bearer {key}"}, timeout=30
        ).json()["error"]["code"]
        == "invalid_run_id"
    )
    assert not AuditEntry.objects.filter(action="run.otlp_exported").exists()


# --- README -----------------------------------------------------------------------------------


def test_readme_otlp_example_names_the_port_once_as_a_variable() -> None:
    script = readme.block("Send OpenTelemetry traces")
    assert script.count(readme.URL_LINE) == 1 and script.count("8000") == 1


def test_readme_otlp_example_works_as_written(server: Daphne, workspace: Workspace) -> None:
    assert shutil.which("curl"), "curl is needed: the README's commands are run as written"
    script = readme.block("Send OpenTelemetry traces")
    env = readme.on_port(server.url, {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    env["DATABASE_URL"] = database_url()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script + "\n" + script],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    outputs = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    run, exported = outputs[0], outputs[1]
    assert run["runId"].startswith("run_otel_") and run["workflowVersionId"] == "otel:weather-agent"
    assert run["status"] == "completed"
    assert (run["usage"]["inputTokens"], run["usage"]["outputTokens"]) == (120, 30)
    stored = Run.objects.get(workspace=workspace, run_id=run["runId"])
    assert _types(stored) == [
        "RunStarted",
        "StepScheduled",
        "StepAttemptStarted",
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "StepCompleted",
        "RunCompleted",
    ]
    names = {s.name for s in _parse_otlp_json(exported).resource_spans[0].scope_spans[0].spans}
    assert names == {"invoke_agent weather", "chat gpt-4o", "execute_tool get_weather"}
    assert outputs[2]["runId"] != run["runId"]  # run twice, as a user would: a new trace, a new run


HOSTILE = [
    # What no encoder writes, in the places OTLP/JSON has strings, numbers and ids.
    json.dumps(_json_export(_json_span("ccccccccccccccc0", "\ud800", T0, T0 + 1, note="\udfff"))).encode(),
    json.dumps(_json_export(_json_span("0000000000000000", "\ud800", T0, T0 + 1))).encode(),
    json.dumps(_json_export(_json_span("ccccccccccccccc1", "n", T0, T0 + 1)))
    .replace('"startTimeUnixNano": "1', '"startTimeUnixNano": "-1')
    .encode(),
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
    + TRACE.encode()
    + b'", "spanId": "'
    + ROOT.encode()
    + b'", "attributes": [{"key": "x", "value": {"doubleValue": NaN}}, '
    b'{"key": "y", "value": {"intValue": 1e400}}]}]}]}]}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
    + TRACE.encode()
    + b'", "spanId": "'
    + ROOT.encode()
    + b'", "kind": 99, "status": {"code": 7}, "startTimeUnixNano": "99999999999999999999"}]}]}]}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
    + TRACE.encode()
    + b'", "spanId": "'
    + ROOT.encode()
    + b'", "attributes": [{"key": "k", "value": {"stringValue": "'
    + b"x" * 1_048_576
    + b'"}}]}]}]}]}',
    b'{"resourceSpans": [], "resourceSpans": [{"scopeSpans": "x"}]}',
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "'
    + TRACE.encode()
    + b'", "spanId": "'
    + ROOT.encode()
    + b'", "parentSpanId": "'
    + ROOT.encode()
    + b'"}]}]}]}',
    b"\xff\xfe not utf-8",
    b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "' + TRACE.encode() + b'"',
]


def test_hostile_bodies_are_never_a_server_error(
    server: Daphne, workspace: Workspace, key: str, settings: Any, daphne_artifacts: Path
) -> None:
    """Each answered 200 (what was valid written, the rest in partialSuccess) or a 4xx error body;
    whatever was written is a dense run that verifies (a megabyte attribute is an artifact)."""
    settings.ARTIFACTS_ROOT = daphne_artifacts
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as client:
        for body in HOSTILE:
            for content_type in ("application/json", "application/x-protobuf"):
                response = client.post(TRACES, content=body, headers={"Content-Type": content_type})
                assert response.status_code == 200 or (
                    400 <= response.status_code < 500 and "error" in response.json()
                ), (body[:200], response.text)
    for run in Run.objects.all():
        assert all(check.status == "pass" for check in verify_run(run)), [
            c for c in verify_run(run) if c.status != "pass"
        ]


@pytest.fixture(scope="module")
def second_server(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory, daphne_artifacts: Path
) -> Iterator[Daphne]:
    daphne = start_daphne(
        tmp_path_factory.mktemp("daphne2"), "otlp2", {"RUNLEDGER_ARTIFACTS_ROOT": str(daphne_artifacts)}
    )
    yield daphne
    daphne.stop()


def test_concurrent_exports_of_one_trace_write_each_span_once(
    server: Daphne, second_server: Daphne, workspace: Workspace, key: str
) -> None:
    """An exporter's retry racing its first attempt, and a second exporter of the same trace, sent to
    two server processes at once: the run's start and every span are decided under the run's lock,
    and a loser is mapped again."""
    memory = InMemorySpanExporter()
    trace = _agent_trace(_provider(memory))
    spans = memory.get_finished_spans()
    bodies = [_encode(spans[:3]), _encode(spans[:3]), _encode(spans), _encode(spans[2:5]), _encode(spans)]

    def post(item: tuple[int, bytes]) -> int:
        index, body = item
        return httpx.post(
            (server, second_server)[index % 2].url + TRACES,
            content=body,
            timeout=60,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"},
        ).status_code

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        assert list(pool.map(post, enumerate(bodies))) == [200] * len(bodies)
    run = _run(workspace, trace)
    events = selectors.events(run)
    keys = [e for e in Event.objects.filter(run=run).values_list("idempotency_key", flat=True)]
    assert len(keys) == len(set(keys)) == run.last_sequence == len(EXPECTED_TYPES)
    assert sorted(e["type"] for e in events) == sorted(EXPECTED_TYPES)
    assert events[0]["type"] == "RunStarted"
    assert all(check.status == "pass" for check in verify_run(run))


def _encode(spans: Any) -> bytes:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializeToString()
