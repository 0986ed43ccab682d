"""OTLP ingest's mapping decisions (docs/otlp.md), called in process on OTLP/JSON exports: what a
trace the log refuses, a span id sent twice, a broken parent link, clock skew and unusual number
shapes become. tests/test_otlp.py covers the same receiver end to end, through a live Daphne."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.interop.otlp import ingest as otlp_ingest
from ledger.interop.otlp.ingest import IngestResult, ingest
from ledger.interop.otlp.wire import from_otlp_json
from ledger.log import announce
from ledger.models import Event, Run, Workspace
from ledger.reads import selectors
from tests.otlp_support import json_span

pytestmark = pytest.mark.django_db

TRACE = "5b8efff798038103d269b633813fc60c"
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"
ROOT = "eee19b7ec3c1b174"
T0 = 1_764_547_200_000_000_000  # 2025-12-01T00:00:00Z


def span(
    span_id: str,
    name: str,
    start: int,
    end: int,
    parent: str = "",
    trace: str = TRACE,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return json_span(span_id, name, start, end, parent, trace, attributes)


def export(workspace: Workspace, *spans: dict[str, Any]) -> IngestResult:
    document = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
                "scopeSpans": [{"scope": {"name": "manual"}, "spans": list(spans)}],
            }
        ]
    }
    return ingest(workspace=workspace, request=from_otlp_json(document), by="key:test")


def tool(
    span_id: str, n: int, parent: str = ROOT, trace: str = TRACE, result: str = '{"ok": true}', name: str = "lookup"
) -> dict[str, Any]:
    return span(
        span_id,
        "execute_tool lookup",
        T0 + 10 * n + 1,
        T0 + 10 * n + 5,
        parent=parent,
        trace=trace,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.result": result,
        },
    )


def chat(span_id: str, start: int, end: int, parent: str = ROOT, **attributes: Any) -> dict[str, Any]:
    return span(
        span_id,
        "chat gpt-4o",
        start,
        end,
        parent=parent,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", **attributes},
    )


def run_of(workspace: Workspace, trace: str = TRACE) -> Run:
    return Run.objects.get(workspace=workspace, run_id=f"run_otel_{trace}")


# --- a trace is one append ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_trace_over_one_batch_is_written_whole_or_not_at_all(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace whose events fill several of the log's batches: a refusal in the last batch (a tool
    name longer than its column in the last span) writes none of them, and all the trace's spans are reported refused; the other
    trace of the export is written. A trace that passes is announced only once all of it commits."""
    monkeypatch.setattr(otlp_ingest, "MAX_BATCH", 10)
    sent: list[tuple[str, int, bool]] = []

    def send(group: str, message: dict[str, Any]) -> None:
        if message["type"] == "ledger.appended":
            logged = Event.objects.filter(run__run_id=message["runId"]).count()
            sent.append((message["runId"], logged, connection.in_atomic_block))

    def send_all(messages: Sequence[tuple[str, dict[str, Any]]]) -> None:  # every announcement's way out
        for group, message in messages:
            send(group, message)

    monkeypatch.setattr(announce, "_send_all", send_all)
    tools = [tool(f"{n + 1:016x}", n) for n in range(12)]  # 1 + 3 + 12 * 2 + 1 events: three batches
    tools[-1] = tool(f"{12:016x}", 11, name="t" * 201)
    good = [span("aaaaaaaaaaaaaaaa", "other", T0, T0 + 1, trace=OTHER_TRACE)]
    result = export(workspace, span(ROOT, "agent", T0, T0 + 1_000), *tools, *good)

    assert result.rejected == 13
    assert result.messages[0].startswith(f"trace {TRACE}: invalid_event: ")
    assert not Run.objects.filter(run_id=f"run_otel_{TRACE}").exists()
    assert not Event.objects.filter(run__run_id=f"run_otel_{TRACE}").exists()
    assert run_of(workspace, OTHER_TRACE).status == "completed"

    sent.clear()
    tools[-1] = tool(f"{12:016x}", 11)
    assert export(workspace, span(ROOT, "agent", T0, T0 + 1_000), *tools).rejected == 0
    run = run_of(workspace)
    assert run.status == "completed" and run.last_sequence == 29
    # Every batch announced after the one commit: a reader woken by any of them finds all 28 events.
    assert sent and all(s == (run.run_id, 29, False) for s in sent), sent


# --- span ids ------------------------------------------------------------------------------------


def test_a_span_id_sent_twice_with_other_content_is_refused_and_named(workspace: Workspace) -> None:
    model = chat("cccccccccccccccc", T0 + 1, T0 + 5, **{"gen_ai.usage.input_tokens": 10})
    other = {**tool("cccccccccccccccc", 1), "name": "execute_tool other"}
    result = export(workspace, span(ROOT, "agent", T0, T0 + 10), model, other)
    assert result.rejected == 1
    assert result.messages == [
        "span 2 ('execute_tool other'): spanId cccccccccccccccc is already in this export with other content"
    ]
    types = [e["type"] for e in selectors.events(run_of(workspace))]
    assert "harness.model.responded" in types and "harness.tool_call.started" not in types


def test_the_same_span_twice_in_one_export_is_written_once_without_a_word(workspace: Workspace) -> None:
    model = chat("cccccccccccccccc", T0 + 1, T0 + 5, **{"gen_ai.usage.input_tokens": 10})
    result = export(workspace, span(ROOT, "agent", T0, T0 + 10), model, model)
    assert (result.rejected, result.messages) == (0, [])
    assert run_of(workspace).input_tokens == 10


def test_a_self_parented_span_is_refused(workspace: Workspace) -> None:
    result = export(workspace, chat("cccccccccccccccc", T0, T0 + 5, parent="cccccccccccccccc"))
    assert result.rejected == 1
    assert result.messages == ["span 0 ('chat gpt-4o'): parentSpanId must not be the span's own id"]
    assert not Run.objects.exists()


def test_spans_in_a_parent_cycle_are_refused_and_their_children_kept(workspace: Workspace) -> None:
    """a → b → a: no root would ever end the run. The two are refused; a span under them, and the
    trace's real root, are written, and the root ends the run."""
    a = span("aaaaaaaaaaaaaaaa", "a", T0 + 1, T0 + 8, parent="bbbbbbbbbbbbbbbb")
    b = span("bbbbbbbbbbbbbbbb", "b", T0 + 2, T0 + 7, parent="aaaaaaaaaaaaaaaa")
    under = chat("cccccccccccccccc", T0 + 3, T0 + 6, parent="aaaaaaaaaaaaaaaa")
    result = export(workspace, a, b, under, span(ROOT, "agent", T0, T0 + 10))
    assert result.rejected == 2
    assert sorted(result.messages) == [
        "span aaaaaaaaaaaaaaaa ('a'): its parentSpanId links form a cycle",
        "span bbbbbbbbbbbbbbbb ('b'): its parentSpanId links form a cycle",
    ]
    run = run_of(workspace)
    assert run.status == "completed"
    written = {e["payload"]["otel"].get("spanId") for e in selectors.events(run)}
    assert written == {None, ROOT, "cccccccccccccccc"}  # None: RunStarted, which names the trace


# --- times -----------------------------------------------------------------------------------------


def test_a_span_that_ends_before_it_starts_ends_when_it_starts(workspace: Workspace) -> None:
    """Clock skew: the root ends 5 s before it starts, its calls too. The run, its step and its
    calls last 0, never less, wherever they are read."""
    second = 1_000_000_000
    result = export(
        workspace,
        span(ROOT, "agent", T0, T0 - 5 * second),
        chat("cccccccccccccccc", T0 + 1000, T0 - second, **{"gen_ai.usage.input_tokens": 3}),
        {**tool("dddddddddddddddd", 0), "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 - 2 * second)},
    )
    assert result.rejected == 0
    run = run_of(workspace)
    assert run.status == "completed"
    assert run.started_at is not None and run.finished_at == run.started_at
    step = run.steps.get()
    assert step.started_at is not None and step.finished_at == step.started_at
    events = {e["type"]: e["payload"] for e in selectors.events(run)}
    assert events["harness.tool_call.succeeded"]["durationMs"] == 0
    assert events["harness.model.responded"]["occurredAt"] == events["harness.model.called"]["occurredAt"]
    assert events["harness.model.responded"]["otel"]["endTimeUnixNano"] == str(T0 + 1000)
    assert events["RunCompleted"]["otel"]["endTimeUnixNano"] == str(T0)


# --- tokens ----------------------------------------------------------------------------------------


def test_token_counts_sent_as_integral_doubles_are_read_as_integers(workspace: Workspace) -> None:
    """1000.0 as a double (an SDK recording Python floats), {"doubleValue": 200.0} in OTLP/JSON:
    the counts they are. A fractional or negative count is no count."""
    model = chat(
        "cccccccccccccccc",
        T0 + 1,
        T0 + 5,
        **{
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.usage.input_tokens": 1000.0,
            "gen_ai.usage.output_tokens": {"doubleValue": 200.0},
            "gen_ai.usage.cache_read.input_tokens": 2.5,
            "gen_ai.usage.reasoning.output_tokens": -3.0,
        },
    )
    assert export(workspace, span(ROOT, "agent", T0, T0 + 10), model).rejected == 0
    responded = next(e for e in selectors.events(run_of(workspace)) if e["type"] == "harness.model.responded")
    assert responded["payload"]["response"]["usage"] == {"inputTokens": 1000, "outputTokens": 200}
    run = run_of(workspace)
    assert (run.input_tokens, run.output_tokens, run.cached_input_tokens, run.reasoning_tokens) == (1000, 200, 0, 0)


# --- OpenInference content parts -------------------------------------------------------------------


def _openinference_call(workspace: Workspace, trace: str, *contents: dict[str, Any]) -> dict[str, Any]:
    """An OpenInference LLM span whose one user message holds `contents`; its `harness.model.called`."""
    prefix = "llm.input_messages.0.message."
    attributes: dict[str, Any] = {
        "openinference.span.kind": "LLM",
        "llm.provider": "openai",
        "llm.model_name": "gpt-4o-mini",
        f"{prefix}role": "user",
    }
    for n, content in enumerate(contents):
        attributes.update({f"{prefix}contents.{n}.message_content.{k}": v for k, v in content.items()})
    root = span(ROOT, "root", T0, T0 + 10, trace=trace)
    call = span("cccccccccccccccc", "ChatCompletion", T0 + 1, T0 + 5, parent=ROOT, trace=trace, attributes=attributes)
    assert export(workspace, root, call).rejected == 0
    events = selectors.events(run_of(workspace, trace))
    return next(e["payload"] for e in events if e["type"] == "harness.model.called")


def test_openinference_images_are_kept_in_the_prompt_and_its_hash(workspace: Workspace) -> None:
    """An image by URL is a GenAI `uri` part, an inline one (a base64 data: URL) a `blob` part, as
    the GenAI conventions write media; two prompts that differ only in their image differ in hash."""
    text = {"type": "text", "text": "What is in this picture?"}
    cat = _openinference_call(
        workspace, TRACE, text, {"type": "image", "image.image.url": "https://example.invalid/cat.png"}
    )
    dog = _openinference_call(
        workspace, OTHER_TRACE, text, {"type": "image", "image.image.url": "data:image/png;base64,iVBORw0KGgo="}
    )
    assert cat["request"]["messages"] == [
        {
            "role": "user",
            "parts": [
                {"type": "text", "content": "What is in this picture?"},
                {"type": "uri", "modality": "image", "uri": "https://example.invalid/cat.png"},
            ],
        }
    ]
    assert dog["request"]["messages"][0]["parts"][1] == {
        "type": "blob",
        "modality": "image",
        "content": "iVBORw0KGgo=",
        "mime_type": "image/png",
    }
    assert cat["promptHash"] != dog["promptHash"]


def test_openinference_parts_of_other_kinds_are_kept_as_they_came(workspace: Workspace) -> None:
    called = _openinference_call(
        workspace,
        TRACE,
        {"type": "reasoning", "text": "The user wants a picture described."},
        {"type": "tool_use", "id": "tu_1"},
    )
    assert called["request"]["messages"][0]["parts"] == [
        {"type": "reasoning", "content": "The user wants a picture described."},
        {"type": "tool_use", "id": "tu_1"},
    ]


def test_turns_are_read_in_one_query_however_many_steps_an_export_names(workspace: Workspace) -> None:
    """An export holds model calls of many agents (a batch processor's 512 spans): the turns each
    step's calls already have were one scan of the run's log per step, minutes for one export of a
    long run, under the run's lock. Now one reading, and the turns go on from it."""
    step = "aaaaaaaaaaaaaaaa"
    assert export(workspace, chat("c000000000000001", T0 + 1, T0 + 2, parent=step)).rejected == 0
    statements = []
    for n, parents in enumerate((2, 12)):
        calls = [chat(f"d{n}{p:014d}", T0 + 3 + p, T0 + 4 + p, parent=f"e{n}{p:014d}") for p in range(parents)]
        calls.append(chat(f"f{n}{0:014d}", T0 + 100, T0 + 101, parent=step))
        with CaptureQueriesContext(connection) as queries:
            assert export(workspace, *calls).rejected == 0
        statements.append(len(queries))
    assert statements[0] == statements[1], statements
    turns = {
        (e["payload"].get("stepPath"), e["payload"]["callId"]): e["payload"]["turn"]
        for e in selectors.events(run_of(workspace))
        if e["type"] == "harness.model.called"
    }
    assert [t for (path, _), t in sorted(turns.items()) if path == f"span-{step}"] == [1, 2, 3]
    assert {t for (path, _), t in turns.items() if path != f"span-{step}"} == {1}


# --- concurrent exports ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_exports_of_one_trace_number_a_steps_turns_once(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two exports of one trace, each with model calls of the same step, the second arriving while
    the first is between its mapping (turns counted from the log) and its write: every call of the
    step still has a turn of its own."""
    step = "aaaaaaaaaaaaaaaa"
    assert export(workspace, chat("c000000000000001", T0 + 1, T0 + 2, parent=step)).rejected == 0
    first_mapped, second_done = threading.Event(), threading.Event()
    count_turns = otlp_ingest._turns

    def turns_then_wait(run: Run | None, spans: list[Any]) -> dict[str, int]:
        turns = count_turns(run, spans)
        if threading.current_thread().name == "first":
            first_mapped.set()
            second_done.wait(timeout=2)  # the second export's write, had it not waited for this one
        return turns

    monkeypatch.setattr(otlp_ingest, "_turns", turns_then_wait)
    results: dict[str, IngestResult] = {}
    failures: list[BaseException] = []

    def exporting(name: str, *spans: dict[str, Any]) -> None:
        try:
            if name == "second":
                assert first_mapped.wait(timeout=10)
            results[name] = export(workspace, *spans)
        except BaseException as exc:  # surfaced below with the thread's own traceback
            failures.append(exc)
        finally:
            if name == "second":
                second_done.set()
            connection.close()

    def calls(*numbers: int) -> list[dict[str, Any]]:  # call n from T0 + 2n - 1 to T0 + 2n
        return [chat(f"c{n:015d}", T0 + 2 * n - 1, T0 + 2 * n, parent=step) for n in numbers]

    threads = [
        threading.Thread(target=exporting, name=name, args=(name, *calls(n, n + 1)))
        for name, n in (("first", 2), ("second", 4))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    assert all(r.rejected == 0 for r in results.values()), results
    called = [e["payload"] for e in selectors.events(run_of(workspace)) if e["type"] == "harness.model.called"]
    assert sorted(p["turn"] for p in called) == [1, 2, 3, 4, 5]


# --- the export of what came in ----------------------------------------------------------------


def test_a_span_whose_attributes_became_an_artifact_leaves_with_them(workspace: Workspace) -> None:
    """A prompt past the inline limit moves the closing event's `otel` block to an artifact
    (`otelRef`); the run's OTLP export reads it back: the span keeps its attributes, name and times."""
    from ledger.interop.otlp.export import run_as_otlp

    prompt = '[{"role": "user", "parts": [{"type": "text", "content": "' + "x" * 300_000 + '"}]}]'
    sent = chat(
        "cccccccccccccccc",
        T0 + 1_000_000,
        T0 + 40_000_000,
        **{
            "gen_ai.input.messages": prompt,
            "gen_ai.response.finish_reasons": {"arrayValue": {"values": [{"stringValue": "stop"}]}},
        },
    )
    assert export(workspace, span(ROOT, "agent", T0, T0 + 50_000_000), sent).rejected == 0
    run = run_of(workspace)
    responded = next(e["payload"] for e in selectors.events(run) if e["type"] == "harness.model.responded")
    assert "otel" not in responded and responded["otelRef"].startswith("artifact://")  # what makes the case
    spans = run_as_otlp(run)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    exported = next(s for s in spans if s["spanId"] == "cccccccccccccccc")
    assert exported["name"] == "chat gpt-4o"
    assert (exported["startTimeUnixNano"], exported["endTimeUnixNano"]) == (str(T0 + 1_000_000), str(T0 + 40_000_000))
    attributes = {a["key"]: a["value"] for a in exported["attributes"]}
    assert attributes["gen_ai.input.messages"] == {"stringValue": prompt}
    assert "gen_ai.response.finish_reasons" in attributes


def test_an_error_type_written_as_a_python_class_repr_is_the_class_name(workspace: Workspace) -> None:
    """opentelemetry-instrumentation-openai-v2 writes `error.type` as "<class 'openai.RateLimitError'>"."""
    failed = {
        **span(ROOT, "agent", T0, T0 + 10, attributes={"error.type": "<class 'openai.RateLimitError'>"}),
        "status": {"code": 2, "message": "Error code: 429"},
    }
    assert export(workspace, failed).rejected == 0
    run = run_of(workspace)
    assert run.status == "failed"
    assert run.error == {"name": "openai.RateLimitError", "message": "Error code: 429"}
