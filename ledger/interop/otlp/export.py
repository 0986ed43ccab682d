"""A run as OTLP/JSON spans, along the OpenTelemetry GenAI semantic conventions (docs/otlp.md).

One trace per run. Its id is the run's own for a run that came in over OTLP (`run_otel_<hex>`),
else the first 16 bytes of sha256 over the workspace path and the run id: the same run gives the
same trace every time, and two workspaces' equal run ids do not collide. Span ids are the event
ids' 16 hex digits (8 bytes, what a span id is), or the original span ids of ingested spans, so a
second export of the same run gives the same spans and re-ingesting it writes nothing twice.

Spans: the run (root), each step (child of the run), each model call (`chat <model>`, kind
CLIENT, child of its step or the run) and each tool call (`execute_tool <tool>`), and every
`custom.otel.span` as it came in. Other events are not spans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from ... import audit
from ...log import artifacts
from ...log.envelopes import read_envelopes
from ...models import ApiKey, Run
from .ingest import REQUEST_LEFT, RUN_PREFIX
from .wire import to_otlp_json

SCOPE_NAME = "runledger"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
_HEX = frozenset("0123456789abcdef")


def trace_id_for(run: Run) -> bytes:
    tail = run.run_id[len(RUN_PREFIX) :]
    if run.run_id.startswith(RUN_PREFIX) and len(tail) == 32 and set(tail) <= _HEX and tail != "0" * 32:
        return bytes.fromhex(tail)
    ws = run.workspace
    return hashlib.sha256(f"runledger\0{ws.tenant.slug}/{ws.slug}\0{run.run_id}".encode()).digest()[:16]


def export_run(*, run: Run, by: audit.Actor | ApiKey | AbstractBaseUser) -> dict[str, Any]:
    """The run as an OTLP/JSON ExportTraceServiceRequest, the export audited (`run.otlp_exported`)."""
    document = run_as_otlp(run)
    spans = document["resourceSpans"][0]["scopeSpans"][0]["spans"] if document["resourceSpans"] else []
    with transaction.atomic():
        ws = run.workspace
        audit.record(
            actor=by,
            tenant=ws.tenant,
            workspace=ws,
            action=audit.Action.RUN_OTLP_EXPORTED,
            target=run.run_id,
            details={"spans": len(spans), "traceId": trace_id_for(run).hex()},
        )
    return document


@dataclass
class _Open:
    """A span being assembled from its events."""

    span: Span
    attributes: dict[str, Any] = field(default_factory=dict)


def _as_recorded(run: Run, envelopes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The envelopes with every member the log moved to an artifact read back in place
    (artifacts.as_recorded): an ingested span's `otel` block (`otelRef`), a tool call's `args` and
    `result` (`argsRef`, `resultRef`), a model answer's `response.textRef`, `messages`,
    `toolCalls`, an older log's whole `responseRef`. An exported trace is the whole record. The
    bytes are re-hashed as they are read: one missing or changed is an IntegrityFailure, never a
    span quietly without them."""
    out = []
    for env in envelopes:
        payload = artifacts.as_recorded(run, env["type"], env["payload"])
        out.append(env if payload is env["payload"] else {**env, "payload": payload})
    return out


def run_as_otlp(run: Run) -> dict[str, Any]:
    envelopes = _as_recorded(run, read_envelopes(run))
    trace_id = trace_id_for(run)
    request = ExportTraceServiceRequest()
    if not envelopes:
        return to_otlp_json(request)
    builder = _Builder(trace_id)
    started = envelopes[0]
    otel = started["payload"].get("otel") if isinstance(started["payload"].get("otel"), Mapping) else {}
    resource = otel.get("resource") if isinstance(otel.get("resource"), Mapping) else None
    for env in envelopes:
        builder.add(env)
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(
        _key_values(
            resource
            or {"service.name": "runledger", "runledger.workspace": f"{run.workspace.tenant.slug}/{run.workspace.slug}"}
        )
    )
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = SCOPE_NAME
    scope_spans.schema_url = SCHEMA_URL
    scope_spans.spans.extend(builder.finish(run, envelopes[-1]))
    return to_otlp_json(request)


class _Builder:
    def __init__(self, trace_id: bytes) -> None:
        self.trace_id = trace_id
        self.root = Span(trace_id=trace_id)
        self.root_attributes: dict[str, Any] = {}
        self.steps: dict[str, _Open] = {}
        self.models: list[_Open] = []
        self.open_models: dict[str, _Open] = {}  # callId -> the call's span
        self.tools: dict[str, _Open] = {}
        self.other: list[Span] = []

    # --- events --------------------------------------------------------------------------

    def add(self, env: Mapping[str, Any]) -> None:
        kind, p = env["type"], env["payload"]
        at = _nanos(env["recordedAt"])
        otel = p.get("otel") if isinstance(p.get("otel"), Mapping) else {}
        if kind == "RunStarted":
            self.root.span_id = _span_id(env["eventId"])
            self.root.start_time_unix_nano = at
            self.root.name = str(p.get("label") or p.get("workflowVersionId") or env["runId"])
        elif kind in ("RunCompleted", "RunFailed"):
            self._end_run(env, at, otel)
        elif kind == "custom.otel.span" and (span_id := _hex_id(otel.get("spanId"))) is not None:
            self.other.append(self._restored(otel, span_id))
        elif kind.startswith("Step") and isinstance(p.get("stepPath"), str):
            self._step(kind, p, env, at, otel)
        elif kind == "harness.model.called":
            self._model_called(p, env, at, otel)
        elif kind in ("harness.model.responded", "harness.model.failed"):
            self._model_ended(kind, p, env, at, otel)
        elif kind == "harness.tool_call.started":
            self._tool_started(p, env, at, otel)
        elif kind in ("harness.tool_call.succeeded", "harness.tool_call.failed"):
            self._tool_ended(kind, p, env, at, otel)

    def _end_run(self, env: Mapping[str, Any], at: int, otel: Mapping[str, Any]) -> None:
        self.root.end_time_unix_nano = _otel_time(otel, "endTimeUnixNano") or at
        if (root_id := _hex_id(otel.get("spanId"))) is not None:
            self.root.span_id = root_id
            self.root.name = str(otel.get("name") or self.root.name)
            self.root.start_time_unix_nano = _otel_time(otel, "startTimeUnixNano") or self.root.start_time_unix_nano
            self.root_attributes.update(_mapping(otel.get("attributes")))
        if env["type"] == "RunFailed":
            self.root.status.code = Status.STATUS_CODE_ERROR
            self.root.status.message = _error_message(env["payload"].get("error"))

    def _step(self, kind: str, p: Mapping[str, Any], env: Mapping[str, Any], at: int, otel: Mapping[str, Any]) -> None:
        path = p["stepPath"]
        step = self.steps.get(path)
        if step is None:
            step = _Open(
                Span(
                    trace_id=self.trace_id,
                    span_id=_span_id(env["eventId"]),
                    name=str(p.get("stepId") or path),
                    kind=Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=at,
                )
            )
            step.attributes["runledger.step.path"] = path
            self.steps[path] = step
        if (span_id := _hex_id(otel.get("spanId"))) is not None:
            step.span.span_id = span_id
            step.span.parent_span_id = _hex_id(otel.get("parentSpanId")) or b""
        if kind == "StepScheduled" and p.get("stepId"):
            step.span.name = str(p["stepId"])
        step.span.start_time_unix_nano = _otel_time(otel, "startTimeUnixNano") or step.span.start_time_unix_nano
        if kind in ("StepCompleted", "StepFailed"):
            step.span.end_time_unix_nano = _otel_time(otel, "endTimeUnixNano") or at
            step.attributes.update(_mapping(otel.get("attributes")))
            step.attributes["runledger.step.path"] = path
            if kind == "StepFailed":
                step.span.status.code = Status.STATUS_CODE_ERROR
                step.span.status.message = _error_message(p.get("error"))

    def _child(
        self, env: Mapping[str, Any], p: Mapping[str, Any], at: int, otel: Mapping[str, Any], name: str, kind: Any
    ) -> Span:
        span = Span(
            trace_id=self.trace_id,
            span_id=_hex_id(otel.get("spanId")) or _span_id(env["eventId"]),
            name=str(otel.get("name") or name),
            kind=kind,
            start_time_unix_nano=_otel_time(otel, "startTimeUnixNano") or at,
        )
        path = p.get("stepPath")
        if isinstance(path, str):
            self._step("", p, env, at, {})  # a step known only from its calls still gets its span
            span.parent_span_id = self.steps[path].span.span_id
        return span

    def _model_called(self, p: Mapping[str, Any], env: Mapping[str, Any], at: int, otel: Mapping[str, Any]) -> None:
        request = _mapping(p.get("request"))
        operation = str(request.get("operation") or "chat")
        model = request.get("model")
        call = _Open(
            self._child(env, p, at, otel, f"{operation} {model}" if model else operation, Span.SPAN_KIND_CLIENT)
        )
        call.attributes["gen_ai.operation.name"] = operation
        if isinstance(model, str):
            call.attributes["gen_ai.request.model"] = model
        if isinstance(p.get("turn"), int):
            call.attributes["runledger.turn"] = p["turn"]
        self.models.append(call)
        self.open_models[str(p.get("callId") or f"{p.get('stepPath')}#{p.get('turn')}")] = call

    def _model_ended(
        self, kind: str, p: Mapping[str, Any], env: Mapping[str, Any], at: int, otel: Mapping[str, Any]
    ) -> None:
        key = str(p.get("callId") or f"{p.get('stepPath')}#{p.get('turn')}")
        call = self.open_models.pop(key, None)
        if call is None:
            call = _Open(self._child(env, p, at, otel, "chat", Span.SPAN_KIND_CLIENT))
            call.attributes["gen_ai.operation.name"] = "chat"
            self.models.append(call)
        call.span.end_time_unix_nano = _otel_time(otel, "endTimeUnixNano") or at
        original = _mapping(otel.get("attributes"))
        call.attributes = {**call.attributes, **original}
        model = _mapping(p.get("model"))
        provider, model_id = model.get("provider"), model.get("modelId")
        if isinstance(provider, str) and provider != "unknown":
            call.attributes.setdefault("gen_ai.provider.name", provider)
            call.attributes.setdefault("gen_ai.system", provider)  # the name before semantic conventions 1.37
        if isinstance(model_id, str) and model_id != "unknown":
            call.attributes.setdefault("gen_ai.request.model", model_id)
            call.attributes.setdefault("gen_ai.response.model", model_id)
            if "name" not in otel:
                call.span.name = f"{call.attributes['gen_ai.operation.name']} {model_id}"
        if kind == "harness.model.failed":
            call.span.status.code = Status.STATUS_CODE_ERROR
            call.span.status.message = _error_message(p.get("error"))
            if isinstance(p.get("requestLeft"), bool):  # so the span ingests as the call it was
                call.attributes.setdefault(REQUEST_LEFT, p["requestLeft"])
            return
        response = _mapping(p.get("response"))
        usage = _mapping(response.get("usage"))
        for source, target in (
            ("inputTokens", "gen_ai.usage.input_tokens"),
            ("outputTokens", "gen_ai.usage.output_tokens"),
            ("cachedInputTokens", "gen_ai.usage.cache_read.input_tokens"),
            ("reasoningTokens", "gen_ai.usage.reasoning.output_tokens"),
        ):
            if isinstance(usage.get(source), int) and not isinstance(usage.get(source), bool):
                call.attributes.setdefault(target, usage[source])
        if isinstance(response.get("id"), str):
            call.attributes.setdefault("gen_ai.response.id", response["id"])
        output = _output_messages(response) if not original else []  # an ingested span: its own attributes
        if output:
            call.attributes.setdefault("gen_ai.output.messages", _json_text(output))

    def _tool_started(self, p: Mapping[str, Any], env: Mapping[str, Any], at: int, otel: Mapping[str, Any]) -> None:
        name = str(p.get("toolName") or "tool")
        call = _Open(self._child(env, p, at, otel, f"execute_tool {name}", Span.SPAN_KIND_INTERNAL))
        call.attributes.update(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": str(p.get("callId") or ""),
            }
        )
        if "args" in p:  # arguments nobody captured are not exported as `{}`
            call.attributes["gen_ai.tool.call.arguments"] = _json_text(p["args"])
        self.tools[str(p.get("callId"))] = call

    def _tool_ended(
        self, kind: str, p: Mapping[str, Any], env: Mapping[str, Any], at: int, otel: Mapping[str, Any]
    ) -> None:
        call = self.tools.get(str(p.get("callId")))
        if call is None:
            return  # an end without a start (a log cut by retention) has no span to close
        call.span.end_time_unix_nano = _otel_time(otel, "endTimeUnixNano") or at
        call.attributes = {**call.attributes, **_mapping(otel.get("attributes"))}
        if kind == "harness.tool_call.failed":
            call.span.status.code = Status.STATUS_CODE_ERROR
            call.span.status.message = _error_message(p.get("error"))
            error = _mapping(p.get("error"))
            if isinstance(error.get("name"), str):
                call.attributes.setdefault("error.type", error["name"])
        elif "result" in p:
            call.attributes.setdefault("gen_ai.tool.call.result", _json_text(p.get("result")))

    def _restored(self, otel: Mapping[str, Any], span_id: bytes) -> Span:
        span = Span(
            trace_id=self.trace_id,
            span_id=span_id,
            name=str(otel.get("name", "")),
            kind=cast(Any, _enum(otel.get("kind"), 5)),
            start_time_unix_nano=_otel_time(otel, "startTimeUnixNano"),
            end_time_unix_nano=_otel_time(otel, "endTimeUnixNano"),
            parent_span_id=_hex_id(otel.get("parentSpanId")) or b"",
        )
        status = _mapping(otel.get("status"))
        span.status.code = cast(Any, _enum(status.get("code"), 2))
        span.status.message = str(status.get("message") or "")
        span.attributes.extend(_key_values(_mapping(otel.get("attributes"))))
        events = otel.get("events")
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, Mapping):
                continue
            added = span.events.add()
            added.name = str(event.get("name", ""))
            added.time_unix_nano = _otel_time(event, "timeUnixNano")
            added.attributes.extend(_key_values(_mapping(event.get("attributes"))))
        return span

    # --- the spans -----------------------------------------------------------------------

    def finish(self, run: Run, last: Mapping[str, Any]) -> list[Span]:
        """Every span, parents before children; spans still open end at the log's last event."""
        last_at = _nanos(last["recordedAt"])
        if not self.root.end_time_unix_nano:
            self.root.end_time_unix_nano = last_at
        self.root_attributes.update({"runledger.run.id": run.run_id, "runledger.run.status": run.status})
        if run.workflow_version_id:
            self.root_attributes["runledger.workflow_version_id"] = run.workflow_version_id
        self.root.attributes.extend(_key_values(self.root_attributes))
        out = [self.root]
        seen = {self.root.span_id}
        for opened in [*self.steps.values(), *self.models, *self.tools.values()]:
            span = opened.span
            if span.span_id in seen:
                continue  # the root span of an ingested trace that was also a step is the run's span
            seen.add(span.span_id)
            if not span.parent_span_id or span.parent_span_id == span.span_id:
                span.parent_span_id = self.root.span_id
            if not span.end_time_unix_nano:
                span.end_time_unix_nano = max(last_at, span.start_time_unix_nano)
            span.attributes.extend(_key_values(opened.attributes))
            out.append(span)
        out += [s for s in self.other if s.span_id not in seen]
        return out


def _span_id(event_id: str) -> bytes:
    return bytes.fromhex(event_id[len("evt_") :])


def _nanos(recorded_at: str) -> int:
    moment = datetime.fromisoformat(recorded_at.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _otel_time(otel: Mapping[str, Any], name: str) -> int:
    """A fixed64 nanosecond time an event recorded (a string, or a number), else 0."""
    value = otel.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return 0
    try:
        number = int(value)
    except ValueError:
        return 0
    return number if 0 <= number < 2**64 else 0


def _hex_id(value: Any) -> bytes | None:
    """An 8-byte span id from its 16 hex digits as ingest records it; None for anything else
    (a custom event anyone may append can hold any `otel`)."""
    if not isinstance(value, str) or len(value) != 16 or not set(value) <= _HEX or value == "0" * 16:
        return None
    return bytes.fromhex(value)


def _enum(value: Any, last: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= last else 0


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _error_message(error: Any) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error.get("name") or "")
    return "" if error is None else str(error)


def _output_messages(response: Mapping[str, Any]) -> list[Any]:
    """The answer as GenAI output messages: the recorded `messages` when they are a list, else one
    assistant message of its text and tool calls (parts `text`, `tool_call`); [] without either."""
    if isinstance(response.get("messages"), list):
        return list(response["messages"])
    parts: list[dict[str, Any]] = []
    if isinstance(response.get("text"), str):
        parts.append({"type": "text", "content": response["text"]})
    calls = response.get("toolCalls")
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, Mapping):
            part = {
                "type": "tool_call",
                "id": call.get("id", call.get("callId")),
                "name": call.get("name", call.get("toolName")),
            }
            if "args" in call:
                part["arguments"] = call["args"]
            parts.append(part)
    if not parts:
        return []
    message: dict[str, Any] = {"role": "assistant", "parts": parts}
    reasons = response.get("finishReasons")
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        message["finish_reason"] = reasons[0]
    return [message]


def _json_text(value: Any) -> str:
    return (
        value
        if isinstance(value, str)
        else json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    )


def _key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=str(k), value=_any(v)) for k, v in attributes.items()]


def _any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value) if -(2**63) <= value < 2**63 else AnyValue(string_value=str(value))
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list):
        out = AnyValue()
        out.array_value.values.extend(_any(v) for v in value)
        return out
    if isinstance(value, Mapping):
        out = AnyValue()
        out.kvlist_value.values.extend(_key_values(value))
        return out
    return AnyValue()
