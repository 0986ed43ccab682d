"""OTLP trace ingest: spans become ledger events, through the one write path (docs/otlp.md).

A trace is a run, `run_otel_<traceId hex>`, in the API key's workspace. Spans following the
OpenTelemetry GenAI semantic conventions map onto the vocabulary:

- a model span (`gen_ai.operation.name` chat, text_completion, generate_content, embeddings, or a
  span naming a `gen_ai.request.model` / `gen_ai.response.model`) is `harness.model.called` at its
  start and `harness.model.responded` (or `harness.model.failed`, status ERROR, with
  `requestLeft`: _request_left) at its end;
- a tool span (`execute_tool`, or one naming `gen_ai.tool.name`) is `harness.tool_call.started`
  and `.succeeded` / `.failed`, its callId `gen_ai.tool.call.id` (else the span id);
- the parent of a model or tool span, and every `invoke_agent` / `create_agent` span, is a step
  `span-<spanId hex>` (`StepScheduled` with the span's name as `stepId`, `StepAttemptStarted`,
  `StepCompleted` / `StepFailed`); model and tool events carry their parent's step path;
- the root span (no parent) ends the run: `RunCompleted`, or `RunFailed` for status ERROR;
- any other span is `custom.otel.span` with the whole span (attributes, events, status).

Ordering. Exporters send spans when they end, in batches, so children come before parents and a
trace may span several exports. The first export that names a trace starts its run
(`RunStarted {workflowVersionId: "otel:<service.name>"}`). Within one export a trace's events
follow its span tree depth first: a span's start events, then its children's (in order of start),
then its end events; the run's end last. Across exports the log
keeps arrival order; every event carries its span's `otel` timestamps. A span of a trace whose
root span has already ended (a late exporter) cannot change the finished run: a model call is
logged as usual but marked `late: true`, so the log takes it after the end and the fold counts its
cost; any other such span is kept as `custom.otel.span` with `late: true`.

Idempotency. A span's events have the keys `otel:<spanId>:<n>`, so a retried export (and every
span sent twice) writes nothing new. A span already in the log is not mapped again; a started
run's spans are mapped under its lock, and a batch that raced another export to start the run is
mapped again from the log's new state.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Case, CharField, Count, F, Value, When
from django.db.models.functions import Right, StrIndex, Substr
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from ...canonical import canonical_bytes
from ...errors import (
    IdempotencyConflict,
    LedgerError,
    NotFound,
    RunAlreadyStarted,
    RunFinished,
    RunNotStarted,
    SequenceConflict,
)
from ...limits import NUL, json_depth_exceeds, unique_object
from ...log import Head, append, holding
from ...log.prepare import MAX_BATCH
from ...log.vocabulary import MAX_TOKENS
from ...models import Event, Run, RunStatus, Step, Workspace

RUN_PREFIX = "run_otel_"
STEP_PREFIX = "span-"
RUN_STARTED_KEY = "otel:run"
MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "embeddings"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent"})
TOOL_OPERATION = "execute_tool"
# OpenInference (Arize Phoenix, and many LangChain / LlamaIndex users) names a span's kind instead.
OPENINFERENCE_KIND = "openinference.span.kind"
OPENINFERENCE_MODEL_KINDS = frozenset({"LLM", "EMBEDDING"})
OPENINFERENCE_HIDDEN = "__REDACTED__"  # what OpenInference records for content it was told to hide
# A failed model span's own word on whether its request left (a bool): our export writes it, and a
# harness that knows may set it; without it an error span counts as sent (_request_left).
REQUEST_LEFT = "runledger.request_left"
_MAX_SAFE_INT = 2**53 - 1  # canonical JSON (ECMAScript numbers) holds integers exactly up to here
REPLACEMENT = "\ufffd"  # what a NUL in a span's strings becomes
_ATTEMPTS = 3  # a batch mapped on a state another writer of the trace changed is mapped again


@dataclass
class IngestResult:
    """What an export did: spans written or already logged (`accepted`), spans refused with the
    reasons (`rejected`, `messages`), spans that came after their run ended (`late`: its model
    calls, `late_calls`, counted in the run, the others kept as `custom.otel.span`)."""

    accepted: int = 0
    rejected: int = 0
    late: int = 0
    late_calls: int = 0
    messages: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)

    def error_message(self) -> str:
        notes = list(self.messages[:5])
        if len(self.messages) > 5:
            notes.append(f"and {len(self.messages) - 5} more")
        if self.late:
            kept = self.late - self.late_calls
            notes.append(
                f"{self.late} span(s) arrived after their trace's root span ended: "
                + ", ".join(
                    [
                        *(
                            [f"{self.late_calls} model call(s) counted in the run as late calls"]
                            if self.late_calls
                            else []
                        ),
                        *([f"{kept} kept as custom.otel.span"] if kept else []),
                    ]
                )
            )
        return "; ".join(notes)


@dataclass
class _Span:
    trace: str  # hex
    span: str
    parent: str  # "" for a root span
    name: str
    kind: int
    start: int  # unix nanoseconds
    end: int
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    resource: dict[str, Any]
    scope: dict[str, Any]

    @property
    def operation(self) -> str | None:
        op = self.attributes.get("gen_ai.operation.name")
        return op if isinstance(op, str) else None

    @property
    def kind_of_openinference(self) -> str | None:
        kind = self.attributes.get(OPENINFERENCE_KIND)
        return kind.upper() if isinstance(kind, str) else None

    @property
    def is_model(self) -> bool:
        op = self.operation
        if op is not None:
            return op in MODEL_OPERATIONS
        oi = self.kind_of_openinference
        if oi is not None:
            return oi in OPENINFERENCE_MODEL_KINDS
        return "gen_ai.request.model" in self.attributes or "gen_ai.response.model" in self.attributes

    @property
    def is_tool(self) -> bool:
        op = self.operation
        if op is not None:
            return op == TOOL_OPERATION
        oi = self.kind_of_openinference
        return oi == "TOOL" if oi is not None else "gen_ai.tool.name" in self.attributes

    @property
    def is_agent(self) -> bool:
        return self.operation in AGENT_OPERATIONS or self.kind_of_openinference == "AGENT"

    @property
    def failed(self) -> bool:
        return self.status_code == Status.STATUS_CODE_ERROR

    def at(self, *, start: bool) -> dict[str, Any]:
        """`occurredAt` for an event at the span's start or end: the fold times runs and steps by
        it, so durations are the span's, not the moment the export arrived."""
        nanos = self.start if start else self.end
        return {"occurredAt": iso_time(nanos)} if nanos > 0 else {}

    def meta(self, *, at_start: bool) -> dict[str, Any]:
        """The span's identity and one of its two timestamps (int64 nanoseconds as strings, as
        OTLP/JSON writes them: they exceed what a JSON number holds exactly)."""
        out: dict[str, Any] = {"spanId": self.span, "name": self.name}
        if self.parent:
            out["parentSpanId"] = self.parent
        if at_start:
            out["startTimeUnixNano"] = str(self.start)
        else:
            out["endTimeUnixNano"] = str(self.end)
        return out

    def whole(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.meta(at_start=True),
            "endTimeUnixNano": str(self.end),
            "kind": self.kind,
            "status": {"code": self.status_code, **({"message": self.status_message} if self.status_message else {})},
            "attributes": self.attributes,
            "resource": self.resource,
            "scope": self.scope,
        }
        if self.events:
            out["events"] = self.events
        return out


def iso_time(nanos: int) -> str:
    """Unix nanoseconds as ISO 8601 UTC with microseconds (what `occurredAt` holds)."""
    seconds, rest = divmod(nanos, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{rest // 1000:06d}Z"


def run_id_for(trace_hex: str) -> str:
    return f"{RUN_PREFIX}{trace_hex}"


def step_path_for(span_hex: str) -> str:
    return f"{STEP_PREFIX}{span_hex}"


def ingest(*, workspace: Workspace, request: ExportTraceServiceRequest, by: str = "") -> IngestResult:
    """Write the export's spans into their runs, one append (one transaction) per trace. `by`: the
    caller (`key:<prefix>`, a username), recorded as who started a run the export starts."""
    result = IngestResult()
    traces: dict[str, dict[str, _Span]] = {}
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = {
                "name": _text(scope_spans.scope.name),
                **({"version": _text(scope_spans.scope.version)} if scope_spans.scope.version else {}),
            }
            for index, span in enumerate(scope_spans.spans):
                problem = _id_problem(span)
                if problem is not None:
                    result.rejected += 1
                    result.messages.append(f"span {index} ({span.name!r}): {problem}")
                    continue
                spans = traces.setdefault(span.trace_id.hex(), {})
                read = _read(span, resource, scope)
                kept = spans.setdefault(read.span, read)
                if kept is not read and kept != read:  # the same span sent twice counts once
                    result.rejected += 1
                    result.messages.append(
                        f"span {index} ({span.name!r}): spanId {span.span_id.hex()} is already in this export"
                        " with other content"
                    )
    for trace_hex, spans in traces.items():
        for span_hex in _in_cycles(spans):
            result.rejected += 1
            result.messages.append(
                f"span {span_hex} ({spans.pop(span_hex).name!r}): its parentSpanId links form a cycle"
            )
        if not spans:
            continue
        run_id = run_id_for(trace_hex)
        try:
            late, late_calls = _ingest_trace(workspace, run_id, list(spans.values()), by)
        except LedgerError as exc:
            result.rejected += len(spans)
            result.messages.append(f"trace {trace_hex}: {exc.code}: {exc.message}")
            continue
        result.accepted += len(spans)
        result.late += late
        result.late_calls += late_calls
        result.run_ids.append(run_id)
    return result


def _id_problem(span: Span) -> str | None:
    if len(span.trace_id) != 16 or not any(span.trace_id):
        return "traceId must be 16 bytes, not all zero"
    if len(span.span_id) != 8 or not any(span.span_id):
        return "spanId must be 8 bytes, not all zero"
    if span.parent_span_id and len(span.parent_span_id) != 8:
        return "parentSpanId must be empty or 8 bytes"
    if span.parent_span_id == span.span_id:
        return "parentSpanId must not be the span's own id"
    return None


def _in_cycles(spans: Mapping[str, _Span]) -> list[str]:
    """The spans whose parent links, followed through the export, come back to them: a broken
    exporter's trace that no root would ever end."""
    cyclic: dict[str, bool] = {}
    for first in spans:
        path: dict[str, int] = {}  # the spans walked from `first`, in order
        at = first
        while at in spans and at not in cyclic and at not in path:
            path[at] = len(path)
            at = spans[at].parent
        loop_from = path.get(at, len(path))
        cyclic.update((span, n >= loop_from) for span, n in path.items())
    return [span for span, is_cyclic in cyclic.items() if is_cyclic]


def _read(span: Span, resource: dict[str, Any], scope: dict[str, Any]) -> _Span:
    parent = span.parent_span_id.hex() if any(span.parent_span_id) else ""
    events = [
        {
            "name": _text(e.name),
            "timeUnixNano": str(e.time_unix_nano),
            **({"attributes": _attributes(e.attributes)} if e.attributes else {}),
        }
        for e in span.events
    ]
    start = int(span.start_time_unix_nano)
    return _Span(
        trace=span.trace_id.hex(),
        span=span.span_id.hex(),
        parent=parent,
        name=_text(span.name),
        kind=int(span.kind),
        start=start,
        # A span that ends before it starts (clock skew) ends when it starts: every reader of the
        # run (its finishedAt, a sort by duration, the waterfall) then sees the same zero duration.
        end=max(int(span.end_time_unix_nano), start),
        status_code=int(span.status.code),
        status_message=_text(span.status.message),
        attributes=_attributes(span.attributes),
        events=events,
        resource=resource,
        scope=scope,
    )


def _attributes(attributes: Iterable[KeyValue]) -> dict[str, Any]:
    return {_text(kv.key): _value(kv.value) for kv in attributes}


def _text(value: str) -> str:
    """A span's string with each U+0000 as U+FFFD: the log (PostgreSQL's jsonb) cannot hold a NUL,
    and refusing the string would refuse its whole trace, which an exporter does not report
    (docs/otlp.md "NUL characters")."""
    return value.replace(NUL, REPLACEMENT) if NUL in value else value


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "int_value":
        # Past 2^53 a JSON number would round: kept exact as a string, as OTLP/JSON does.
        return value.int_value if abs(value.int_value) <= _MAX_SAFE_INT else str(value.int_value)
    if kind == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else str(number)
    if kind == "string_value":
        return _text(value.string_value)
    return getattr(value, kind)


# --- one trace ----------------------------------------------------------------------------


def _ingest_trace(workspace: Workspace, run_id: str, spans: list[_Span], by: str = "") -> tuple[int, int]:
    """Append the trace's new spans, all in one transaction; returns how many were late, and how
    many of those were model calls. The
    mapping reads the log (spans already logged, steps, turns): for a started run it is made under
    the run's lock, so no other export of the trace moves the log between the reading and the
    writing. The export that starts the run expects an empty log: if another started it meanwhile
    (or ended it, or logged the same spans), nothing is written and the batch is mapped again."""
    for attempt in range(_ATTEMPTS):
        try:
            # Past one batch the slices share the transaction: a later slice's refusal takes the
            # earlier ones back, so a run is never half written with its spans reported refused.
            with transaction.atomic():
                try:
                    head: Head | None = holding(workspace=workspace, run_id=run_id)
                except NotFound:
                    head = None
                run = head.run if head is not None and head.run.last_sequence > 0 else None
                events, late, late_calls = _events_for(run, spans)
                for start in range(0, len(events), MAX_BATCH):
                    part = events[start : start + MAX_BATCH]
                    if head is not None and run is not None:
                        head.append(part, late_calls=True)
                    else:
                        expected = 0 if start == 0 else None
                        append(workspace=workspace, run_id=run_id, events=part, expected_sequence=expected, by=by)
        except (RunNotStarted, RunAlreadyStarted, RunFinished, IdempotencyConflict, SequenceConflict):
            if attempt == _ATTEMPTS - 1:
                raise
            continue
        return late, late_calls
    raise AssertionError("unreachable")  # pragma: no cover


def _events_for(run: Run | None, spans: list[_Span]) -> tuple[list[dict[str, Any]], int, int]:
    """The events of the spans not logged yet, how many of those spans came after the run ended and
    how many of them are model calls; `run`: the trace's run, locked, None when its log is empty
    (the events then start it)."""
    if run is not None:
        logged = set(
            Event.objects.filter(run=run, idempotency_key__in=[_key(s, 0) for s in spans]).values_list(
                "idempotency_key", flat=True
            )
        )
        spans = [s for s in spans if _key(s, 0) not in logged]
    if not spans:
        return [], 0, 0
    events: list[dict[str, Any]] = []
    if run is None:
        first = min(spans, key=lambda s: (s.start, s.span))
        service = first.resource.get("service.name")
        events.append(
            {
                "type": "RunStarted",
                "idempotencyKey": RUN_STARTED_KEY,
                "payload": {
                    "workflowVersionId": f"otel:{service if isinstance(service, str) and service else 'unknown'}",
                    **first.at(start=True),
                    "otel": {"traceId": first.trace, "resource": first.resource},
                },
            }
        )
    if run is not None and run.status in RunStatus.finished():
        return _late_events(run, spans), len(spans), sum(1 for s in spans if s.is_model)
    steps = _step_spans(run, spans)
    turns = _turns(run, spans)
    roots = [s for s in spans if not s.parent]
    # A trace has one root; another parentless span (a broken propagation) is kept, not a second end.
    root = min(roots, key=lambda s: (s.start, s.span)) if roots else None
    terminal: dict[str, Any] | None = None
    mapped: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
    for span in spans:
        begin, end = _span_events(span, steps, turns, is_root=span is root)
        if span is root:
            end.append(_run_terminal(span))
        for n, event in enumerate(begin + end):
            event["idempotencyKey"] = _key(span, n)
        if span is root:
            terminal = end.pop()
        mapped[span.span] = (begin, end)
    for span, opening in _walk(spans):
        events += mapped[span.span][0 if opening else 1]
    if terminal is not None:
        events.append(terminal)  # the run's end comes after everything the export says about it
    return events, 0, 0


def _late_events(run: Run, spans: list[_Span]) -> list[dict[str, Any]]:
    """The events of spans that arrived after their run ended, in order of start. A model call was
    made and may have been billed: its events are the usual ones marked `late: true`, which the log
    takes after the run's end and the fold counts (cost, tokens, the usage rollups); the run's
    status and end stay as its root span said. A call under a step the run has keeps its step path
    (the step's usage counts it too). Any other span is kept as `custom.otel.span` with `late: true`:
    a step or a tool call after the end would change a finished run's record."""
    parents = {step_path_for(s.parent): s.parent for s in spans if s.is_model and s.parent}
    steps = {
        parents[path]
        for path in Step.objects.filter(run=run, step_path__in=list(parents)).values_list("step_path", flat=True)
    }
    turns = _turns(run, spans, steps)
    events: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda s: (s.start, s.span)):
        if not span.is_model:
            events.append(
                {
                    "type": "custom.otel.span",
                    "idempotencyKey": _key(span, 0),
                    "payload": {"otel": span.whole(), "late": True, **span.at(start=True)},
                }
            )
            continue
        located = {"stepPath": step_path_for(span.parent)} if span.parent in steps else {}
        begin, end = _model_events(span, located, turns[span.span])
        for n, event in enumerate(begin + end):
            event["idempotencyKey"] = _key(span, n)
            event["payload"]["late"] = True
            events.append(event)
    return events


def _walk(spans: list[_Span]) -> Iterable[tuple[_Span, bool]]:
    """The spans depth first, each opened before and closed after the spans it holds, siblings in
    order of start: the nesting holds even where clocks give a parent and child the same instant.
    A span whose parent is not in this export starts a tree of its own."""
    ids = {s.span for s in spans}
    children: dict[str, list[_Span]] = {}
    for span in spans:
        children.setdefault(span.parent if span.parent in ids else "", []).append(span)
    for siblings in children.values():
        siblings.sort(key=lambda s: (s.start, -s.end, s.span), reverse=True)  # popped from the end
    # Spans in a parent cycle hang from no root (`ingest` refuses them): each would be taken as one.
    pending = sorted(
        (s for s in spans if s.parent in ids), key=lambda s: (s.start, s.span), reverse=True
    ) + children.get("", [])  # popped from the end: the roots first
    stack: list[tuple[_Span, bool]] = []
    seen: set[str] = set()
    while stack or pending:
        span, opening = stack.pop() if stack else (pending.pop(), True)
        if opening:
            if span.span in seen:
                continue
            seen.add(span.span)
            stack.append((span, False))
            stack += [(child, True) for child in children.get(span.span, [])]
        yield span, opening


def _key(span: _Span, n: int) -> str:
    return f"otel:{span.span}:{n}"


def _step_spans(run: Run | None, spans: list[_Span]) -> set[str]:
    """The spans that are steps: parents of model and tool spans, agent spans, and spans whose
    step an earlier export's children already named."""
    steps = {s.parent for s in spans if s.parent and (s.is_model or s.is_tool)}
    steps |= {s.span for s in spans if s.is_agent}
    if run is not None:
        paths = {step_path_for(s.span): s.span for s in spans if s.span not in steps}
        steps |= {
            paths[p]
            for p in Step.objects.filter(run=run, step_path__in=list(paths)).values_list("step_path", flat=True)
        }
    return steps


def _turns(run: Run | None, spans: list[_Span], steps: set[str] | None = None) -> dict[str, int]:
    """Each model span's turn: its rank by start time among the model spans of its step, after
    those an earlier export logged for that step. `steps`: the parents that are the calls' steps
    (late calls: the steps the run has), None for every parent."""
    models = sorted((s for s in spans if s.is_model), key=lambda s: (s.start, s.span))
    logged = _logged_calls(run) if run is not None and models else {}
    counts: dict[str, int] = {}
    turns: dict[str, int] = {}
    for span in models:
        path = step_path_for(span.parent) if span.parent and (steps is None or span.parent in steps) else ""
        counts[path] = counts.get(path, logged.get(path, 0)) + 1
        turns[span.span] = counts[path]
    return turns


_STEP_PATH_AT = '"stepPath":"'
_STEP_PATH_LENGTH = len(STEP_PREFIX) + 16  # span-<spanId hex>
# A call's canonical payload ends `"stepPath":"span-<hex>","turn":<n>}` (its keys sorted, `turn`
# the last): its own step path is in these last characters, and the JSON of its request, which
# comes before, cannot reach into them.
_PAYLOAD_END = len(_STEP_PATH_AT) + _STEP_PATH_LENGTH + len('","turn":}') + 16


def _logged_calls(run: Run) -> dict[str, int]:
    """How many model calls earlier exports logged per step path ("" for none), in one query: a
    count per step was one scan of the run's log for each parent in the export, so an export of
    many agents' calls took minutes, holding the run's lock."""
    end = Right("payload", _PAYLOAD_END)
    at = StrIndex(end, Value(_STEP_PATH_AT))
    path = Substr(end, F("at") + len(_STEP_PATH_AT), _STEP_PATH_LENGTH)
    rows = (
        Event.objects.filter(run=run, type="harness.model.called", idempotency_key__startswith="otel:")
        .annotate(at=at)
        .annotate(path=Case(When(at=0, then=Value("")), default=path, output_field=CharField()))
        .order_by()
        .values_list("path")
        .annotate(n=Count("pk"))
    )
    return dict(rows)


def _span_events(
    span: _Span, steps: set[str], turns: Mapping[str, int], *, is_root: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The events at the span's start and at its end."""
    begin: list[dict[str, Any]] = []
    end: list[dict[str, Any]] = []
    located = {"stepPath": step_path_for(span.parent)} if span.parent in steps else {}
    if span.span in steps:
        path = step_path_for(span.span)
        begin += [
            {
                "type": "StepScheduled",
                "payload": {
                    "stepPath": path,
                    "stepId": span.name,
                    **span.at(start=True),
                    "otel": span.meta(at_start=True),
                },
            },
            {"type": "StepAttemptStarted", "payload": {"stepPath": path, "attempt": 1, **span.at(start=True)}},
        ]
        closing = {
            "stepPath": path,
            "attempt": 1,
            **span.at(start=False),
            "otel": {**span.meta(at_start=False), "attributes": span.attributes},
        }
        end.append(
            {"type": "StepFailed", "payload": {**closing, "error": _error(span)}}
            if span.failed
            else {"type": "StepCompleted", "payload": closing}
        )
    if span.is_model:
        b, e = _model_events(span, located, turns[span.span])
    elif span.is_tool:
        b, e = _tool_events(span, located)
    elif span.span in steps or is_root:
        return begin, end  # a step or the run itself: nothing more to say about it
    else:
        b, e = [{"type": "custom.otel.span", "payload": {"otel": span.whole(), **located, **span.at(start=True)}}], []
    return begin + b, e + end


@dataclass
class _ModelCall:
    """What a model span says, whichever convention wrote it (GenAI or OpenInference)."""

    provider: str
    model_id: str
    request: dict[str, Any]
    usage: dict[str, int]
    output: Any  # the output messages, None when the span did not capture them
    response: dict[str, Any]  # id, finish reasons; `usageNotCounted`, why its counts were not taken
    choices: int = 1  # the choices asked for (`n`): past one, each output message is one of them


def _model_events(span: _Span, located: dict[str, Any], turn: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a = span.attributes
    call = _openinference_call(span) if span.kind_of_openinference is not None else _genai_call(span)
    called = {
        "turn": turn,
        "callId": span.span,
        "promptHash": _digest(call.request),
        "request": call.request,
        **located,
        **span.at(start=True),
        "otel": span.meta(at_start=True),
    }
    closing = {
        "turn": turn,
        "callId": span.span,
        **located,
        **span.at(start=False),
        "otel": {**span.meta(at_start=False), "attributes": a},
    }
    model = {"provider": call.provider, "modelId": call.model_id}
    if span.failed:
        failed = {**closing, "model": model, "error": _error(span), "requestLeft": _request_left(span)}
        return [{"type": "harness.model.called", "payload": called}], [
            {"type": "harness.model.failed", "payload": failed}
        ]
    response: dict[str, Any] = {"usage": call.usage}
    # Several choices (n > 1) are candidates for one answer: the call's text and tool calls are the
    # first's, as the client's wrappers read them; all of them stay in `messages`.
    first = call.output[:1] if call.choices > 1 and isinstance(call.output, list) else call.output
    text, tool_calls = _output_parts(first)
    if text is not None:
        response["text"] = text
    if tool_calls:
        response["toolCalls"] = tool_calls
    if call.output is not None:
        response["messages"] = call.output
    response.update(call.response)
    return [{"type": "harness.model.called", "payload": called}], [
        {"type": "harness.model.responded", "payload": {**closing, "model": model, "response": response}}
    ]


def _request_left(span: _Span) -> bool:
    """Whether a model span that ended in error may have sent its request, so the provider may bill
    it (the fold then counts a call of unknown cost, never $0: docs/operations.md § Prices). A
    model span wraps the SDK call that sends the request, and neither convention records whether
    it went out: an HTTP error, a timeout, a connection lost mid-answer and one refused before it
    all end the span with an error (OpenAI's SDK names the last two alike, APIConnectionError;
    some runtimes' HTTP clients raise a TypeError for a lost connection). So yes, unless the span
    says otherwise with `runledger.request_left` (docs/otlp.md)."""
    said = span.attributes.get(REQUEST_LEFT)
    return said if isinstance(said, bool) else True


def _named(value: Any) -> str:
    return value if isinstance(value, str) and value else "unknown"


def _genai_call(span: _Span) -> _ModelCall:
    a = span.attributes
    request: dict[str, Any] = {"operation": span.operation or "chat"}
    if isinstance(a.get("gen_ai.request.model"), str):
        request["model"] = a["gen_ai.request.model"]
    parameters = {
        k[len("gen_ai.request.") :]: v
        for k, v in a.items()
        if k.startswith("gen_ai.request.") and k != "gen_ai.request.model"
    }
    if parameters:
        request["parameters"] = parameters
    for source, target in (("gen_ai.input.messages", "messages"), ("gen_ai.system_instructions", "instructions")):
        if source in a:
            request[target] = _maybe_json(a[source])
    response: dict[str, Any] = {}
    for source, target in (("gen_ai.response.id", "id"), ("gen_ai.response.finish_reasons", "finishReasons")):
        if source in a:
            response[target] = a[source]
    usage, problem = _usage(a, _GENAI_USAGE)
    if problem is not None:
        response["usageNotCounted"] = problem
    return _ModelCall(
        provider=_named(a.get("gen_ai.provider.name") or a.get("gen_ai.system")),
        model_id=_named(a.get("gen_ai.response.model") or a.get("gen_ai.request.model")),
        request=request,
        usage=usage,
        output=_maybe_json(a["gen_ai.output.messages"]) if "gen_ai.output.messages" in a else None,
        response=response,
        choices=_choices(a.get("gen_ai.request.choice.count")),
    )


def _openinference_call(span: _Span) -> _ModelCall:
    """An OpenInference LLM or EMBEDDING span: `llm.model_name`, `llm.token_count.*`, the messages
    flattened into `llm.input_messages.<i>.message.*` (else the request in `input.value`)."""
    a = span.attributes
    embedding = span.kind_of_openinference == "EMBEDDING"
    request: dict[str, Any] = {"operation": "embeddings" if embedding else "chat"}
    requested = a.get("llm.request.model_name")
    parameters = _maybe_json(a.get("llm.invocation_parameters"))
    if isinstance(parameters, dict) and parameters:
        request["parameters"] = parameters
        requested = requested or parameters.get("model")
    if isinstance(requested, str) and requested:
        request["model"] = requested
    messages = _flattened_messages(a, "llm.input_messages.")
    if messages:
        request["messages"] = [_as_parts(m) for m in messages]
    elif "input.value" in a and a["input.value"] != OPENINFERENCE_HIDDEN:
        request["input"] = _maybe_json(a["input.value"])
    output = _flattened_messages(a, "llm.output_messages.")
    response: dict[str, Any] = {}
    if isinstance(a.get("llm.finish_reason"), str):
        response["finishReasons"] = [a["llm.finish_reason"]]
    usage, problem = _usage(a, _OPENINFERENCE_USAGE)
    if problem is not None:
        response["usageNotCounted"] = problem
    model = a.get("llm.model_name") or a.get("llm.response.model_name") or a.get("embedding.model_name") or requested
    return _ModelCall(
        provider=_named(a.get("llm.provider") or a.get("llm.system")),
        model_id=_named(model),
        request=request,
        usage=usage,
        output=[_as_parts(m) for m in output] if output else None,
        response=response,
        choices=_choices(parameters.get("n") if isinstance(parameters, dict) else None),
    )


def _choices(value: Any) -> int:
    """The number of choices a call asked for (OpenAI's `n`), 1 when it says none."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


# An index past nine digits is no message's (and int() refuses one past 4,300 digits).
_FLAT = re.compile(r"([0-9]{1,9})\.message\.(.+)")
_FLAT_TOOL_CALL = re.compile(r"tool_calls\.([0-9]{1,9})\.tool_call\.(.+)")
_FLAT_CONTENT = re.compile(r"contents\.([0-9]{1,9})\.message_content\.(.+)")
_FLATTENED_LISTS = ("tool_calls", "contents")  # gathered from their flattened keys, never taken whole


def _flattened_messages(a: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference's flattened messages (`<prefix><i>.message.role`, `.content`,
    `.tool_calls.<j>.tool_call.function.name`, …) as one object per message, in index order."""
    messages: dict[int, dict[str, Any]] = {}
    for key, value in a.items():
        if not key.startswith(prefix):
            continue
        matched = _FLAT.fullmatch(key[len(prefix) :])
        if matched is None:
            continue
        message = messages.setdefault(int(matched[1]), {})
        field_ = matched[2]
        if (call := _FLAT_TOOL_CALL.fullmatch(field_)) is not None:
            message.setdefault("tool_calls", {}).setdefault(int(call[1]), {})[call[2]] = value
        elif (part := _FLAT_CONTENT.fullmatch(field_)) is not None:
            message.setdefault("contents", {}).setdefault(int(part[1]), {})[part[2]] = value
        elif field_ not in _FLATTENED_LISTS:  # a whole `tool_calls` value would not be the dict read below
            message[field_] = value
    return [messages[i] for i in sorted(messages)]


def _as_parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenInference message in the GenAI message form (role and `parts`), so both conventions
    read the same everywhere: text and reasoning parts, media, tool calls, and a tool's answer."""
    parts: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str):
        kind = "tool_call_response" if message.get("role") == "tool" else "text"
        parts.append(
            {"type": kind, "response": message["content"]}
            if kind == "tool_call_response"
            else {"type": "text", "content": message["content"]}
        )
        if kind == "tool_call_response" and isinstance(message.get("tool_call_id"), str):
            parts[-1]["id"] = message["tool_call_id"]
    contents = message.get("contents")
    for _, content in sorted(contents.items()) if isinstance(contents, dict) else []:
        if content.get("type") in ("text", "reasoning") and isinstance(content.get("text"), str):
            parts.append({"type": content["type"], "content": content["text"]})
        elif content.get("type") != "text":
            parts.append(_content_part(content))
    calls = message.get("tool_calls")
    for _, call in sorted(calls.items()) if isinstance(calls, dict) else []:
        part: dict[str, Any] = {"type": "tool_call"}
        if isinstance(call.get("id"), str):
            part["id"] = call["id"]
        if isinstance(call.get("function.name"), str):
            part["name"] = call["function.name"]
        if "function.arguments" in call:
            part["arguments"] = _maybe_json(call["function.arguments"])
        parts.append(part)
    out: dict[str, Any] = {"role": message.get("role") if isinstance(message.get("role"), str) else "unknown"}
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    out["parts"] = parts
    return out


# A base64 data: URL (RFC 2397): its media type, then the content.
_DATA_URL = re.compile(r"data:([^;,]*)(?:;[^;,]*)*;base64,(.*)", re.S)


def _content_part(content: Mapping[str, Any]) -> dict[str, Any]:
    """A non-text OpenInference content part as the GenAI conventions write media: an image (audio,
    video, document) by URL is a `uri` part, one inline as a base64 data: URL a `blob` part. Any
    other part is kept with its flattened fields, so the prompt and its hash miss nothing."""
    kind = content.get("type")
    url = content.get(f"{kind}.{kind}.url")
    if not isinstance(kind, str) or not isinstance(url, str):
        return {
            "type": kind if isinstance(kind, str) else "unknown",
            **{k: v for k, v in content.items() if k != "type"},
        }
    mime = content.get(f"{kind}.{kind}.mime_type")
    inline = _DATA_URL.fullmatch(url)
    if inline is not None:
        mime = inline[1] or mime
        part: dict[str, Any] = {"type": "blob", "modality": kind, "content": inline[2]}
    else:
        part = {"type": "uri", "modality": kind, "uri": url}
    return {**part, **({"mime_type": mime} if isinstance(mime, str) and mime else {})}


_GENAI_USAGE = (
    ("gen_ai.usage.input_tokens", "inputTokens"),
    ("gen_ai.usage.output_tokens", "outputTokens"),
    ("gen_ai.usage.cache_read.input_tokens", "cachedInputTokens"),
    ("gen_ai.usage.reasoning.output_tokens", "reasoningTokens"),
)
# OpenInference's prompt count includes its cache reads and its completion count the reasoning,
# as the ledger's inputTokens and outputTokens do (DESIGN §4).
_OPENINFERENCE_USAGE = (
    ("llm.token_count.prompt", "inputTokens"),
    ("llm.token_count.completion", "outputTokens"),
    ("llm.token_count.prompt_details.cache_read", "cachedInputTokens"),
    ("llm.token_count.completion_details.reasoning", "reasoningTokens"),
)


_PRICED_COUNTS = ("inputTokens", "outputTokens")


def _usage(a: Mapping[str, Any], names: tuple[tuple[str, str], ...]) -> tuple[dict[str, int], str | None]:
    """The span's token counts as a usage object, and None. A count that is not one the ledger can
    take (past MAX_TOKENS, past 2^53 and so kept as a string, negative, a fraction) is no count; when
    that is the input or output count, no counts at all and the reason: the call is then unpriced,
    never priced on its other count alone (an understated cost). Without a cached or reasoning count
    the cost is the same or higher."""
    usage: dict[str, int] = {}
    for source, target in names:
        value = a.get(source)
        if value is None:
            continue
        # SDKs that record Python floats (or JavaScript numbers) send counts as doubles: 1000.0.
        if isinstance(value, float) and value.is_integer() and 0 <= value <= MAX_TOKENS:
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS:
            if target not in _PRICED_COUNTS:
                continue
            return {}, (
                f"{source} is {value!r}, not a token count from 0 to {MAX_TOKENS:,}: "
                "the call's usage is not counted and the call is not priced"
            )
        usage[target] = value
    return usage, None


def _output_parts(output: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The text and tool calls of the output messages (GenAI parts `text` and `tool_call`)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for message in output if isinstance(output, list) else []:
        parts = message.get("parts") if isinstance(message, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text" and isinstance(part.get("content"), str):
                texts.append(part["content"])
            elif part.get("type") == "tool_call":
                call: dict[str, Any] = {"callId": part.get("id"), "toolName": part.get("name")}
                if "arguments" in part:
                    call["args"] = part["arguments"]
                calls.append(call)
    return ("".join(texts) if texts else None), calls


def _tool_events(span: _Span, located: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A tool span's events; arguments and result only when the span captured them (GenAI's
    `gen_ai.tool.call.arguments` / `.result`, OpenInference's `input.value` / `output.value`)."""
    a = span.attributes
    openinference = span.kind_of_openinference is not None
    call_id = a.get("tool_call.id") if openinference else a.get("gen_ai.tool.call.id")
    call_id = call_id if isinstance(call_id, str) and call_id else span.span
    name = a.get("tool.name") if openinference else a.get("gen_ai.tool.name")
    args_at, result_at = ("input.value", "output.value") if openinference else _GENAI_TOOL_CONTENT
    # OPENINFERENCE_HIDE_INPUTS / _OUTPUTS write a placeholder in place of the content: none captured.
    captured = {k: a[k] for k in (args_at, result_at) if k in a and a[k] != OPENINFERENCE_HIDDEN}
    started = {
        "callId": call_id,
        "caller": "otel",
        "toolName": name if isinstance(name, str) and name else span.name,
        **({"args": _maybe_json(captured[args_at])} if args_at in captured else {}),
        **located,
        **span.at(start=True),
        "otel": span.meta(at_start=True),
    }
    closing = {
        "callId": call_id,
        "durationMs": max(0, span.end - span.start) / 1e6,
        **located,
        **span.at(start=False),
        "otel": {**span.meta(at_start=False), "attributes": a},
    }
    if span.failed:
        ended = {"type": "harness.tool_call.failed", "payload": {**closing, "error": _error(span)}}
    else:
        outcome = {"result": _maybe_json(captured[result_at])} if result_at in captured else {}
        ended = {"type": "harness.tool_call.succeeded", "payload": {**closing, **outcome}}
    return [{"type": "harness.tool_call.started", "payload": started}], [ended]


_GENAI_TOOL_CONTENT = ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result")


def _run_terminal(span: _Span) -> dict[str, Any]:
    otel = {**span.meta(at_start=False), "startTimeUnixNano": str(span.start), "attributes": span.attributes}
    times = {**span.at(start=False), **({"runStartedAt": iso_time(span.start)} if span.start > 0 else {})}
    if span.failed:
        return {"type": "RunFailed", "payload": {"error": _error(span), **times, "otel": otel}}
    return {"type": "RunCompleted", "payload": {**times, "otel": otel}}


# Python's repr of an exception class, which some instrumentations write as `error.type`
# (opentelemetry-instrumentation-openai-v2: "<class 'openai.RateLimitError'>"): the class's name.
_CLASS_REPR = re.compile(r"<class '([^']+)'>")


def _error(span: _Span) -> dict[str, Any]:
    """The span's error: `error.type` (GenAI), else its last `exception` event's `exception.type`
    (OpenInference and every `span.record_exception`: "openai.InternalServerError"); the status
    message, else that event's `exception.message`."""
    raised: dict[str, Any] = next(
        (e.get("attributes", {}) for e in reversed(span.events) if e["name"] == "exception"), {}
    )
    kind = span.attributes.get("error.type")
    if not (isinstance(kind, str) and kind):
        kind = raised.get("exception.type")
    if isinstance(kind, str) and (named := _CLASS_REPR.fullmatch(kind)) is not None:
        kind = named[1]
    said = raised.get("exception.message")
    return {
        "name": kind if isinstance(kind, str) and kind else "SpanError",
        "message": span.status_message
        or (said if isinstance(said, str) and said else f"span {span.name!r} ended with status ERROR"),
    }


def _maybe_json(value: Any) -> Any:
    """GenAI attributes hold structured values as JSON strings (messages, tool arguments). A text
    the log could not hold as JSON (NaN, an integer past a double, a lone surrogate, nesting past
    MAX_JSON_DEPTH, a key named twice) stays the string it came as: refusing it would refuse the
    span's whole trace, which exporters do not report (docs/otlp.md "JSON in attributes")."""
    if not (isinstance(value, str) and value[:1] in ("{", "[")) or json_depth_exceeds(value):
        return value
    try:
        parsed = json.loads(value, object_pairs_hook=unique_object, parse_constant=_no_constant)
        canonical_bytes(parsed)
    except (ValueError, RecursionError):  # DuplicateKey and NotCanonicalizable are ValueErrors
        return value
    # A NUL written as the escape \u0000 (a model's answer in gen_ai.output.messages) is one now.
    return _nul_replaced(parsed) if "\\u0000" in value else parsed


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _nul_replaced(value: Any) -> Any:
    """`value` with every string, and every object key, through _text."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, list):
        return [_nul_replaced(v) for v in value]
    if isinstance(value, dict):
        return {_text(k): _nul_replaced(v) for k, v in value.items()}
    return value


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()
