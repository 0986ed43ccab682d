"""/api/v1/artifacts/{artifactId}: metadata, and the bytes re-hashed before they are served."""

from __future__ import annotations

from typing import Any

from django.http import FileResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.errors import NotFound
from ledger.log.artifacts import open_verified
from ledger.models import Artifact
from ledger.reads import selectors, serialize
from ledger.tenancy.access import visible_workspaces

from .auth import principal
from .base import ApiView, require_accepted
from .negotiation import admits
from .schema import WORKSPACE, ArtifactSerializer, error_responses


def _artifact_for(request: Request, artifact_id: str) -> Artifact:
    sha256 = artifact_id[4:] if artifact_id.startswith("art_") else ""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise NotFound(f"artifact {artifact_id} not found", artifactId=artifact_id)
    # Bytes are named by their hash, so whichever of the caller's workspaces holds them will do.
    workspaces = visible_workspaces(principal(request), workspace=request.query_params.get("workspace") or None)
    artifact = selectors.artifact_in(workspaces, sha256)
    if artifact is None:
        raise NotFound(f"artifact {artifact_id} not found", artifactId=artifact_id)
    return artifact


ARTIFACT_ID = OpenApiParameter(
    "artifact_id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    pattern="^art_[0-9a-f]{64}$",
    description="art_<sha256>; any other form is 404",
)


class ArtifactView(ApiView):
    @extend_schema(
        operation_id="get_artifact",
        summary="An artifact's metadata (scope read)",
        parameters=[ARTIFACT_ID, WORKSPACE],
        responses={200: ArtifactSerializer, **error_responses(e403=["insufficient_scope"], e404=["not_found"])},
    )
    def get(self, request: Request, artifact_id: str) -> Response:
        return Response(serialize.artifact(_artifact_for(request, artifact_id)))


class ArtifactContentView(ApiView):
    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # The bytes are served as stored, with their content type: an Accept that admits neither it
        # nor application/octet-stream is 406, once the artifact is found (get, below); only errors
        # are rendered (JSON).
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
            # Any media type: the bytes are served with the artifact's own contentType (JSON, text,
            # an image, application/octet-stream), which a client generated from the schema must admit.
            (200, "*/*"): OpenApiResponse(
                OpenApiTypes.BINARY,
                description="the stored bytes, with the artifact's contentType as their Content-Type",
            ),
            **error_responses(
                e403=["insufficient_scope"],
                e404=["not_found"],
                e406=[
                    "not_acceptable (an Accept that admits neither the artifact's content type nor application/octet-stream)"
                ],
                e500=["integrity_failure"],
            ),
        },
    )
    def get(self, request: Request, artifact_id: str) -> FileResponse:
        artifact = _artifact_for(request, artifact_id)
        if not admits(request.headers.get("Accept", ""), "application/octet-stream"):  # bytes as bytes
            require_accepted(request, artifact.content_type, "the artifact")
        response = FileResponse(open_verified(artifact), content_type=artifact.content_type)
        response["Content-Length"] = str(artifact.size)
        response["ETag"] = f'"{artifact.sha256}"'
        response["X-Content-Type-Options"] = "nosniff"
        return response


urlpatterns = [
    path("artifacts/<str:artifact_id>", ArtifactView.as_view(), name="api-artifact"),
    path("artifacts/<str:artifact_id>/content", ArtifactContentView.as_view(), name="api-artifact-content"),
]
