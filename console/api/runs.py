"""/api/v1/ runs, events, evidence, replay plans, artifacts, feedback and usage (API.md).

One small view per operation: check the run id, find the caller and its workspace, call a
selector or service, shape the answer with ledger.serialize. Everything outside the caller's
workspace is 404 (selectors raise NotFound), never 403.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from datetime import date, datetime, timedelta
from typing import Any

from django.http import FileResponse, HttpResponse
from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import selectors, serialize
from ledger.append import RUN_ID_RE, append_events, validate_run_id
from ledger.artifacts import open_verified
from ledger.errors import LedgerError, NotFound
from ledger.evidence import evidence_bundle
from ledger.feedback import record_feedback
from ledger.models import ApiKey, Artifact, Run, RunStatus, Tenant, Workspace
from ledger.plans import replay_plan_for
from ledger.usage import GROUPINGS, usage_rows

from .auth import Caller, RoleRequired, WorkspaceRequired, caller_for
from .pagination import InvalidCursor, InvalidParameter, decode_cursor, encode_cursor, int_param, limit_param
from .schema import error_responses


class InvalidRequest(LedgerError):
    code = "invalid_request"


# --- rendering -----------------------------------------------------------------------------


class NdjsonRenderer(BaseRenderer):
    """One JSON document per line (events); an error envelope is a single line."""

    media_type = "application/x-ndjson"
    format = "ndjson"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        items = data if isinstance(data, list) else [data]
        return b"".join(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
                        for item in items)


CSV_COLUMNS = ["key", "inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens", "costUsd",
               "pricedCalls", "unpricedCalls"]


class CsvRenderer(BaseRenderer):
    """Usage rows as CSV with a header line; an unpriced cost is an empty cell."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for row in data if isinstance(data, list) else []:
            writer.writerow(["" if row.get(c) is None else _csv_cell(row[c]) for c in CSV_COLUMNS])
        return out.getvalue().encode()


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.12f}".rstrip("0").rstrip(".") or "0"
    return str(value)


class _Negotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:
        matching = [r for r in renderers if r.format == format]
        if not matching:
            raise InvalidParameter(f"format must be one of {', '.join(r.format for r in renderers)}",
                                   parameter="format")
        return matching


class _ApiView(APIView):
    content_negotiation_class = _Negotiation

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        # Errors are always the JSON envelope, whatever representation was asked for.
        if isinstance(response, Response) and response.status_code >= 400 \
                and not isinstance(response.accepted_renderer, JSONRenderer):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response


# --- helpers -------------------------------------------------------------------------------


def _run_for(request: Request, run_id: str, scope: str) -> tuple[Caller, Run]:
    # The id is checked before any lookup: a malformed id is the client's mistake, not a missing run.
    validate_run_id(run_id)
    caller = caller_for(request, scope, run_id=run_id)
    run = selectors.get_run(caller.workspace, run_id)
    run.workspace = caller.workspace  # already loaded with its tenant
    return caller, run


def _runs_page(request: Request, workspace: Workspace, **filters: Any) -> dict[str, Any]:
    limit = limit_param(request)
    cursor = decode_cursor(request)
    after = None
    if cursor is not None:
        try:
            after = (datetime.fromisoformat(cursor["t"]), int(cursor["id"]))
        except (KeyError, TypeError, ValueError):
            raise InvalidCursor("cursor is not one this API gave out") from None
    page, more = selectors.runs_page(selectors.filtered_runs(workspace, **filters), limit=limit, after=after)
    for row in page:
        row.workspace = workspace
    counts = selectors.children_counts(workspace, [r.run_id for r in page])
    last = page[-1] if page else None
    next_cursor = encode_cursor({"t": last.created_at.isoformat(), "id": last.pk}) if more and last else None
    return {"runs": serialize.runs(page, counts), "next": next_cursor}


def _date_param(request: Request, name: str, default: date) -> date:
    raw = request.query_params.get(name)
    if not raw:
        return default
    try:
        return date.fromisoformat(raw) if len(raw) == 10 else _bad_date(name)
    except ValueError:
        return _bad_date(name)


def _bad_date(name: str) -> date:
    raise InvalidParameter(f"{name} must be a date YYYY-MM-DD", parameter=name)


# --- OpenAPI shapes ------------------------------------------------------------------------


def _enum(choices: list[str], **kwargs: Any) -> serializers.Field:
    """A string with fixed values, inlined in the schema (named enum components collide across modules)."""

    @extend_schema_field({"type": "string", "enum": list(choices)})
    class Enum(serializers.CharField):
        pass

    return Enum(**kwargs)


class UsageSerializer(serializers.Serializer):
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField(help_text="part of inputTokens")
    reasoningTokens = serializers.IntegerField(help_text="part of outputTokens")
    costUsd = serializers.FloatField(allow_null=True, help_text="null only when every call is unpriced; 0 means no model calls")
    pricedCalls = serializers.IntegerField()
    unpricedCalls = serializers.IntegerField()


class RunLinksSerializer(serializers.Serializer):
    console = serializers.CharField(help_text="console page, path on this host: /w/<tenant>/<workspace>/runs/<runId>/")
    evidence = serializers.CharField(help_text="path of the evidence bundle")
    events = serializers.CharField(help_text="path of the event log")


class RunSerializer(serializers.Serializer):
    runId = serializers.RegexField(RUN_ID_RE.pattern)
    workflowVersionId = serializers.CharField(allow_null=True)
    status = _enum(list(RunStatus.values))
    parentRunId = serializers.CharField(allow_null=True)
    rootRunId = serializers.CharField(allow_null=True, help_text="top of the parent chain; null for a run without parent")
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
    next = serializers.IntegerField(allow_null=True, help_text="the `after` of the next page; null when this page reaches lastSequence")


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
    modelId = serializers.CharField(allow_null=True)
    inputTokens = serializers.IntegerField()
    outputTokens = serializers.IntegerField()
    cachedInputTokens = serializers.IntegerField()
    reasoningTokens = serializers.IntegerField()
    costUsd = serializers.FloatField(allow_null=True, help_text="null: the model has no price")
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
    artifactId = serializers.CharField()
    sha256 = serializers.CharField()
    size = serializers.IntegerField(allow_null=True, help_text="null when the artifact is missing")
    contentType = serializers.CharField(allow_null=True)
    ref = serializers.CharField()
    verified = serializers.BooleanField(help_text="its bytes were re-hashed now and match")


class FeedbackAuthorSerializer(serializers.Serializer):
    type = _enum(["member", "apiKey"])
    name = serializers.CharField()


class FeedbackSerializer(serializers.Serializer):
    feedbackId = serializers.CharField()
    runId = serializers.CharField()
    rating = serializers.IntegerField(min_value=1, max_value=5)
    category = serializers.CharField(allow_null=True)
    comment = serializers.CharField(allow_null=True)
    author = FeedbackAuthorSerializer(allow_null=True)
    createdAt = serializers.DateTimeField()


class CheckSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="dense_sequence, event_ids, artifact_hashes, projections, manifest_drift")
    status = _enum(["pass", "fail"])
    detail = serializers.CharField()


class IntegritySerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    checks = CheckSerializer(many=True)


class ReplayReadySerializer(serializers.Serializer):
    status = serializers.CharField(help_text="pass | fail")
    missing = serializers.ListField(child=serializers.CharField(), help_text="what a replay would lack, e.g. tool:<callId>:result")


class EvidenceSerializer(serializers.Serializer):
    run = RunSerializer()
    steps = StepSerializer(many=True, help_text="in order of first appearance in the log")
    toolCalls = ToolCallSerializer(many=True)
    artifacts = EvidenceArtifactSerializer(many=True, help_text="every artifact the log references")
    costs = CostSerializer(many=True, help_text="one per answered model call, in sequence order")
    approvals = serializers.ListField(child=serializers.JSONField(), help_text="the run's re-execution requests (asked of it, or the one that made it), each with its decision; shaped like GET /api/v1/reexecutions/{id} without plan, plus relation: of_this_run | made_this_run")
    feedback = FeedbackSerializer(many=True)
    subRuns = RunSerializer(many=True, help_text="direct sub-runs, oldest first")
    usage = UsageSerializer()
    integrity = IntegritySerializer(help_text="ledger verify's checks plus the replay plan's manifest drift check")
    replayReady = ReplayReadySerializer()


class PlanCallSerializer(serializers.Serializer):
    kind = _enum(["model", "tool"])
    turn = serializers.IntegerField(required=False)
    callId = serializers.CharField(required=False)
    action = _enum(["replay", "reinvoke"])


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


class ReplayPlanSerializer(serializers.Serializer):
    runId = serializers.CharField()
    steps = PlanStepSerializer(many=True)
    completedStepPaths = serializers.ListField(child=serializers.CharField())
    pendingStepPaths = serializers.ListField(child=serializers.CharField())
    sessions = PlanSessionSerializer(many=True)
    integrity = IntegritySerializer()
    replayReady = ReplayReadySerializer()


class UsageRowSerializer(UsageSerializer):
    key = serializers.CharField(allow_null=True, help_text="day YYYY-MM-DD, provider/modelId, workflowVersionId (null: none) or tenant/workspace")


class UsageReportSerializer(serializers.Serializer):
    rows = UsageRowSerializer(many=True)
    total = UsageSerializer(help_text="over every row of the range, not only this page")
    next = serializers.CharField(allow_null=True)


RUN_ID = OpenApiParameter("run_id", OpenApiTypes.STR, OpenApiParameter.PATH, pattern=RUN_ID_RE.pattern,
                          description="runId; anything else is 400 `invalid_run_id`")
WORKSPACE = OpenApiParameter("workspace", OpenApiTypes.STR, description=(
    "console sessions only: TENANT/WORKSPACE, needed when the member has several workspaces and "
    "the run does not decide; ignored for API keys"))
LIMIT = OpenApiParameter("limit", OpenApiTypes.INT, description="page size, default 50, 1..500")
CURSOR = OpenApiParameter("cursor", OpenApiTypes.STR, description="the `next` of the previous page")


# --- runs and events -----------------------------------------------------------------------


class RunListView(_ApiView):
    @extend_schema(
        operation_id="list_runs",
        summary="Runs of the workspace, newest first (scope read)",
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, enum=list(RunStatus.values)),
            OpenApiParameter("workflow", OpenApiTypes.STR, description="exact workflowVersionId"),
            OpenApiParameter("parentRunId", OpenApiTypes.STR, description="exact parent run id"),
            OpenApiParameter("q", OpenApiTypes.STR, description="case-insensitive substring of run id, workflow or label"),
            LIMIT, CURSOR, WORKSPACE,
        ],
        responses={200: RunListSerializer, **error_responses(
            e400=["invalid_parameter", "invalid_cursor", "workspace_required"], e403=["insufficient_scope"],
            e404=["not_found"])},
    )
    def get(self, request: Request) -> Response:
        caller = caller_for(request, "read")
        status = request.query_params.get("status") or None
        if status is not None and status not in RunStatus.values:
            raise InvalidParameter(f"status must be one of {', '.join(RunStatus.values)}", parameter="status")
        return Response(_runs_page(
            request, caller.workspace, status=status, workflow=request.query_params.get("workflow") or None,
            parent_run_id=request.query_params.get("parentRunId") or None, q=request.query_params.get("q") or None,
        ))


class RunDetailView(_ApiView):
    @extend_schema(
        operation_id="get_run", summary="The run, materialized from its log (scope read)",
        parameters=[RUN_ID, WORKSPACE],
        responses={200: RunSerializer, **error_responses(
            e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"])},
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = _run_for(request, run_id, "read")
        counts = selectors.children_counts(run.workspace, [run.run_id])
        return Response(serialize.run(run, children=counts.get(run.run_id, 0)))


class RunEventsView(_ApiView):
    renderer_classes = [JSONRenderer, NdjsonRenderer]
    @extend_schema_serializer(component_name="AppendEventsRequest")
    class InputSerializer(serializers.Serializer):
        @extend_schema_serializer(component_name="AppendEventItem")
        class EventInput(serializers.Serializer):
            type = serializers.CharField(help_text="a vocabulary type (DESIGN.md §3) or custom.*")
            payload = serializers.JSONField(required=False, help_text="an object; default {}")
            idempotencyKey = serializers.CharField(required=False, max_length=200)
            occurrenceId = serializers.CharField(required=False, max_length=200)

        events = EventInput(many=True, help_text="1..5000 events, appended in one transaction")
        expectedSequence = serializers.IntegerField(required=False, min_value=0,
                                                    help_text="the last sequence the writer saw")
        fencingToken = serializers.CharField(required=False, help_text="required while the run is leased")

    @extend_schema_serializer(component_name="AppendEventsResponse")
    class OutputSerializer(serializers.Serializer):
        events = AppendedEnvelopeSerializer(many=True)
        lastSequence = serializers.IntegerField()

    @extend_schema(
        operation_id="append_events",
        summary="Append a batch of events to a run (scope ingest)",
        description=(
            "All or nothing, one transaction. A body that is not a JSON object is 400 `invalid_request`; "
            "`events` missing, empty or not a list is 400 `invalid_event` with `details.field = \"events\"`; "
            "malformed JSON is 400 `invalid_json`. For another tenant's run id the answer is the same as for "
            "a run id never used in your workspace (run ids are per workspace). Console sessions need the "
            "operator role and the CSRF header."
        ),
        parameters=[RUN_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            200: OutputSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_json", "invalid_request", "invalid_event (details: index, field)",
                      "unknown_event_type", "cost_not_allowed"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
                e409=["idempotency_conflict", "sequence_conflict (details: expected, actual)", "fenced",
                      "run_not_started", "run_already_started", "run_finished"],
                e413=["payload_too_large"],
            ),
        },
        examples=[OpenApiExample("start a run", request_only=True, value={
            "events": [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_hello"},
                        "idempotencyKey": "start"}]})],
    )
    def post(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        try:
            caller = caller_for(request, "ingest", run_id=run_id)
        except NotFound:
            # A member starting a new run: the run cannot name the workspace yet.
            caller = caller_for(request, "ingest")
        body = request.data
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object {events: [...]}", field="")
        result = append_events(
            workspace=caller.workspace, run_id=run_id, events=body.get("events"),
            expected_sequence=body.get("expectedSequence"), fencing_token=body.get("fencingToken"),
        )
        return Response({"events": result.events, "lastSequence": result.last_sequence})



    @extend_schema(
        operation_id="list_events",
        summary="A run's envelopes in sequence order (scope read)",
        description=(
            "Pages by sequence: `?after=N` (default 0) and `?limit=M` (default 50, max 500). With "
            "`Accept: application/x-ndjson` (or `?format=ndjson`) the body is one envelope per line and the "
            "page's position travels in headers: `X-Last-Sequence` (the run's last sequence) and "
            "`X-Next-After` (the `after` of the next page; absent on the last page). Errors are always JSON."
        ),
        parameters=[
            RUN_ID,
            OpenApiParameter("after", OpenApiTypes.INT, description="return events with sequence > after; default 0"),
            LIMIT, WORKSPACE,
        ],
        responses={
            (200, "application/json"): EventsPageSerializer,
            (200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.STR, description="one envelope per line"),
            **error_responses(e400=["invalid_run_id", "invalid_parameter"], e403=["insufficient_scope"],
                              e404=["not_found"]),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = _run_for(request, run_id, "read")
        after = int_param(request, "after", 0, minimum=0)
        limit = limit_param(request)
        events = selectors.events(run, after=after, limit=limit)
        next_after = events[-1]["sequence"] if events and events[-1]["sequence"] < run.last_sequence else None
        if request.accepted_renderer.format == NdjsonRenderer.format:
            headers = {"X-Last-Sequence": str(run.last_sequence)}
            if next_after is not None:
                headers["X-Next-After"] = str(next_after)
            return Response(events, headers=headers)
        return Response({"events": events, "lastSequence": run.last_sequence, "next": next_after})


class RunChildrenView(_ApiView):
    @extend_schema(
        operation_id="list_run_children", summary="Direct sub-runs, newest first (scope read)",
        parameters=[RUN_ID, LIMIT, CURSOR, WORKSPACE],
        responses={200: RunListSerializer, **error_responses(
            e400=["invalid_run_id", "invalid_parameter", "invalid_cursor"], e403=["insufficient_scope"],
            e404=["not_found"])},
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = _run_for(request, run_id, "read")
        return Response(_runs_page(request, run.workspace, parent_run_id=run.run_id))


class RunEvidenceView(_ApiView):
    @extend_schema(
        operation_id="get_run_evidence",
        summary="The evidence bundle (scope read): read-only, executes nothing",
        description=(
            "Steps in order of first appearance, costs in sequence order, artifacts re-hashed now. "
            "`approvals` is always [] until re-execution requests exist. `integrity` holds ledger verify's "
            "checks (dense_sequence, event_ids, artifact_hashes, projections) and the replay plan's "
            "manifest_drift; `replayReady` is the replay plan's."
        ),
        parameters=[RUN_ID, WORKSPACE],
        responses={200: EvidenceSerializer, **error_responses(
            e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"])},
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = _run_for(request, run_id, "read")
        return Response(evidence_bundle(run))


class RunReplayPlanView(_ApiView):
    @extend_schema(
        operation_id="get_run_replay_plan",
        summary="What a resume or re-execution would do, without doing it (scope read)",
        parameters=[RUN_ID, WORKSPACE],
        responses={200: ReplayPlanSerializer, **error_responses(
            e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"])},
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = _run_for(request, run_id, "read")
        return Response(replay_plan_for(run))


class RunFeedbackView(_ApiView):
    @extend_schema_serializer(component_name="FeedbackRequest")
    class InputSerializer(serializers.Serializer):
        rating = serializers.IntegerField(min_value=1, max_value=5)
        category = serializers.CharField(required=False, allow_blank=True, max_length=100)
        comment = serializers.CharField(required=False, allow_blank=True, max_length=10_000, trim_whitespace=False)

    @extend_schema(
        operation_id="create_run_feedback",
        summary="Rate a run (any member session, or a key with scope ingest)",
        description="Listed in the run's evidence as `feedback`. Invalid fields are 400 `invalid_request` "
                    "with `details.fields` naming each.",
        parameters=[RUN_ID, WORKSPACE],
        request=InputSerializer,
        responses={201: FeedbackSerializer, **error_responses(
            e400=["invalid_run_id", "invalid_json", "invalid_request"], e403=["insufficient_scope"],
            e404=["not_found"])},
    )
    def post(self, request: Request, run_id: str) -> Response:
        # Any member may rate (viewer and up); a key needs ingest, since it writes.
        scope = "ingest" if isinstance(request.auth, ApiKey) else "read"
        caller, run = _run_for(request, run_id, scope)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        feedback = record_feedback(
            run=run, rating=data.validated_data["rating"], category=data.validated_data.get("category", ""),
            comment=data.validated_data.get("comment", ""), author=caller.user, api_key=caller.api_key,
        )
        return Response(serialize.feedback(feedback, run.run_id), status=201)


# --- artifacts -----------------------------------------------------------------------------


def _artifact_for(request: Request, artifact_id: str) -> Artifact:
    sha256 = artifact_id[4:] if artifact_id.startswith("art_") else ""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise NotFound(f"artifact {artifact_id} not found", artifactId=artifact_id)
    if isinstance(request.auth, ApiKey) or request.query_params.get("workspace"):
        workspaces: Any = [caller_for(request, "read").workspace]
    else:
        # Bytes are named by their hash, so whichever of the member's workspaces holds them will do.
        workspaces = selectors.workspaces_for(request.user)
    artifact = Artifact.objects.filter(workspace__in=workspaces, sha256=sha256).order_by("pk").first()
    if artifact is None:
        raise NotFound(f"artifact {artifact_id} not found", artifactId=artifact_id)
    return artifact


ARTIFACT_ID = OpenApiParameter("artifact_id", OpenApiTypes.STR, OpenApiParameter.PATH, pattern="^art_[0-9a-f]{64}$",
                               description="art_<sha256>; any other form is 404")


class ArtifactView(_ApiView):
    @extend_schema(
        operation_id="get_artifact", summary="An artifact's metadata (scope read)",
        parameters=[ARTIFACT_ID, WORKSPACE],
        responses={200: ArtifactSerializer, **error_responses(e403=["insufficient_scope"], e404=["not_found"])},
    )
    def get(self, request: Request, artifact_id: str) -> Response:
        return Response(serialize.artifact(_artifact_for(request, artifact_id)))


class ArtifactContentView(_ApiView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The bytes are served as stored whatever the client accepts; only errors are rendered (JSON).
        return super().perform_content_negotiation(request, force=True)

    @extend_schema(
        operation_id="get_artifact_content",
        summary="An artifact's bytes, re-hashed before they are served (scope read)",
        description=(
            "The bytes are re-hashed first; bytes that no longer match their sha256 (or are missing from "
            "storage) are never served: the answer is 500 `integrity_failure`, a server-side fault the "
            "client cannot cause or fix by changing the request. The `ETag` is the sha256."
        ),
        parameters=[ARTIFACT_ID, WORKSPACE],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(OpenApiTypes.BINARY, description="the stored bytes, "
                                                                "with the artifact's contentType"),
            **error_responses(e403=["insufficient_scope"], e404=["not_found"], e500=["integrity_failure"]),
        },
    )
    def get(self, request: Request, artifact_id: str) -> FileResponse:
        artifact = _artifact_for(request, artifact_id)
        response = FileResponse(open_verified(artifact), content_type=artifact.content_type)
        response["Content-Length"] = str(artifact.size)
        response["ETag"] = f'"{artifact.sha256}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response


# --- usage ---------------------------------------------------------------------------------


def _usage_tenant(request: Request) -> Tenant:
    """`?scope=tenant`: an admin member asks across every workspace of one of their tenants."""
    if isinstance(request.auth, ApiKey):
        raise RoleRequired("usage across a tenant needs an admin in a console session; API keys see their workspace")
    chosen = request.query_params.get("tenant") or request.query_params.get("workspace", "").partition("/")[0]
    memberships = selectors.memberships(request.user)
    if chosen:
        memberships = memberships.filter(tenant__slug=chosen)
    found = list(memberships[:2])
    if not found:
        raise NotFound("tenant not found", tenant=chosen or None)
    if len(found) > 1:
        raise WorkspaceRequired("pass ?tenant=TENANT: you are a member of more than one tenant")
    if not found[0].allows("admin"):
        raise RoleRequired("usage across a tenant needs the admin role", role="admin")
    return found[0].tenant


class UsageView(_ApiView):
    renderer_classes = [JSONRenderer, CsvRenderer]

    @extend_schema(
        operation_id="get_usage",
        summary="Tokens and cost over time, grouped (scope read)",
        description=(
            "Aggregated in SQL from the cost entries (one per answered model call) by the time they were "
            "recorded. `from` and `to` are UTC days, both inclusive; default the 30 days ending today. Rows are "
            "ordered by key and paged with `limit`/`cursor`; `total` covers the whole range. A row's costUsd is "
            "null only when every call in it is unpriced. `?format=csv` (or `Accept: text/csv`) gives every row "
            "of the range as CSV, unpaged, header `" + ",".join(CSV_COLUMNS) + "`, an unpriced cost as an empty "
            "cell. By default the caller's workspace; `?scope=tenant` (admin members in a console session only; "
            "`?tenant=T` when a member of several) covers every workspace of the tenant."
        ),
        parameters=[
            OpenApiParameter("from", OpenApiTypes.DATE, description="first day, YYYY-MM-DD"),
            OpenApiParameter("to", OpenApiTypes.DATE, description="last day (inclusive), YYYY-MM-DD; default today (UTC)"),
            OpenApiParameter("groupBy", OpenApiTypes.STR, enum=list(GROUPINGS), description="default day"),
            OpenApiParameter("scope", OpenApiTypes.STR, enum=["workspace", "tenant"], description="default workspace"),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="with scope=tenant: which tenant"),
            OpenApiParameter("format", OpenApiTypes.STR, enum=["json", "csv"]),
            LIMIT, CURSOR, WORKSPACE,
        ],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="the rows as CSV"),
            **error_responses(e400=["invalid_parameter", "invalid_cursor", "workspace_required"],
                              e403=["insufficient_scope", "forbidden"], e404=["not_found"]),
        },
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        group_by = params.get("groupBy") or "day"
        if group_by not in GROUPINGS:
            raise InvalidParameter(f"groupBy must be one of {', '.join(GROUPINGS)}", parameter="groupBy")
        end = _date_param(request, "to", timezone.now().date())
        start = _date_param(request, "from", end - timedelta(days=29))
        if start > end:
            raise InvalidParameter("from must not be after to", parameter="from")
        scope = params.get("scope") or "workspace"
        if scope == "tenant":
            rows, total = usage_rows(group_by=group_by, start=start, end=end, tenant=_usage_tenant(request))
        elif scope == "workspace":
            rows, total = usage_rows(group_by=group_by, start=start, end=end,
                                     workspace=caller_for(request, "read").workspace)
        else:
            raise InvalidParameter("scope must be workspace or tenant", parameter="scope")
        if request.accepted_renderer.format == CsvRenderer.format:
            filename = f"usage-{start}-{end}-{group_by}.csv"
            return Response([r.to_json() for r in rows],
                            headers={"Content-Disposition": f'attachment; filename="{filename}"'})
        limit = limit_param(request)
        cursor = decode_cursor(request)
        offset = 0
        if cursor is not None:
            if not isinstance(cursor.get("o"), int) or cursor["o"] < 0:
                raise InvalidCursor("cursor is not one this API gave out")
            offset = cursor["o"]
        page = rows[offset:offset + limit]
        more = offset + limit < len(rows)
        return Response({
            "rows": [r.to_json() for r in page],
            "total": {k: v for k, v in total.to_json().items() if k != "key"},
            "next": encode_cursor({"o": offset + limit}) if more else None,
        })


urlpatterns = [
    path("runs", RunListView.as_view(), name="api-runs"),
    path("runs/<str:run_id>", RunDetailView.as_view(), name="api-run"),
    path("runs/<str:run_id>/events", RunEventsView.as_view(), name="api-run-events"),  # GET list, POST append
    path("runs/<str:run_id>/children", RunChildrenView.as_view(), name="api-run-children"),
    path("runs/<str:run_id>/evidence", RunEvidenceView.as_view(), name="api-run-evidence"),
    path("runs/<str:run_id>/replay-plan", RunReplayPlanView.as_view(), name="api-run-replay-plan"),
    path("runs/<str:run_id>/feedback", RunFeedbackView.as_view(), name="api-run-feedback"),
    path("artifacts/<str:artifact_id>", ArtifactView.as_view(), name="api-artifact"),
    path("artifacts/<str:artifact_id>/content", ArtifactContentView.as_view(), name="api-artifact-content"),
    path("usage", UsageView.as_view(), name="api-usage"),
]
