"""/api/v1/runs/{runId}/tool-calls/{callId}/approve and …/deny (docs/api.md "Run control"): an
approver or admin, in a console session and never the run's requester, decides a tool call waiting
for approval, bound to the digest of the arguments they reviewed (ledger/replay/toolapproval.py).
The decision is in the run's log and the audit log when this answers, and the run is queued for
the worker, which resumes it (ledger/reexecution/toolapprovals.py). Another tenant's run is 404."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from ledger.reexecution import toolapprovals

from .auth import access_for
from .base import ApiView, WrittenText, validate_run_id
from .gateway import CALL_ID
from .inputs import Input
from .schema import RUN_ID, WORKSPACE, error_responses

TAGS = ["run control"]


class ToolDecisionInputSerializer(Input):
    note = WrittenText(help_text="why: recorded in the run's log and in the audit log")
    argsDigest = serializers.CharField(
        max_length=80,
        help_text="the digest of the arguments you reviewed: the run's attention.detail.argsDigest, or the "
        "Approvals page's; another digest than the waiting call's is 409 approval_stale",
    )


class ToolDecisionSerializer(serializers.Serializer):
    runId = serializers.CharField()
    callId = serializers.CharField()
    toolName = serializers.CharField()
    decision = serializers.ChoiceField(choices=["approved", "rejected"])
    status = serializers.CharField(
        help_text="the call's status now: approved (it runs when the worker resumes the run), or failed (rejected)"
    )
    argsDigest = serializers.CharField()
    by = serializers.CharField(help_text="the approver's username")
    note = serializers.CharField()


def _decide(request: Request, run_id: str, call_id: str, *, approve: bool) -> Response:
    validate_run_id(run_id)
    # Another workspace's run is 404 for a key too, before a key is refused for not being a person.
    access_for(request, "read", run_id=run_id)
    caller = access_for(request, "read", run_id=run_id, role="approver")
    run = caller.run
    assert run is not None and caller.user is not None
    data = ToolDecisionInputSerializer(data=request.data)
    data.is_valid(raise_exception=True)
    v = data.validated_data
    call = toolapprovals.decide(
        workspace=run.workspace,
        run_id=run.run_id,
        call_id=call_id,
        approve=approve,
        seen_digest=v["argsDigest"],
        note=v["note"],
        by=caller.user,
    )
    return Response(
        {
            "runId": run.run_id,
            "callId": call.call_id,
            "toolName": call.tool_name,
            "decision": "approved" if approve else "rejected",
            "status": call.status,
            "argsDigest": v["argsDigest"],
            "by": caller.user.get_username(),
            "note": v["note"].strip(),
        }
    )


def _schema(*, approve: bool) -> dict[str, object]:
    verb = "Approve" if approve else "Deny"
    then = (
        "The call runs when the worker resumes the run, which it does at once"
        if approve
        else "The call is failed (ToolCallRejected) and never runs; the worker resumes the run, whose step "
        "fails as a failed tool call does"
    )
    return {
        "operation_id": f"{'approve' if approve else 'deny'}_tool_call",
        "parameters": [RUN_ID, CALL_ID, WORKSPACE],
        "request": ToolDecisionInputSerializer,
        "responses": {
            200: ToolDecisionSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_json", "invalid_request (details.fields names each)"],
                e403=[
                    "insufficient_scope",
                    "forbidden (below approver, or an API key: a person decides, in a console session; below admin, "
                    "approving a call of a run an API key that belongs to nobody started)",
                    "self_approval_forbidden (you started the run, or a key you own did, as the server recorded it)",
                ],
                e404=["not_found (no such run or tool call in your workspaces)"],
                e409=[
                    "approval_stale (details.argsDigest: the arguments waiting now)",
                    "tool_call_not_waiting (details.status)",
                    "run_finished",
                ],
            ),
        },
        "summary": f"{verb} a tool call waiting for approval (approver session, not the requester)",
        "tags": TAGS,
        "description": f"Bound to `argsDigest`, the digest of the arguments reviewed. {then}. Audited as "
        f"`tool_call.{'approved' if approve else 'rejected'}`.",
    }


class ToolCallApproveView(ApiView):
    @extend_schema(**_schema(approve=True))  # type: ignore[arg-type]
    def post(self, request: Request, run_id: str, call_id: str) -> Response:
        return _decide(request, run_id, call_id, approve=True)


class ToolCallDenyView(ApiView):
    @extend_schema(**_schema(approve=False))  # type: ignore[arg-type]
    def post(self, request: Request, run_id: str, call_id: str) -> Response:
        return _decide(request, run_id, call_id, approve=False)


urlpatterns = [
    path(
        "runs/<str:run_id>/tool-calls/<str:call_id>/approve",
        ToolCallApproveView.as_view(),
        name="api-tool-call-approve",
    ),
    path("runs/<str:run_id>/tool-calls/<str:call_id>/deny", ToolCallDenyView.as_view(), name="api-tool-call-deny"),
]
