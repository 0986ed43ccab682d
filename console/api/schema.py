"""OpenAPI in one place: the error body and error responses, the auth schemes, the shared
parameters, and the shapes the views return.

The output dicts come from ledger/reads/serialize.py (and ledger.replay.evidence, ledger.replay.stored_plan, ledger.reads.usage);
the serializers here only describe them for the schema, and tests/test_api_shapes.py checks that
each describes exactly the fields the code returns.
"""

from __future__ import annotations

import re
from typing import Any

from django.urls import resolve
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import serializers
from rest_framework.views import APIView

from ledger.fold.pricing import NO_PRICE, USAGE_NOT_REPORTED
from ledger.log.prepare import RUN_ID_RE
from ledger.models import RunStatus
from ledger.reads import attention


class FullMatchField(serializers.RegexField):
    """An id field whose pattern must match the whole value as sent: DRF's RegexValidator
    searches, `$` also matches before a trailing newline, and CharField trims whitespace, so
    "id\\n" would pass as "id". The pattern stays as written for the schema (ECMAScript has no `\\Z`)."""

    def __init__(self, regex: str, **kwargs: Any) -> None:
        super().__init__(regex, trim_whitespace=False, **kwargs)
        self.full = re.compile(regex)

    def to_internal_value(self, data: Any) -> str:
        value: str = super().to_internal_value(data)
        if not self.full.fullmatch(value):
            self.fail("invalid")
        return value


class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="snake_case, stable; clients branch on it")
    message = serializers.CharField(help_text="for a person")
    details = serializers.DictField(help_text="machine-readable specifics, e.g. index/field or expected/actual")


class ErrorSerializer(serializers.Serializer):
    error = ErrorBodySerializer()


STATUS_TEXT = {
    400: "Bad request",
    401: "No or unknown credentials",
    403: "Authenticated but not allowed",
    404: "Not found, or not in the caller's workspace (never 403)",
    406: "Not acceptable",
    409: "Conflict with the run's state",
    410: "Gone",
    413: "Request body over 10 MiB",
    415: "Unsupported media type",
    429: "Too many at once",
    500: "Server-side failure",
}


def _error_descriptions(codes: dict[str, str | list[str]]) -> dict[int, str]:
    """`e400=["code", "code (what details hold)"]`-style keywords -> {status: description}; 401
    is always added (every endpoint needs credentials)."""
    out: dict[int, str] = {}
    merged: dict[str, str | list[str]] = {"e401": ["unauthenticated"], **codes}
    for key, value in sorted(merged.items(), key=lambda kv: int(kv[0][1:])):
        status = int(key[1:])
        names = [value] if isinstance(value, str) else value
        shown = []
        for name in names:
            code, _, note = name.partition(" ")
            shown.append(f"`{code}` {note}".rstrip())
        out[status] = f"{STATUS_TEXT.get(status, '')}. Error codes: " + ", ".join(shown)
    return out


def error_responses(**codes: str | list[str]) -> dict[int, OpenApiResponse]:
    """The error responses of a DRF view, for `@extend_schema(responses=…)`."""
    return {
        status: OpenApiResponse(ErrorSerializer, description=description)
        for status, description in _error_descriptions(codes).items()
    }


def error_response_objects(**codes: str | list[str]) -> dict[str, dict[str, Any]]:
    """The same error responses as plain OpenAPI, for views described by a postprocessing hook."""
    schema = {"$ref": "#/components/schemas/Error"}
    return {
        str(status): {"description": description, "content": {"application/json": {"schema": schema}}}
        for status, description in _error_descriptions(codes).items()
    }


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A workspace API key (`manage.py ledger create-key`), scopes ingest/read/execute.",
        }


class ConsoleSessionScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.auth.CsrfSessionAuthentication"
    name = "consoleSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "apiKey",
            "in": "cookie",
            "name": "sessionid",
            "description": "The console's login session; unsafe methods also need the `X-CSRFToken` header "
            "(value of the `csrftoken` cookie). Members with several workspaces pass "
            "`?workspace=TENANT/WORKSPACE`.",
        }


# --- shapes: what ledger/reads/serialize.py returns, described for OpenAPI ------------------------


def enum(choices: list[str], **kwargs: Any) -> serializers.Field:
    """A string with fixed values, inlined in the schema (named enum components collide across modules)."""

    @extend_schema_field({"type": "string", "enum": list(choices)})
    class Enum(serializers.CharField):
        """Named only for drf-spectacular, which reads the inlined enum above."""

    return Enum(**kwargs)


def choice(choices: list[str], **kwargs: Any) -> serializers.Field:
    """An input restricted to fixed values (validated), inlined in the schema like `enum`."""

    @extend_schema_field({"type": "string", "enum": list(choices)})
    class Choice(serializers.ChoiceField):
        """Named only for drf-spectacular, which reads the inlined enum above."""

    return Choice(choices=list(choices), **kwargs)


class UsageSerializer(serializers.Serializer):
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField(help_text="part of inputTokens")
    reasoningTokens = serializers.IntegerField(help_text="part of outputTokens")
    costUsd = serializers.FloatField(
        allow_null=True, help_text="null only when every call is unpriced; 0 means no model calls"
    )
    pricedCalls = serializers.IntegerField()
    unpricedCalls = serializers.IntegerField(
        help_text="model calls without a cost: their model has no price, or their usage gave no input or output "
        "token count (usage not reported); priced coverage is pricedCalls / (pricedCalls + unpricedCalls)"
    )


class RunLinksSerializer(serializers.Serializer):
    console = serializers.CharField(help_text="console page, path on this host: /w/<tenant>/<workspace>/runs/<runId>/")
    evidence = serializers.CharField(help_text="path of the evidence bundle")
    events = serializers.CharField(help_text="path of the event log")


class AttentionSerializer(serializers.Serializer):
    kind = enum(list(attention.KINDS))
    since = serializers.DateTimeField(
        allow_null=True,
        help_text="when it began: the tool call's first event, the failed attempt's end, the request's creation",
    )
    detail = serializers.JSONField(
        help_text="tool_call_in_doubt: {callId, toolName, stepPath}; waiting_tool_approval: the same and "
        "argsDigest (what POST …/tool-calls/{callId}/approve binds to); retry_scheduled: {stepPath, attempt, "
        "retryAt, error: {name, message}}; reexecution_pending: {reexecutionId, mode, requestedBy}"
    )


class RunSerializer(serializers.Serializer):
    runId = FullMatchField(RUN_ID_RE.pattern)
    workflowVersionId = serializers.CharField(allow_null=True)
    status = enum(list(RunStatus.values))
    parentRunId = serializers.CharField(allow_null=True)
    rootRunId = serializers.CharField(
        allow_null=True, help_text="top of the parent chain; null for a run without parent"
    )
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)
    input = serializers.JSONField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    lastSequence = serializers.IntegerField()
    eventCount = serializers.IntegerField()
    usage = UsageSerializer()
    replayOf = serializers.CharField(allow_null=True)
    children = serializers.IntegerField(help_text="number of direct sub-runs")
    links = RunLinksSerializer()
    attention = AttentionSerializer(
        allow_null=True,
        help_text="what a person must do for the run to move on, or null; the most urgent when there are several",
    )
    cancelled = serializers.BooleanField(help_text="ended by a cancel; the reason is error.message")
    treeUsage = UsageSerializer(
        allow_null=True,
        help_text="usage summed over the run and every run below it, any depth (its own usage when it has no "
        "sub-runs); null only in a share link's bundle that leaves the sub-runs out",
    )


class RunListSerializer(serializers.Serializer):
    runs = RunSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="pass as ?cursor= for the next page; null on the last")


class EnvelopeSerializer(serializers.Serializer):
    eventId = serializers.CharField()
    runId = serializers.CharField()
    sequence = serializers.IntegerField(min_value=1)
    type = serializers.CharField()
    occurrenceId = serializers.CharField(required=False)
    recordedAt = serializers.CharField(help_text="ISO 8601 UTC with milliseconds, e.g. 2026-11-01T12:00:00.000Z")
    payload = serializers.JSONField()


class AppendedEnvelopeSerializer(EnvelopeSerializer):
    replayed = serializers.BooleanField(help_text="true when an idempotency key matched an event already written")


class EventsPageSerializer(serializers.Serializer):
    events = EnvelopeSerializer(many=True)
    lastSequence = serializers.IntegerField(help_text="the run's last sequence now")
    next = serializers.IntegerField(
        allow_null=True, help_text="the `after` of the next page; null when this page reaches lastSequence"
    )


class StepSerializer(serializers.Serializer):
    stepPath = serializers.CharField()
    status = serializers.CharField()
    visit = serializers.IntegerField(allow_null=True)
    attempts = serializers.JSONField()
    output = serializers.JSONField(allow_null=True)
    hasOutput = serializers.BooleanField(help_text="distinguishes an output of null from no output")
    outputRef = serializers.CharField(allow_null=True)
    artifactRefs = serializers.ListField(child=serializers.CharField())
    error = serializers.JSONField(allow_null=True)
    firstSequence = serializers.IntegerField()
    lastSequence = serializers.IntegerField()
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)
    usage = UsageSerializer()


class ToolCallSerializer(serializers.Serializer):
    callId = serializers.CharField()
    toolName = serializers.CharField(allow_null=True)
    args = serializers.JSONField(allow_null=True)
    caller = serializers.CharField(allow_null=True)
    turn = serializers.IntegerField(allow_null=True)
    stepPath = serializers.CharField(allow_null=True)
    status = serializers.CharField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    durationMs = serializers.FloatField(allow_null=True)
    reconciled = serializers.BooleanField()
    origin = serializers.CharField(allow_null=True)
    startedSequence = serializers.IntegerField(allow_null=True)
    endedSequence = serializers.IntegerField(allow_null=True)


class CostSerializer(serializers.Serializer):
    sequence = serializers.IntegerField()
    callId = serializers.CharField(allow_null=True)
    stepPath = serializers.CharField(allow_null=True)
    provider = serializers.CharField(allow_null=True)
    modelId = serializers.CharField(allow_null=True, help_text="the model the call named, as recorded")
    pricedAs = serializers.CharField(
        allow_null=True,
        help_text="the price table's entry that priced the call (provider/modelId: an alias or the model id "
        "without its date suffix, e.g. openai/gpt-4o for gpt-4o-2024-08-06); null: unpriced",
    )
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField()
    reasoningTokens = serializers.IntegerField()
    costUsd = serializers.FloatField(allow_null=True, help_text="null: unpriced, for the reason unpricedReason gives")
    unpricedReason = enum(
        [NO_PRICE, USAGE_NOT_REPORTED],
        allow_null=True,
        help_text="null: priced. no_price: the price table has no rate for the model; usage_not_reported: the "
        "recorded usage gave no inputTokens or outputTokens (e.g. an OpenAI stream without include_usage), so "
        "the cost is unknown whatever the price; the call still counts in unpricedCalls, with 0 tokens",
    )
    priceTableVersion = serializers.CharField()
    recordedAt = serializers.DateTimeField()


class ArtifactSerializer(serializers.Serializer):
    artifactId = serializers.CharField(help_text="art_<sha256>")
    sha256 = serializers.CharField()
    size = serializers.IntegerField()
    contentType = serializers.CharField()
    ref = serializers.CharField(help_text="artifact://art_<sha256>, as payloads reference it")
    createdAt = serializers.DateTimeField()


class EvidenceArtifactSerializer(serializers.Serializer):
    artifactId = serializers.CharField(
        help_text="art_<sha256>, the id GET /api/v1/artifacts/{artifactId} serves; "
        "for a missing ref, the id the ref names"
    )
    sha256 = serializers.CharField(
        allow_null=True,
        help_text="null for a missing ref of an imported Little Workflow log (its name does not hold the hash)",
    )
    size = serializers.IntegerField(allow_null=True, help_text="null when the artifact is missing")
    contentType = serializers.CharField(allow_null=True)
    ref = serializers.CharField(
        help_text="as the log references it: artifact://art_<sha256>, or an imported "
        "Little Workflow log's artifact://art_<16 hex>"
    )
    verified = serializers.BooleanField(help_text="its bytes were re-hashed now and match")


class FeedbackAuthorSerializer(serializers.Serializer):
    type = enum(["member", "apiKey"])
    name = serializers.CharField()


class FeedbackSerializer(serializers.Serializer):
    feedbackId = serializers.CharField(help_text="fb_ and 32 random hex digits, the same forever")
    runId = serializers.CharField()
    rating = serializers.IntegerField(min_value=1, max_value=5)
    category = serializers.CharField(allow_null=True)
    comment = serializers.CharField(allow_null=True)
    author = FeedbackAuthorSerializer(allow_null=True)
    createdAt = serializers.DateTimeField()


class CheckSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="dense_sequence, event_ids, artifact_hashes, projections, manifest_drift")
    status = enum(["pass", "fail"])
    detail = serializers.CharField()


class IntegritySerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    checks = CheckSerializer(many=True)


class ReplayReadySerializer(serializers.Serializer):
    status = serializers.CharField(help_text="pass | fail")
    missing = serializers.ListField(
        child=serializers.CharField(), help_text="what a replay would lack, e.g. tool:<callId>:result"
    )


class EvidenceSerializer(serializers.Serializer):
    run = RunSerializer()
    steps = StepSerializer(many=True, help_text="in order of first appearance in the log")
    toolCalls = ToolCallSerializer(many=True)
    artifacts = EvidenceArtifactSerializer(many=True, help_text="every artifact the log references")
    costs = CostSerializer(many=True, help_text="one per answered model call, in sequence order")
    approvals = serializers.ListField(
        child=serializers.JSONField(),
        help_text="the run's re-execution requests (asked of it, or the one that made it), each with its decision; shaped like GET /api/v1/reexecutions/{id} without plan, plus relation: of_this_run | made_this_run",
    )
    feedback = FeedbackSerializer(many=True)
    subRuns = RunSerializer(many=True, help_text="direct sub-runs, oldest first")
    usage = UsageSerializer()
    integrity = IntegritySerializer(help_text="ledger verify's checks plus the replay plan's manifest drift check")
    replayReady = ReplayReadySerializer()


class PlanCallSerializer(serializers.Serializer):
    kind = enum(["model", "tool"])
    turn = serializers.IntegerField(required=False)
    callId = serializers.CharField(required=False)
    action = enum(["replay", "reinvoke"])


class PlanSessionSerializer(serializers.Serializer):
    stepPath = serializers.CharField(allow_null=True)
    role = serializers.CharField(allow_null=True)
    calls = PlanCallSerializer(many=True)


class PlanStepSerializer(serializers.Serializer):
    stepPath = serializers.CharField()
    status = serializers.CharField()
    shouldRun = serializers.BooleanField(help_text='status != "completed"')
    visit = serializers.IntegerField(required=False)
    output = serializers.JSONField(required=False)
    outputRef = serializers.CharField(required=False)
    artifactRefs = serializers.ListField(child=serializers.CharField())


class PlanWaitingCallSerializer(serializers.Serializer):
    callId = serializers.CharField()
    toolName = serializers.CharField()
    stepPath = serializers.CharField(allow_null=True)
    args = serializers.JSONField(allow_null=True, help_text="the exact arguments an approver reviews")
    argsDigest = serializers.CharField(allow_null=True, help_text="what an approval binds to")


class ReplayPlanSerializer(serializers.Serializer):
    runId = serializers.CharField()
    steps = PlanStepSerializer(many=True)
    completedStepPaths = serializers.ListField(child=serializers.CharField())
    pendingStepPaths = serializers.ListField(child=serializers.CharField())
    sessions = PlanSessionSerializer(many=True)
    integrity = IntegritySerializer()
    replayReady = ReplayReadySerializer()
    waitingApproval = PlanWaitingCallSerializer(
        many=True,
        required=False,
        help_text="present only while tool calls wait for an approver: a resume stops at them until one decides",
    )


class UsageRowSerializer(UsageSerializer):
    key = serializers.CharField(
        allow_null=True,
        help_text="day YYYY-MM-DD, provider/modelId, workflowVersionId (null: none) or tenant/workspace",
    )


class UsageReportSerializer(serializers.Serializer):
    rows = UsageRowSerializer(many=True)
    total = UsageSerializer(help_text="over every row of the range, not only this page")
    next = serializers.CharField(allow_null=True)


RUN_ID = OpenApiParameter(
    "run_id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    pattern=RUN_ID_RE.pattern,
    description="runId; anything else is 400 `invalid_run_id`",
)
WORKSPACE = OpenApiParameter(
    "workspace",
    OpenApiTypes.STR,
    description=(
        "TENANT/WORKSPACE: for a console session, needed when the member has several workspaces and "
        "nothing else (the run, the request) decides; an API key may name only its own (any other, or "
        "one the member cannot see, is 404 not_found)"
    ),
)
LIMIT = OpenApiParameter("limit", OpenApiTypes.INT, description="page size, default 50, 1..500")
CURSOR = OpenApiParameter(
    "cursor",
    OpenApiTypes.STR,
    description="the `next` of the previous page, as given: sealed, it shows no row id and opens only for "
    "the list (and workspace, run or tenant) that gave it out, asked with the same filters and order (the "
    "limit may change); any other is 400 invalid_cursor",
)


# --- what every operation answers, declared once (a postprocessing hook) --------------------------

UNSAFE = ("post", "put", "patch", "delete")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _add_codes(responses: dict[str, Any], status: int, *codes: str) -> None:
    """Declare `codes` under `status` of an operation's responses, in error_responses' form."""
    key = str(status)
    if key not in responses:
        responses[key] = error_response_objects(**{f"e{status}": list(codes)})[key]
        return
    described = responses[key].setdefault("description", "")
    if "Error codes:" not in described:
        described = f"{described.rstrip('. ') or STATUS_TEXT.get(status, '')}. Error codes: "
        responses[key]["description"] = described + ", ".join(f"`{code}`" for code in codes)
        return
    declared = set(re.findall(r"`([a-z_]+)`", described.split("Error codes:", 1)[1]))
    missing = [f"`{code}`" for code in codes if code not in declared]
    if missing:
        responses[key]["description"] = described + ", " + ", ".join(missing)


def _negotiates(path: str) -> bool:
    """Whether the view of `path` (a schema path) leaves DRF's content negotiation as it is, so an
    `Accept` none of its renderers satisfies is 406; views that write their one representation
    themselves (a zip, NDJSON, CSV, bytes) force it, check Accept with base.require_accepted and
    declare their 406; a plain Django view describes its own answers."""
    view = getattr(resolve(re.sub(r"\{\w+\}", "x", path)).func, "cls", None)
    return view is not None and view.perform_content_negotiation is APIView.perform_content_negotiation


def conventions_hook(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: what every operation of /api/v1/ may answer besides its
    own errors, declared on each, and path parameters named as docs/api.md names them ({runId}).

    - 406 `not_acceptable`: an `Accept` no representation satisfies (DRF's negotiation, where the
      view keeps it);
    - 413 `payload_too_large` and 415 `unsupported_media_type`: an operation that takes a body
      (over 10 MiB however framed; a `Content-Type` it does not read), and 400 `invalid_json` for
      a JSON body that does not parse or names a key twice (the OTLP ingest's is `invalid_otlp`);
    - 403 `forbidden` on an unsafe method: a console session without the CSRF header.

    405 `method_not_allowed` belongs to no operation (it answers the methods a path does not list);
    the schema's description says so."""
    paths = result.get("paths", {})
    for path in list(paths):
        item = paths.pop(path)
        renamed = re.sub(r"\{(\w+)\}", lambda m: "{" + _camel(m.group(1)) + "}", path)
        paths[renamed] = item
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path":
                    parameter["name"] = _camel(parameter["name"])
            if not renamed.startswith("/api/v1/"):
                continue
            responses = operation.setdefault("responses", {})
            if _negotiates(path):
                _add_codes(responses, 406, "not_acceptable")
            if method in UNSAFE:
                _add_codes(responses, 403, "forbidden")
            if "requestBody" in operation:
                _add_codes(responses, 413, "payload_too_large")
                _add_codes(responses, 415, "unsupported_media_type")
                if not _reads_otlp(responses):  # OTLP's parser answers its own invalid_otlp
                    _add_codes(responses, 400, "invalid_json")
    return result


def _reads_otlp(responses: dict[str, Any]) -> bool:
    return "`invalid_otlp`" in responses.get("400", {}).get("description", "")
