"""OpenTelemetry over HTTP (docs/otlp.md): `POST /api/v1/otlp/v1/traces`, the OTLP/HTTP traces
receiver (protobuf or JSON, gzip or not), and `GET /api/v1/runs/{runId}/otlp`, a run as OTLP/JSON.

The receiver answers as the OTLP specification asks: 200 with an ExportTraceServiceResponse in the
request's own encoding, `partialSuccess` naming the spans it refused. What it cannot read at all
is a 4xx with our error body (docs/api.md), which OTLP exporters do not retry; the log is untouched.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.interop.otlp.export import export_run, run_as_otlp
from ledger.interop.otlp.ingest import ingest
from ledger.interop.otlp.wire import JSON, PROTOBUF, InvalidOtlp, UnsupportedOtlp, parse

from ..input_limits import decompressed
from .auth import access_for, principal_name
from .base import ApiView, run_for
from .fastjson import JsonRenderer
from .schema import RUN_ID, WORKSPACE, error_responses


def _unreadable(message: str) -> InvalidOtlp:
    return InvalidOtlp(message, field="Content-Encoding")


class _Unparsed(BaseParser):
    """The body is left to the view (`post` reads it, decompressed, as protobuf or OTLP/JSON). A
    console session's CSRF check reads the form fields (DRF's `request.POST`), which needs a parser
    for the Content-Type: with the API's JSON parser only, a protobuf body was 415 and a gzipped or
    NUL-holding JSON one 400, where a key's export of the same bytes is taken."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> dict[str, Any]:
        return {}


class OtlpTracesView(ApiView):
    renderer_classes = [JsonRenderer]
    parser_classes = [_Unparsed]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[BaseRenderer, str]:
        return JsonRenderer(), JsonRenderer.media_type

    @extend_schema(
        operation_id="otlp_export_traces",
        summary="OTLP/HTTP traces receiver: spans become events (scope ingest)",
        description=(
            "Point an OpenTelemetry OTLP/HTTP exporter here (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) with the header "
            "`Authorization: Bearer <key>`. Body: an `ExportTraceServiceRequest` as protobuf "
            "(`application/x-protobuf`) or OTLP/JSON (`application/json`: hex ids, camelCase, int64 as strings), "
            "optionally `Content-Encoding: gzip`. Each trace is the run `run_otel_<traceId hex>` of the key's "
            "workspace; GenAI spans (`gen_ai.operation.name` chat/execute_tool/invoke_agent, …) become "
            "`harness.model.*`, `harness.tool_call.*` and step events, other spans `custom.otel.span`, each "
            "idempotent by span id (a retried export writes nothing twice). The root span ends the run. "
            "200: an `ExportTraceServiceResponse` in the request's encoding; spans it refused (bad ids, a trace "
            "whose run refused the events) are counted in `partialSuccess.rejectedSpans` with the reasons in "
            "`partialSuccess.errorMessage`, the rest are written, one transaction per trace. A body that is not "
            "an export request is 400 `invalid_otlp` and nothing is written. See docs/otlp.md for the mapping."
        ),
        request={PROTOBUF: OpenApiTypes.BINARY, JSON: OpenApiTypes.OBJECT},
        parameters=[
            OpenApiParameter(
                "Content-Encoding", OpenApiTypes.STR, OpenApiParameter.HEADER, enum=["gzip", "deflate", "identity"]
            )
        ],
        responses={
            (200, JSON): OpenApiResponse(
                OpenApiTypes.OBJECT,
                description=(
                    'ExportTraceServiceResponse: `{}`, or `{"partialSuccess": {"rejectedSpans": "2", '
                    '"errorMessage": "…"}}`'
                ),
                examples=[
                    OpenApiExample(
                        "some spans refused",
                        value={
                            "partialSuccess": {
                                "rejectedSpans": "1",
                                "errorMessage": "span 3 ('chat'): spanId must be 8 bytes, not all zero",
                            }
                        },
                    )
                ],
            ),
            (200, PROTOBUF): OpenApiResponse(OpenApiTypes.BINARY, description="ExportTraceServiceResponse (protobuf)"),
            **error_responses(
                e400=["invalid_otlp (details: field)"],
                e403=["insufficient_scope", "forbidden"],
                e413=["payload_too_large (also once decompressed)"],
                e415=["unsupported_media_type (details: field: Content-Type or Content-Encoding)"],
            ),
        },
    )
    def post(self, request: Request) -> HttpResponse:
        caller = access_for(request, "ingest")
        media = (request.content_type or "").split(";", 1)[0].strip().lower()
        if media not in (PROTOBUF, JSON):
            raise UnsupportedOtlp(f"Content-Type must be {PROTOBUF} or {JSON}", field="Content-Type")
        # gzip, which OTLP exporters send by default, or deflate (console/input_limits.py)
        body = decompressed(request.body, request.META.get("HTTP_CONTENT_ENCODING", ""), unreadable=_unreadable)
        result = ingest(workspace=caller.workspace, request=parse(body, media), by=principal_name(request))
        answer = ExportTraceServiceResponse()
        message = result.error_message()
        if result.rejected or message:
            answer.partial_success.rejected_spans = result.rejected
            answer.partial_success.error_message = message
        if media == PROTOBUF:
            return HttpResponse(answer.SerializeToString(), content_type=PROTOBUF)
        return HttpResponse(json_format.MessageToJson(answer, indent=None), content_type=JSON)


class RunOtlpView(ApiView):
    @extend_schema(
        operation_id="get_run_otlp",
        summary="The run as OTLP/JSON spans along the GenAI conventions (scope read; audited)",
        description=(
            "An `ExportTraceServiceRequest` in OTLP/JSON, ready to POST to any OTLP/HTTP collector's `/v1/traces`: "
            "one trace (its id the run's own for `run_otel_*` runs, else derived from the workspace and run id, "
            "stably), a root span for the run, a span per step, per model call (`chat <model>`, kind CLIENT, "
            "`gen_ai.*` request/response model, provider, usage tokens, the answer as `gen_ai.output.messages`) and per "
            "tool call (`execute_tool <tool>`, its arguments and result), span ids from event ids (or the original "
            "span ids of ingested spans). Values the log moved to artifacts are exported in full, each re-hashed "
            "(500 `integrity_failure` when one is missing or changed). Each export is written to the audit log as "
            "`run.otlp_exported`."
        ),
        parameters=[RUN_ID, WORKSPACE],
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="ExportTraceServiceRequest (OTLP/JSON)"),
            **error_responses(
                e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"], e500=["integrity_failure"]
            ),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        caller, run = run_for(request, run_id, "read")
        if request.method == "HEAD":  # nothing exported, nothing audited; the same checks and headers
            return Response(run_as_otlp(run))
        return Response(export_run(run=run, by=caller.api_key or caller.user))


urlpatterns = [
    path("otlp/v1/traces", OtlpTracesView.as_view(), name="api-otlp-traces"),
    path("runs/<str:run_id>/otlp", RunOtlpView.as_view(), name="api-run-otlp"),
]
