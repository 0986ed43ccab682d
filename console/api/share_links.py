"""/api/v1/ share links (docs/api.md "Share links"): create and list a run's links, revoke one.

Creating, listing and revoking are an operator's, in a console session: API keys hold no roles,
so a key is refused with 403 `forbidden` (ledger/tenancy/access.py), as a viewer is. A run or link of
another tenant is 404, never 403. The token is in the `url` of the creation's answer only.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.models import Run
from ledger.tenancy import sharing
from ledger.tenancy.access import Access, lookup_workspaces, within

from .auth import access_for, principal
from .base import ApiView, run_for
from .inputs import Input
from .pagination import InvalidCursor, decode_cursor, encode_cursor, limit_param
from .schema import CURSOR, RUN_ID, WORKSPACE, enum, error_responses

TAGS = ["share links"]
STATUSES = ["active", "expired", "revoked", "used_up"]


class ShareLinkSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="shl_<random>: names the link, opens nothing")
    runId = serializers.CharField()
    creator = serializers.CharField(help_text="the username of the member who created it")
    createdAt = serializers.DateTimeField()
    expiresAt = serializers.DateTimeField()
    maxOpens = serializers.IntegerField(allow_null=True, help_text="null: no limit")
    openCount = serializers.IntegerField(help_text="opens so far (pages and evidence.json)")
    lastOpenedAt = serializers.DateTimeField(allow_null=True)
    revokedAt = serializers.DateTimeField(allow_null=True)
    includeSubRuns = serializers.BooleanField()
    status = enum(STATUSES, help_text="active, or why it answers 410")


class ShareLinkListSerializer(serializers.Serializer):
    shareLinks = ShareLinkSerializer(many=True)
    next = serializers.CharField(allow_null=True)


class CreateInputSerializer(Input):
    expiresInHours = serializers.IntegerField(min_value=1, max_value=sharing.MAX_EXPIRY_HOURS)
    includeSubRuns = serializers.BooleanField(
        required=False, default=False, help_text="sub-runs (any depth) are shown under the same link"
    )
    maxOpens = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=sharing.MAX_OPENS,
        help_text="the link answers 410 once opened this many times",
    )


class CreatedSerializer(serializers.Serializer):
    id = serializers.CharField()
    url = serializers.CharField(help_text="the link, token included: shown this once, never stored")
    expiresAt = serializers.DateTimeField()


LINK_ID = OpenApiParameter("link_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="shl_<random>")


class RunShareLinksView(ApiView):
    @extend_schema(
        operation_id="create_share_link",
        parameters=[RUN_ID, WORKSPACE],
        request=CreateInputSerializer,
        responses={
            201: CreatedSerializer,
            **error_responses(
                e400=[
                    "invalid_run_id",
                    "invalid_json",
                    "invalid_request (details.fields names each)",
                    "workspace_required",
                ],
                e403=["forbidden (below operator, or an API key)"],
                e404=["not_found"],
            ),
        },
        summary="Create a share link to a run (operator session)",
        tags=TAGS,
        description="`GET /s/{token}/` is then the read-only evidence page, no login, and "
        "`/s/{token}/evidence.json` the evidence bundle. Audited as `share_link.created`; "
        "every open as `share_link.opened`.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        caller, run = _operator_run(request, run_id)
        data = CreateInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        link, token = sharing.create_link(
            workspace=caller.workspace,
            run=run,
            by=caller.user,
            expires_in_hours=v["expiresInHours"],
            include_sub_runs=v["includeSubRuns"],
            max_opens=v.get("maxOpens"),
        )
        url = request.build_absolute_uri(sharing.share_path(token))
        return Response({"id": link.public_id, "url": url, "expiresAt": sharing.as_dict(link)["expiresAt"]}, status=201)

    @extend_schema(
        operation_id="list_share_links",
        parameters=[
            RUN_ID,
            WORKSPACE,
            OpenApiParameter("limit", OpenApiTypes.INT, description="1..500, default 50"),
            CURSOR,
        ],
        responses={
            200: ShareLinkListSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_parameter", "invalid_cursor", "workspace_required"],
                e403=["forbidden (below operator, or an API key)"],
                e404=["not_found"],
            ),
        },
        summary="A run's share links, newest first, never their tokens (operator session)",
        tags=TAGS,
    )
    def get(self, request: Request, run_id: str) -> Response:
        caller, run = _operator_run(request, run_id)
        limit = limit_param(request)
        cursor = decode_cursor(request, kind="share-links", scope=run)
        qs = sharing.links_of_run(caller.workspace, run.run_id).order_by("-pk")
        if cursor is not None:
            before = cursor.get("before")
            if not isinstance(before, int) or isinstance(before, bool):
                raise InvalidCursor("cursor is not one this API gave out")
            qs = qs.filter(pk__lt=before)
        links = list(qs[: limit + 1])
        more = len(links) > limit
        links = links[:limit]
        return Response(
            {
                "shareLinks": [sharing.as_dict(link) for link in links],
                "next": encode_cursor({"before": links[-1].pk}, kind="share-links", scope=run) if more else None,
            }
        )


class ShareLinkView(ApiView):
    @extend_schema(
        operation_id="revoke_share_link",
        parameters=[LINK_ID, WORKSPACE],
        request=None,
        responses={
            200: ShareLinkSerializer,
            **error_responses(e403=["forbidden (below operator, or an API key)"], e404=["not_found"]),
        },
        summary="Revoke a share link at once (operator session); idempotent",
        tags=TAGS,
        description="The link answers 410 from then on. Audited as `share_link.revoked` (the first time).",
    )
    def delete(self, request: Request, link_id: str) -> Response:
        who = principal(request)
        # The link first: another tenant's is 404 for a key too, before a key is refused its role.
        link = sharing.get_link(
            lookup_workspaces(who, workspace=request.query_params.get("workspace") or None), link_id
        )
        caller = within(who, link.workspace, role="operator")
        return Response(sharing.as_dict(sharing.revoke_link(link, by=caller.user)))


def _operator_run(request: Request, run_id: str) -> tuple[Access, Run]:
    # Outsiders first: a run the caller cannot see is 404 before the role is even asked.
    run_for(request, run_id, "read")
    caller = access_for(request, "read", run_id=run_id, role="operator")
    assert caller.run is not None
    return caller, caller.run


urlpatterns = [
    path("runs/<str:run_id>/share-links", RunShareLinksView.as_view(), name="api-run-share-links"),
    path("share-links/<str:link_id>", ShareLinkView.as_view(), name="api-share-link"),
]
