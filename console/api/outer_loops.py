"""/api/v1/outer-loops/{outerLoopId}: an outer loop's state, read from the ledger (its record run
and its cycle runs; ledger/runtime/outer_loop.py). docs/api.md is silent on outer loops: this is the
reference's manifest shape with what the ledger adds (status, each cycle's run status and usage,
the usage summed across cycles) and links. Scope read; a loop of another workspace is a 404."""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.errors import NotFound
from ledger.runtime.outer_loop import OUTER_LOOP_ID, check_outer_loop_id, read_loop, record_run_id

from .auth import access_for
from .base import ApiView
from .schema import WORKSPACE, UsageSerializer, enum, error_responses

OUTER_LOOP = OpenApiParameter(
    "outer_loop_id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    pattern=OUTER_LOOP_ID.pattern,
    description="outerLoopId; anything else is 400 `invalid_outer_loop`",
)


class GoalSerializer(serializers.Serializer):
    workflow = serializers.CharField(help_text="the registered workflow each cycle runs")
    workflowDefinitionHash = serializers.CharField()
    workflowVersionId = serializers.CharField()
    description = serializers.CharField()


class VerdictSerializer(serializers.Serializer):
    kind = enum(["done", "continue"])
    finalOutput = serializers.JSONField(required=False, help_text="with kind done")
    promptNote = serializers.CharField(required=False, help_text="with kind continue, when the adapter gave one")


class CycleSerializer(serializers.Serializer):
    cycleNumber = serializers.IntegerField(min_value=1)
    runId = serializers.CharField(help_text="the cycle's run: run_<outerLoopId>_c<cycleNumber>")
    status = serializers.CharField(help_text="pending (reserved, not started) | running | completed | failed")
    workflowVersionId = serializers.CharField()
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    supervise = VerdictSerializer(allow_null=True, help_text="the recorded verdict; null while the cycle is pending")
    usage = UsageSerializer(help_text="the cycle run's, with its sub-runs")


class LoopLinksSerializer(serializers.Serializer):
    console = serializers.CharField()
    record = serializers.CharField(help_text="the loop's record run (API path)")


class OuterLoopSerializer(serializers.Serializer):
    outerLoopId = serializers.CharField()
    recordRunId = serializers.CharField(help_text="the run whose log holds the loop's facts")
    # A plain string: a third choice set for fields named "status" is one drf-spectacular cannot name.
    status = serializers.CharField(help_text="running | completed (done) | failed (exhausted)")
    goal = GoalSerializer()
    input = serializers.JSONField(allow_null=True)
    maxCycles = serializers.IntegerField(min_value=1)
    supervise = serializers.CharField(allow_null=True, help_text="the supervise adapter's registered name")
    cycles = CycleSerializer(many=True)
    result = serializers.JSONField(required=False, help_text='{"kind": "done", "finalOutput"} once done')
    error = serializers.JSONField(required=False, help_text="once failed, e.g. causeCode outer_loop_exhausted")
    pendingCycleRunId = serializers.CharField(required=False, help_text="the reserved run of the cycle to come")
    usage = UsageSerializer(help_text="summed across every cycle")
    links = LoopLinksSerializer()


class OuterLoopView(ApiView):
    @extend_schema(
        operation_id="get_outer_loop",
        summary="An outer loop: goal, cycles, verdicts, usage summed (scope read)",
        parameters=[OUTER_LOOP, WORKSPACE],
        responses={
            200: OuterLoopSerializer,
            **error_responses(
                e400=["invalid_outer_loop"],
                e403=["insufficient_scope"],
                e404=["not_found"],
                e409=["outer_loop_manifest_corrupt"],
            ),
        },
    )
    def get(self, request: Request, outer_loop_id: str) -> Response:
        check_outer_loop_id(outer_loop_id)
        try:
            caller = access_for(request, "read", run_id=record_run_id(outer_loop_id))
        except NotFound:  # named by what the caller asked for, not by the record's run id
            raise NotFound(f"outer loop {outer_loop_id} not found", outerLoopId=outer_loop_id) from None
        assert caller.run is not None
        ws = caller.run.workspace
        body: dict[str, Any] = read_loop(ws, outer_loop_id, caller.run).to_json()
        body["links"] = {
            "console": f"/w/{ws.tenant.slug}/{ws.slug}/loops/{outer_loop_id}/",
            "record": f"/api/v1/runs/{caller.run.run_id}",
        }
        return Response(body)


urlpatterns = [
    path("outer-loops/<str:outer_loop_id>", OuterLoopView.as_view(), name="api-outer-loop"),
]
