"""/api/v1/runs/{runId}/feedback: rate a run (docs/api.md "Evidence and replay plan")."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.models import ApiKey
from ledger.reads import serialize
from ledger.replay.feedback import MAX_COMMENT, record_feedback

from .base import ApiView, WrittenText, run_for
from .inputs import Input
from .schema import RUN_ID, WORKSPACE, FeedbackSerializer, error_responses


class RunFeedbackView(ApiView):
    @extend_schema_serializer(component_name="FeedbackRequest")
    class InputSerializer(Input):
        rating = serializers.IntegerField(min_value=1, max_value=5)
        category = serializers.CharField(required=False, allow_blank=True, max_length=100)
        comment = WrittenText(required=False, limit=MAX_COMMENT)

    @extend_schema(
        operation_id="create_run_feedback",
        summary="Rate a run (any member session, or a key with scope ingest)",
        description="Listed in the run's evidence as `feedback`. Invalid fields are 400 `invalid_request` "
        "with `details.fields` naming each.",
        parameters=[RUN_ID, WORKSPACE],
        request=InputSerializer,
        responses={
            201: FeedbackSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_json", "invalid_request"],
                e403=["insufficient_scope"],
                e404=["not_found"],
            ),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        # Any member may rate (viewer and up); a key needs ingest, since it writes.
        scope = "ingest" if isinstance(request.auth, ApiKey) else "read"
        caller, run = run_for(request, run_id, scope)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        feedback = record_feedback(
            run=run,
            rating=data.validated_data["rating"],
            category=data.validated_data.get("category", ""),
            comment=data.validated_data.get("comment", ""),
            author=caller.user,
            api_key=caller.api_key,
        )
        return Response(serialize.feedback(feedback, run.run_id), status=201)


urlpatterns = [
    path("runs/<str:run_id>/feedback", RunFeedbackView.as_view(), name="api-run-feedback"),
]
