"""/api/v1/runs/{runId}/evidence and /replay-plan: the replay family's two reads (docs/design.md §5 items 1
and 4); both execute nothing."""

from __future__ import annotations

from django.conf import settings
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.replay.evidence import evidence_bundle
from ledger.replay.runlog import state_json
from ledger.replay.stored_plan import replay_plan_for

from ..streams import StreamSlots, caller_of
from .base import ApiView, run_for
from .fastjson import EcmaJsonRenderer
from .pagination import int_param
from .ratelimit import RateLimited
from .schema import RUN_ID, WORKSPACE, EvidenceSerializer, ReplayPlanSerializer, error_responses

# Evidence requests in flight per caller (an API key, or a user over every session), in this
# process: an evidence bundle of a large run is heavy, and eight at once stalled the others.
EVIDENCE_SLOTS = StreamSlots()


def max_evidence_in_flight() -> int:
    return int(getattr(settings, "LEDGER_EVIDENCE_MAX_IN_FLIGHT_PER_CALLER", 2))


class RunEvidenceView(ApiView):
    renderer_classes = [EcmaJsonRenderer]  # numbers in ECMAScript form, as docs/api.md says

    @extend_schema(
        operation_id="get_run_evidence",
        summary="The evidence bundle (scope read): read-only, executes nothing",
        description=(
            "Steps in order of first appearance, costs in sequence order, artifacts re-hashed now. "
            "`approvals` lists the run's re-execution requests with their decisions. `integrity` holds ledger verify's "
            "checks (dense_sequence, event_ids, artifact_hashes, projections) and the replay plan's "
            "manifest_drift; `replayReady` is the replay plan's."
        ),
        parameters=[RUN_ID, WORKSPACE],
        responses={
            200: EvidenceSerializer,
            **error_responses(
                e400=["invalid_run_id"],
                e403=["insufficient_scope"],
                e404=["not_found"],
                e429=["rate_limited (the caller already has its limit of evidence requests in flight)"],
            ),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        slot = EVIDENCE_SLOTS.take(caller_of(request.auth or request.user), max_evidence_in_flight())
        if slot is None:
            limit = max_evidence_in_flight()
            raise RateLimited(
                f"at most {limit} evidence requests of one caller run at once; wait for one to finish",
                retry_after=1,
                limit=limit,
            )
        try:
            return Response(evidence_bundle(run))
        finally:
            slot.release()


class RunReplayPlanView(ApiView):
    renderer_classes = [EcmaJsonRenderer]  # numbers in ECMAScript form, as docs/api.md says

    @extend_schema(
        operation_id="get_run_replay_plan",
        summary="What a resume or re-execution would do, without doing it (scope read)",
        parameters=[RUN_ID, WORKSPACE],
        responses={
            200: ReplayPlanSerializer,
            **error_responses(e400=["invalid_run_id"], e403=["insufficient_scope"], e404=["not_found"]),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        return Response(replay_plan_for(run))


class RunStateView(ApiView):
    renderer_classes = [EcmaJsonRenderer]  # numbers in ECMAScript form, as docs/api.md says

    @extend_schema(
        operation_id="get_run_state",
        summary="The run's folded state, now or after event N (scope read)",
        description=(
            "The fold of events 1..`at` (default: the last): what the console's state-at-N view shows, as "
            "`ledger state RUN [--at N]` prints it. `state` is the fold's record, camelCase, keyed collections "
            "(steps, tool calls, …) as lists in log order, money as decimal strings. `at` beyond the last "
            "sequence is 400 `invalid_parameter`."
        ),
        parameters=[
            RUN_ID,
            WORKSPACE,
            OpenApiParameter("at", OpenApiTypes.INT, OpenApiParameter.QUERY, description="1..lastSequence"),
        ],
        responses={
            200: inline_serializer(
                "RunStateResponse",
                {
                    "runId": serializers.CharField(),
                    "at": serializers.IntegerField(help_text="the last event folded"),
                    "lastSequence": serializers.IntegerField(),
                    "state": serializers.JSONField(help_text="the folded RunState"),
                },
            ),
            **error_responses(
                e400=["invalid_run_id", "invalid_parameter"], e403=["insufficient_scope"], e404=["not_found"]
            ),
        },
    )
    def get(self, request: Request, run_id: str) -> Response:
        _, run = run_for(request, run_id, "read")
        at = int_param(request, "at", run.last_sequence, minimum=1, maximum=max(run.last_sequence, 1))
        return Response(state_json(run, at=at))


urlpatterns = [
    path("runs/<str:run_id>/state", RunStateView.as_view(), name="api-run-state"),
    path("runs/<str:run_id>/evidence", RunEvidenceView.as_view(), name="api-run-evidence"),
    path("runs/<str:run_id>/replay-plan", RunReplayPlanView.as_view(), name="api-run-replay-plan"),
]
