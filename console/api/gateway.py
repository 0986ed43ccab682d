"""The tool gateway over HTTP (docs/api.md "Tool gateway"): claim, outbound, complete, reconcile, list.

One small view per operation: validate, call the service in ledger/replay/gateway.py, serialize. Domain
refusals are LedgerErrors, turned into the error body by console/api/errors.py.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.log.prepare import validate_run_id
from ledger.models import ToolGatewayClaim
from ledger.replay import gateway

from .auth import access_for
from .base import WrittenText
from .inputs import FencingToken, Input
from .pagination import InvalidParameter, encode_cursor, limit_param, list_query, row_cursor
from .schema import CURSOR, LIMIT, RUN_ID, WORKSPACE, FullMatchField, error_responses

CALL_ID_PATTERN = r"^[^/\s]{1,200}$"
MAX_TIMEOUT_S = 86_400


# --- shared shapes ---------------------------------------------------------------------------


CALL_ID = OpenApiParameter("call_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="the callId")
COMMON_ERRORS = {
    "e400": ["invalid_run_id", "invalid_request (details.fields)", "invalid_event", "invalid_json"],
    "e403": ["insufficient_scope", "forbidden"],
    "e404": ["not_found (no such run or tool call in the caller's workspace)"],
}


def _errors(**codes: list[str]) -> dict[int, OpenApiResponse]:
    return error_responses(**{**COMMON_ERRORS, **codes})


def _fencing() -> serializers.CharField:
    return FencingToken(help_text="the run's fencing token; needed only while the run is leased")


# How a tool call ended: one enum in the schema (ToolCallOutcomeEnum) for every field that says it.
TOOL_CALL_OUTCOMES = ["succeeded", "failed"]


def _any_json(**kwargs: Any) -> serializers.JSONField:
    return serializers.JSONField(allow_null=True, **kwargs)


@extend_schema_serializer(component_name="ToolCallOutcome")
class FinishedSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=TOOL_CALL_OUTCOMES)
    callId = serializers.CharField(source="call_id")
    attempt = serializers.IntegerField()
    result = _any_json(required=False, help_text="present when status is succeeded")
    error = _any_json(required=False, help_text="present when status is failed")
    durationMs = serializers.FloatField(source="duration_ms", allow_null=True)
    reconciled = serializers.BooleanField()
    idempotentReplay = serializers.BooleanField(source="idempotent_replay")

    def to_representation(self, instance: gateway.Finished) -> dict[str, Any]:
        data = super().to_representation(instance)
        data.pop("error" if instance.status == "succeeded" else "result", None)
        return data


# --- claim -----------------------------------------------------------------------------------


class ClaimView(APIView):
    @extend_schema_serializer(component_name="ToolCallClaim")
    class InputSerializer(Input):
        callId = FullMatchField(CALL_ID_PATTERN, help_text="no '/' or whitespace, at most 200 characters")
        toolName = serializers.CharField(max_length=200)
        args = _any_json()
        idempotencyKey = serializers.CharField(required=False, max_length=200)
        effect = serializers.ChoiceField(choices=ToolGatewayClaim.Effect.values)
        timeoutS = serializers.FloatField(
            required=False,
            min_value=0.001,
            max_value=MAX_TIMEOUT_S,
            help_text="the lease is max(60 s, timeoutS + 10 s)",
        )
        owner = serializers.CharField(max_length=200, help_text="the worker that will run the call")
        caller = serializers.CharField(
            required=False,
            max_length=50,
            default="gateway",
            help_text="recorded as `caller` in harness.tool_call.started",
        )
        turn = serializers.IntegerField(required=False)
        stepPath = serializers.CharField(required=False, max_length=500)
        fencingToken = _fencing()

    @extend_schema_serializer(component_name="ToolCallClaimed")
    class ClaimedSerializer(serializers.Serializer):
        status = serializers.CharField(default="claimed")
        callId = serializers.CharField(
            source="call_id", help_text="the call claimed (by key, it may be an earlier callId)"
        )
        leaseToken = serializers.CharField(source="lease_token")
        leaseExpiresAt = serializers.DateTimeField(source="lease_expires_at")
        attempt = serializers.IntegerField()

    @extend_schema(
        operation_id="claim_tool_call",
        parameters=[RUN_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            201: ClaimedSerializer,
            200: OpenApiResponse(
                FinishedSerializer,
                description="a finished call with the same identity: "
                "its recorded outcome, `idempotentReplay: true`; nothing ran, nothing was appended",
            ),
            **_errors(
                e409=[
                    "tool_call_in_progress (a live lease of another owner)",
                    "tool_call_in_doubt",
                    "idempotency_conflict (same key or callId, other tool or args)",
                    "fenced",
                    "run_finished",
                ],
                e500=["integrity_failure (the artifact holding the recorded result or error is missing or changed)"],
            ),
        },
        description="Claim before running the tool. The lease is 60 s, or timeoutS + 10 s when that is longer. A lease that expired before `outbound` may be claimed again (attempt + 1); one that expired after it makes the call in doubt (harness.tool_call.in_doubt), never retried automatically. The lease holder repeating its claim gets its live lease back. With an idempotencyKey, the key names the call even under another callId.",
        summary="Claim a tool call under a lease",
        tags=["tool gateway"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "ingest", run_id=run_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        answer = gateway.claim_tool_call(
            workspace=caller.workspace,
            run_id=run_id,
            call_id=v["callId"],
            tool_name=v["toolName"],
            args=v["args"],
            effect=v["effect"],
            owner=v["owner"],
            idempotency_key=v.get("idempotencyKey"),
            timeout_s=v.get("timeoutS"),
            caller=v["caller"],
            turn=v.get("turn"),
            step_path=v.get("stepPath"),
            fencing_token=v.get("fencingToken"),
        )
        if isinstance(answer, gateway.Finished):
            return Response(FinishedSerializer(answer).data, status=200)
        return Response(self.ClaimedSerializer(answer).data, status=201)


# --- outbound --------------------------------------------------------------------------------


class OutboundView(APIView):
    @extend_schema_serializer(component_name="ToolCallOutboundMark")
    class InputSerializer(Input):
        leaseToken = serializers.CharField(max_length=64)
        fencingToken = _fencing()

    @extend_schema_serializer(component_name="ToolCallOutbound")
    class OutputSerializer(serializers.Serializer):
        status = serializers.CharField(default="claimed")
        callId = serializers.CharField(source="call_id")
        attempt = serializers.IntegerField()
        outboundAt = serializers.DateTimeField(source="outbound_at")
        leaseExpiresAt = serializers.DateTimeField(source="lease_expires_at")

    @extend_schema(
        operation_id="mark_tool_call_outbound",
        parameters=[RUN_ID, CALL_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            200: OpenApiResponse(
                OutputSerializer,
                description="stamped (a repeat keeps the first stamp); "
                "from now on an expired lease makes the call in doubt",
            ),
            **_errors(e409=["lease_lost (the lease expired or belongs to another claim; details.status)"]),
        },
        description="Call just before the request leaves. No event is written: the stamp decides what an expired lease means (re-claimable before it, in doubt after it).",
        summary="Mark that the tool request is about to leave",
        tags=["tool gateway"],
    )
    def post(self, request: Request, run_id: str, call_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "ingest", run_id=run_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        answer = gateway.mark_outbound(
            workspace=caller.workspace,
            run_id=run_id,
            call_id=call_id,
            lease_token=data.validated_data["leaseToken"],
            fencing_token=data.validated_data.get("fencingToken"),
        )
        return Response(self.OutputSerializer(answer).data)


# --- complete --------------------------------------------------------------------------------


class CompleteView(APIView):
    @extend_schema_serializer(component_name="ToolCallComplete")
    class InputSerializer(Input):
        leaseToken = serializers.CharField(max_length=64)
        result = _any_json(required=False)
        error = _any_json(required=False)
        fencingToken = _fencing()

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if ("result" in attrs) == ("error" in attrs):
                raise serializers.ValidationError({"result": ["send exactly one of result or error"]})
            return attrs

    @extend_schema(
        operation_id="complete_tool_call",
        parameters=[RUN_ID, CALL_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            200: OpenApiResponse(
                FinishedSerializer,
                description="recorded, with harness.tool_call.succeeded|failed "
                "in the same transaction; the holder repeating the same complete gets "
                "`idempotentReplay: true`. Results over 8 KiB are kept as artifacts.",
            ),
            **_errors(
                e409=["lease_lost (stale or foreign lease; details.status: the call's status now)"],
                e500=["integrity_failure (the artifact holding the recorded result or error is missing or changed)"],
            ),
        },
        description="Send exactly one of result or error with the live lease token; harness.tool_call.succeeded|failed {callId, result|error, durationMs, attempt} is appended in the same transaction.",
        summary="Complete a claimed tool call with its result or error",
        tags=["tool gateway"],
    )
    def post(self, request: Request, run_id: str, call_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "ingest", run_id=run_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        outcome = "result" if "result" in v else "error"
        answer = gateway.complete_tool_call(
            workspace=caller.workspace,
            run_id=run_id,
            call_id=call_id,
            lease_token=v["leaseToken"],
            outcome=outcome,
            value=v[outcome],
            fencing_token=v.get("fencingToken"),
        )
        return Response(FinishedSerializer(answer).data)


# --- reconcile -------------------------------------------------------------------------------


class ReconcileView(APIView):
    @extend_schema_serializer(component_name="ToolCallReconcile")
    class InputSerializer(Input):
        outcome = serializers.ChoiceField(choices=TOOL_CALL_OUTCOMES)
        result = _any_json(required=False)
        error = _any_json(required=False)
        note = WrittenText(help_text="why the operator believes this outcome")
        fencingToken = _fencing()

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            wrong = "error" if attrs["outcome"] == "succeeded" else "result"
            if wrong in attrs:
                raise serializers.ValidationError({wrong: [f"not allowed with outcome {attrs['outcome']}"]})
            return attrs

    @extend_schema(
        operation_id="reconcile_tool_call",
        parameters=[RUN_ID, CALL_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            200: OpenApiResponse(FinishedSerializer, description="settled; harness.tool_call.reconciled written"),
            **_errors(
                e403=[
                    "insufficient_scope",
                    "forbidden (an operator or above in a console session only; API keys are refused)",
                ],
                e409=["tool_call_not_in_doubt (details.status)", "fenced"],
            ),
        },
        description="An operator (console session; API keys are refused) settles a call in doubt; harness.tool_call.reconciled {callId, outcome, result|error, note, by} is appended. Later claims with the same key replay this outcome.",
        summary="Reconcile a tool call in doubt (operator session)",
        tags=["tool gateway"],
    )
    def post(self, request: Request, run_id: str, call_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "ingest", run_id=run_id, role="operator")
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        field = "result" if v["outcome"] == "succeeded" else "error"
        answer = gateway.reconcile_tool_call(
            workspace=caller.workspace,
            run_id=run_id,
            call_id=call_id,
            outcome=v["outcome"],
            value=v.get(field),
            note=v["note"],
            by=caller.user.get_username(),
            fencing_token=v.get("fencingToken"),
        )
        return Response(FinishedSerializer(answer).data)


# --- list ------------------------------------------------------------------------------------


@extend_schema_serializer(component_name="ToolCallRow")
class ToolCallRowSerializer(serializers.ModelSerializer):
    """A control row. The lease token is never shown: holding it is what completing needs."""

    callId = serializers.CharField(source="call_id")
    toolName = serializers.CharField(source="tool_name")
    args = _any_json()
    idempotencyKey = serializers.CharField(source="idempotency_key", allow_null=True)
    timeoutS = serializers.FloatField(source="timeout_s", allow_null=True)
    leaseExpiresAt = serializers.DateTimeField(source="lease_expires_at")
    claimedAt = serializers.DateTimeField(source="claimed_at")
    outboundAt = serializers.DateTimeField(source="outbound_at", allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", allow_null=True)
    durationMs = serializers.FloatField(source="duration_ms", allow_null=True)
    result = _any_json(help_text="null when kept as an artifact (see resultRef)")
    error = _any_json()
    resultRef = serializers.SerializerMethodField(help_text="artifact ref of a result over 8 KiB")
    errorRef = serializers.SerializerMethodField(help_text="artifact ref of an error over 8 KiB")
    reconciledBy = serializers.CharField(source="reconciled_by")
    reconcileNote = serializers.CharField(source="reconcile_note")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(source="updated_at")

    class Meta:
        model = ToolGatewayClaim
        fields = [
            "callId",
            "toolName",
            "args",
            "idempotencyKey",
            "effect",
            "timeoutS",
            "owner",
            "status",
            "attempt",
            "leaseExpiresAt",
            "claimedAt",
            "outboundAt",
            "finishedAt",
            "durationMs",
            "result",
            "error",
            "resultRef",
            "errorRef",
            "reconciledBy",
            "reconcileNote",
            "createdAt",
            "updatedAt",
        ]

    def _ref(self, row: ToolGatewayClaim, status: str) -> str | None:
        return row.outcome_ref if row.outcome_ref and row.status == status else None

    def get_resultRef(self, row: ToolGatewayClaim) -> str | None:
        return self._ref(row, "succeeded")

    def get_errorRef(self, row: ToolGatewayClaim) -> str | None:
        return self._ref(row, "failed")


class ListView(APIView):
    @extend_schema_serializer(component_name="ToolCallList")
    class ListSerializer(serializers.Serializer):
        toolCalls = ToolCallRowSerializer(many=True)
        next = serializers.CharField(allow_null=True)

    @extend_schema(
        operation_id="list_tool_calls",
        parameters=[
            RUN_ID,
            WORKSPACE,
            LIMIT,
            CURSOR,
            OpenApiParameter(
                "status", OpenApiTypes.STR, OpenApiParameter.QUERY, required=False, enum=ToolGatewayClaim.Status.values
            ),
        ],
        responses={
            200: ListSerializer,
            **_errors(e400=[*COMMON_ERRORS["e400"], "invalid_parameter", "invalid_cursor"]),
        },
        description="Control rows with cursor pagination (`?limit=`, `?cursor=`). Lease tokens are never listed.",
        summary="The run's tool gateway control rows, in claim order",
        tags=["tool gateway"],
    )
    def get(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        run = access_for(request, "read", run_id=run_id).run
        assert run is not None
        limit = limit_param(request)
        query = list_query(request, "status")
        after = row_cursor(request, "after", kind="tool-calls", scope=run, query=query)
        status = request.query_params.get("status") or None
        if status is not None and status not in ToolGatewayClaim.Status.values:
            raise InvalidParameter(
                f"status must be one of {', '.join(ToolGatewayClaim.Status.values)}", parameter="status"
            )
        rows = gateway.tool_call_rows(run, after_pk=after, limit=limit + 1, status=status)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = encode_cursor({"after": rows[-1].pk}, kind="tool-calls", scope=run, query=query) if more else None
        return Response({"toolCalls": ToolCallRowSerializer(rows, many=True).data, "next": next_cursor})


class ToolCallsView(ClaimView, ListView):
    """POST claims, GET lists: two operations on one path."""


urlpatterns = [
    path("runs/<str:run_id>/tool-calls", ToolCallsView.as_view(), name="tool-calls"),
    path("runs/<str:run_id>/tool-calls/<str:call_id>/outbound", OutboundView.as_view(), name="tool-call-outbound"),
    path("runs/<str:run_id>/tool-calls/<str:call_id>/complete", CompleteView.as_view(), name="tool-call-complete"),
    path("runs/<str:run_id>/tool-calls/<str:call_id>/reconcile", ReconcileView.as_view(), name="tool-call-reconcile"),
]
