"""/api/v1/runs/{runId}/cancel (docs/api.md "Run control"): an operator's session, or a key with the
`execute` scope, ends a running run as `RunFailed {error: {name: "Cancelled", message: reason}}`
(ledger/replay/cancellation.py). Another tenant's run is 404, never 403."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.replay import cancellation

from .base import ApiView, WrittenText, run_for
from .inputs import Input
from .schema import RUN_ID, WORKSPACE, error_responses

TAGS = ["run control"]


class CancelInputSerializer(Input):
    reason = WrittenText(help_text="why: recorded as the error's message and in the audit log")


class CancelledSerializer(serializers.Serializer):
    runId = serializers.CharField()
    status = serializers.CharField(help_text="failed: the cancel is in the log when this answers")
    error = serializers.JSONField(help_text='{"name": "Cancelled", "message": reason}')
    lastSequence = serializers.IntegerField(help_text="the sequence of the run's RunFailed")
    executorHeld = serializers.BooleanField(
        help_text="an executor held the run's lease: it stops at its next write (its next step boundary or call)"
    )
    abandonedCalls = serializers.ListField(
        child=serializers.CharField(), help_text="tool calls in flight recorded as failed with Cancelled"
    )
    inDoubtCalls = serializers.ListField(
        child=serializers.CharField(),
        help_text="write tool calls whose request had left: in doubt until an operator reconciles them",
    )
    cancelledSubRuns = serializers.ListField(
        child=serializers.CharField(), help_text="unfinished sub-runs cancelled with the run, deepest first"
    )


class RunCancelView(ApiView):
    @extend_schema(
        operation_id="cancel_run",
        parameters=[RUN_ID, WORKSPACE],
        request=CancelInputSerializer,
        responses={
            202: CancelledSerializer,
            **error_responses(
                e400=[
                    "invalid_run_id",
                    "invalid_json",
                    "invalid_request (details.fields names each)",
                    "workspace_required",
                ],
                e403=["insufficient_scope (a key without execute)", "forbidden (a member below operator)"],
                e404=["not_found"],
                e409=["run_finished (the run already ended)"],
            ),
        },
        summary="Cancel a run (operator session, or key with execute)",
        tags=TAGS,
        description='The run ends `RunFailed {error: {name: "Cancelled", message: reason}}` before this '
        "answers: tool calls in flight are abandoned (failed with Cancelled), write calls whose "
        "request had left become in doubt, unfinished sub-runs are cancelled too. An executor "
        "holding the run stops at its next write. Audited as `run.cancelled`.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        caller, run = run_for(request, run_id, "execute")
        data = CancelInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        by = caller.api_key if caller.api_key is not None else caller.user
        done = cancellation.cancel_run(
            workspace=run.workspace, run_id=run.run_id, reason=data.validated_data["reason"], by=by
        )
        return Response(
            {
                "runId": done.run_id,
                "status": "failed",
                "error": cancellation.cancelled_error(data.validated_data["reason"].strip()),
                "lastSequence": done.last_sequence,
                "executorHeld": done.held,
                "abandonedCalls": done.abandoned,
                "inDoubtCalls": done.in_doubt,
                "cancelledSubRuns": done.sub_runs,
            },
            status=202,
        )


urlpatterns = [
    path("runs/<str:run_id>/cancel", RunCancelView.as_view(), name="api-run-cancel"),
]
