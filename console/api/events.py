"""/api/v1/runs/{runId}/events: append a batch (ingest) and read the log by sequence (read), as JSON
or NDJSON."""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import serializers
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.canonical import ecma_dumps
from ledger.errors import LedgerError, NotFound
from ledger.log import AppendResult, append, replayed
from ledger.log.envelopes import as_stored
from ledger.log.prepare import validate_run_id
from ledger.models import ApiKey
from ledger.reads import selectors

from .auth import access_for, principal_name
from .base import ApiView, run_for
from .fastjson import JsonRenderer
from .inputs import FencingToken, Input
from .pagination import int_param, limit_param
from .ratelimit import RateLimited, charge_events, refund_events
from .schema import LIMIT, RUN_ID, WORKSPACE, AppendedEnvelopeSerializer, EventsPageSerializer, error_responses


class InvalidRequest(LedgerError):
    code = "invalid_request"


class NdjsonRenderer(BaseRenderer):
    """One JSON document per line (events); an error envelope is a single line."""

    media_type = "application/x-ndjson"
    format = "ndjson"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        items = data if isinstance(data, list) else [data]
        # Numbers in ECMAScript form (5e-7, not 5e-07), as the ids were computed over.
        return b"".join(ecma_dumps(item, default=str) + b"\n" for item in items)


class RunEventsView(ApiView):
    renderer_classes = [JsonRenderer, NdjsonRenderer]
    invalid_body_code = "invalid_event"  # a body too deep or with a NUL (fastjson.BadBody)

    @extend_schema_serializer(component_name="AppendEventsRequest")
    class InputSerializer(Input):
        @extend_schema_serializer(component_name="AppendEventItem")
        class EventInput(serializers.Serializer):
            type = serializers.CharField(help_text="a vocabulary type (docs/design.md §3) or custom.*")
            payload = serializers.JSONField(required=False, help_text="an object; default {}")
            idempotencyKey = serializers.CharField(required=False, max_length=200)
            occurrenceId = serializers.CharField(required=False, max_length=200)

        events = EventInput(many=True, help_text="1..5000 events, appended in one transaction")
        expectedSequence = serializers.IntegerField(
            required=False, min_value=0, help_text="the last sequence the writer saw"
        )
        fencingToken = FencingToken(help_text="required while the run is leased")

    @extend_schema_serializer(component_name="AppendEventsResponse")
    class OutputSerializer(serializers.Serializer):
        events = AppendedEnvelopeSerializer(many=True)
        lastSequence = serializers.IntegerField()

    @extend_schema(
        operation_id="append_events",
        summary="Append a batch of events to a run (scope ingest)",
        description=(
            "All or nothing, one transaction. A body that is not a JSON object is 400 `invalid_request`; "
            '`events` missing, empty or not a list is 400 `invalid_event` with `details.field = "events"`; '
            "malformed JSON is 400 `invalid_json`; a body nested deeper than 64 levels (refused before parsing, "
            "`details.limit`) or a NUL character in any string or key (`details.index`, `details.field`) is 400 "
            "`invalid_event`. For another tenant's run id the answer is the same as for "
            "a run id never used in your workspace (run ids are per workspace). Console sessions need the "
            "operator role and the CSRF header. The batch that starts a run records the caller (this API key, "
            "or the session's user) as the run's starter on the server, for the four-eyes rules of tool "
            "approvals; a `requestedBy` in the payload is stored as sent and decides nothing. Past the "
            "workspace's size limits (the deployment's, or the operator's override) the answer is 413 "
            "`run_too_large` or 429 `rate_limited`, `details.limit` the limit in force. With "
            "`Accept: application/x-ndjson` (or `?format=ndjson`) the answer is one envelope per line, the run's "
            "last sequence in the `X-Last-Sequence` header; errors are always JSON."
        ),
        parameters=[
            RUN_ID,
            WORKSPACE,
            OpenApiParameter(
                "Content-Encoding",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                enum=["gzip", "deflate", "identity"],
                description="a compressed body is inflated (10 MiB at most once inflated); another encoding is 415",
            ),
        ],
        request=InputSerializer,
        responses={
            (200, "application/json"): OutputSerializer,
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.STR, description="one envelope per line; the run's last sequence in X-Last-Sequence"
            ),
            **error_responses(
                e400=[
                    "invalid_run_id",
                    "invalid_json",
                    "invalid_request",
                    "invalid_event (details: index, field)",
                    "unknown_event_type",
                    "cost_not_allowed",
                ],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
                e409=[
                    "idempotency_conflict",
                    "sequence_conflict (details: expected, actual)",
                    "fenced",
                    "run_not_started",
                    "run_already_started",
                    "run_finished",
                ],
                e413=["payload_too_large (also once decompressed)", "run_too_large"],
                e415=["unsupported_media_type (details: field: Content-Encoding)"],
                e429=["rate_limited (Retry-After header; details: retryAfter, limit)"],
            ),
        },
        examples=[
            OpenApiExample(
                "start a run",
                request_only=True,
                value={
                    "events": [
                        {
                            "type": "RunStarted",
                            "payload": {"workflowVersionId": "wfver_hello"},
                            "idempotencyKey": "start",
                        }
                    ]
                },
            )
        ],
    )
    def post(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        if isinstance(request.auth, ApiKey):
            # A key's workspace is its own whether or not the run exists there: no lookup of it
            # (the log's append finds the run, or starts it, in that workspace).
            caller = access_for(request, "ingest")
        else:
            try:
                caller = access_for(request, "ingest", run_id=run_id)
            except NotFound:
                # A new run: it cannot name the workspace yet.
                caller = access_for(request, "ingest")
        body = request.data
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object {events: [...]}", field="")
        events = body.get("events")
        if isinstance(request.auth, ApiKey) and isinstance(events, list):
            try:
                charge_events(request.auth, len(events))
            except RateLimited:
                # A retry of a batch already in the log writes nothing: it gets its 200 (docs/api.md).
                replay = replayed(
                    workspace=caller.workspace,
                    run_id=run_id,
                    events=events,
                    expected_sequence=body.get("expectedSequence"),
                    fencing_token=body.get("fencingToken"),
                )
                if replay is None:
                    raise
                return self._answer(request, replay)
        try:
            result = append(
                workspace=caller.workspace,
                run_id=run_id,
                events=events,
                expected_sequence=body.get("expectedSequence"),
                fencing_token=body.get("fencingToken"),
                by=principal_name(request),  # who starts a run: the key or session, never the payload
            )
        except Exception:
            if isinstance(request.auth, ApiKey) and isinstance(events, list):
                refund_events(request.auth, len(events))  # a refused batch does not count
            raise
        return self._answer(request, result)

    @staticmethod
    def _answer(request: Request, result: AppendResult) -> Response:
        # Each payload as the log stores it: the answer writes the event as every read does.
        envelopes = [as_stored(env, text) for env, text in zip(result.events, result.stored, strict=True)]
        if request.accepted_renderer.format == NdjsonRenderer.format:
            # One envelope per line, as the read's NDJSON; the position travels in a header.
            return Response(envelopes, headers={"X-Last-Sequence": str(result.last_sequence)})
        return Response({"events": envelopes, "lastSequence": result.last_sequence})

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
            LIMIT,
            WORKSPACE,
        ],
        responses={
            (200, "application/json"): EventsPageSerializer,
            (200, "application/x-ndjson"): OpenApiResponse(OpenApiTypes.STR, description="one envelope per line"),
            **error_responses(
                e400=["invalid_run_id", "invalid_parameter"], e403=["insufficient_scope"], e404=["not_found"]
            ),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        after = int_param(request, "after", 0, minimum=0)
        limit = limit_param(request)
        events = selectors.events_as_stored(run, after=after, limit=limit)
        next_after = events[-1]["sequence"] if events and events[-1]["sequence"] < run.last_sequence else None
        if request.accepted_renderer.format == NdjsonRenderer.format:
            headers = {"X-Last-Sequence": str(run.last_sequence)}
            if next_after is not None:
                headers["X-Next-After"] = str(next_after)
            return Response(events, headers=headers)
        return Response({"events": events, "lastSequence": run.last_sequence, "next": next_after})


urlpatterns = [
    path("runs/<str:run_id>/events", RunEventsView.as_view(), name="api-run-events")  # GET list, POST append,
]
