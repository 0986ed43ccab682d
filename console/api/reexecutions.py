"""/api/v1/ re-execution (docs/api.md "Re-execution"): request, list, show, approve, deny, claim,
renew, divergence, and evaluate batches.

One small view per operation: find the caller and what it may see, call a service or selector in
ledger/reexecution, shape the answer. Another tenant's request or run is 404, never 403.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import clock
from ledger.errors import Conflict, NotFound
from ledger.log.prepare import validate_run_id
from ledger.models import ApiKey, ReexecutionRequest, Workspace
from ledger.reads import reexecutions, selectors
from ledger.reexecution import execution, services
from ledger.tenancy.access import Access, RoleRequired, lookup_workspaces, within

from .auth import access_for, principal
from .base import WrittenText
from .inputs import Input
from .pagination import InvalidParameter, encode_cursor, limit_param, list_query, row_cursor
from .schema import CURSOR, RUN_ID, WORKSPACE, choice, enum, error_responses

Mode = ReexecutionRequest.Mode
Status = ReexecutionRequest.Status
# Named enums of the schema (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
MODES = list(Mode.values)
STATUSES = list(Status.values)
TAGS = ["re-execution"]


class NotStarted(Conflict):
    code = "not_started"


def _nullable_str(**kwargs: Any) -> serializers.CharField:
    return serializers.CharField(allow_null=True, **kwargs)


# --- shapes ------------------------------------------------------------------------------------


class ModelTargetSerializer(serializers.Serializer):
    provider = serializers.CharField(min_length=1, max_length=200)
    model = serializers.CharField(min_length=1, max_length=200)


class ReexecutionSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="rx_<random>")
    workspace = serializers.CharField(help_text="TENANT/WORKSPACE")
    runId = serializers.CharField(help_text="the original run")
    mode = enum(Mode.values)
    fromStep = _nullable_str(help_text="fork only: the first step that runs live")
    input = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="present only when the request overrides the input (null is an override)",
    )
    modelOverrides = serializers.DictField(child=ModelTargetSerializer(), help_text="slot -> {provider, model}")
    promptOverrides = serializers.DictField(
        child=serializers.DictField(child=serializers.CharField()),
        required=False,
        help_text="present only for an evaluation's prompt change: step id -> {system?, prompt?}; a prompt's "
        '{original} stands for the prompt the workflow\'s code builds (docs/evaluations.md "Changes")',
    )
    workflow = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="present only for an evaluation's workflow change: {name, versionId}, the registered workflow "
        "the new run executes instead of the original's",
    )
    reason = serializers.CharField()
    requestedBy = serializers.CharField(help_text="a username, or key:<prefix> for an API key")
    unownedKey = serializers.BooleanField(
        help_text="true when requested with an API key that belongs to nobody: only an admin may approve it"
    )
    status = enum(Status.values)
    digest = serializers.CharField(
        help_text="sha256 of canonical {mode, fromStep, input?, modelOverrides, promptOverrides?, workflow?, lastSequence, planDigest}: what an approval binds to"
    )
    lastSequence = serializers.IntegerField(help_text="the run's last sequence when requested")
    planDigest = serializers.CharField(help_text="digest of the run's replay plan when requested")
    approver = _nullable_str(help_text="who approved or denied")
    note = _nullable_str(help_text="the approver's note")
    decidedAt = serializers.DateTimeField(allow_null=True)
    expiresAt = serializers.DateTimeField(help_text="a pending request expires then (approval_expired)")
    newRunId = _nullable_str(help_text="reserved at approval: run_<id> for a new run, the original's id for resume")
    executor = _nullable_str(
        help_text="null until approved; builtin: this deployment's worker; external: a harness claims it"
    )
    batchId = _nullable_str(help_text="set for the requests of an evaluate batch (one approval decides them all)")
    attempts = serializers.IntegerField(help_text="how many times an executor took it (more than 1 after a recovery)")
    error = serializers.JSONField(allow_null=True, help_text="why it failed")
    createdAt = serializers.DateTimeField()
    startedAt = serializers.DateTimeField(allow_null=True)
    finishedAt = serializers.DateTimeField(allow_null=True)


class ReexecutionDetailSerializer(ReexecutionSerializer):
    plan = serializers.JSONField(
        allow_null=True,
        help_text="null once the original run was pruned; else the replay plan for this mode: reused and live steps, liveWriteTools "
        "(every live write tool call the plan may make)",
    )


class ReexecutionListSerializer(serializers.Serializer):
    reexecutions = ReexecutionSerializer(many=True)
    next = serializers.CharField(allow_null=True)


# What an evaluation changes besides the models (docs/evaluations.md "Changes"): asked of a request
# or a batch, it would be dropped in silence and the runs evaluated without it.
EVALUATION_CHANGES = ("promptOverrides", "workflow", "inputs")


def _no_evaluation_changes(data: Any) -> None:
    named = [name for name in EVALUATION_CHANGES if isinstance(data, Mapping) and name in data]
    if named:
        raise serializers.ValidationError(
            {name: ["a change only an evaluation makes: POST /api/v1/evaluations"] for name in named}
        )


class RequestInputSerializer(Input):
    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        _no_evaluation_changes(self.initial_data)
        return attrs

    mode = choice(Mode.values)
    fromStep = serializers.CharField(required=False, max_length=500, help_text="required for fork, refused otherwise")
    input = serializers.JSONField(
        required=False, allow_null=True, help_text="fork and evaluate: the new run's input; absent keeps the original's"
    )
    modelOverrides = serializers.DictField(
        child=ModelTargetSerializer(), required=False, help_text="evaluate, fork, rerun: slot -> {provider, model}"
    )
    reason = WrittenText()


class DecisionInputSerializer(Input):
    note = WrittenText(help_text="required: why")


class DecisionSerializer(serializers.Serializer):
    reexecutions = ReexecutionSerializer(many=True, help_text="the request decided (all of its batch, for a batch)")


class ClaimInputSerializer(Input):
    owner = serializers.CharField(
        required=False, max_length=200, help_text="the executor's own name, for the audit log"
    )


class ClaimedSerializer(serializers.Serializer):
    request = ReexecutionSerializer()
    newRunId = serializers.CharField(help_text="append the new run here (the original's id for resume)")
    leaseToken = serializers.CharField(help_text="renew with POST /api/v1/reexecutions/{id}/lease")
    leaseExpiresAt = serializers.DateTimeField()


class LeaseInputSerializer(Input):
    leaseToken = serializers.CharField(max_length=64)


class LeaseSerializer(serializers.Serializer):
    id = serializers.CharField()
    leaseExpiresAt = serializers.DateTimeField()


class BatchInputSerializer(Input):
    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        _no_evaluation_changes(self.initial_data)
        return attrs

    runIds = serializers.ListField(
        child=serializers.CharField(max_length=84, trim_whitespace=False),
        min_length=1,
        max_length=services.MAX_BATCH_RUNS,
    )
    mode = choice(Mode.values, default=Mode.EVALUATE, help_text="evaluate (the only mode a batch takes)")
    modelOverrides = serializers.DictField(child=ModelTargetSerializer(), required=False)
    reason = WrittenText()


class BatchSerializer(serializers.Serializer):
    batchId = serializers.CharField()
    status = enum(Status.values, help_text="the batch's requests share a decision; this is the first one's status")
    reexecutions = ReexecutionSerializer(many=True)


RX_ID = OpenApiParameter("reexecution_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="rx_<random>")
BATCH_ID = OpenApiParameter("batch_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="rxb_<random>")


# --- helpers -----------------------------------------------------------------------------------


def _workspaces(request: Request) -> list[Workspace]:
    return lookup_workspaces(principal(request), workspace=request.query_params.get("workspace") or None)


def _find(request: Request, public_id: str, scope: str, role: str | None = None) -> tuple[Access, ReexecutionRequest]:
    """The request, if the caller may see it (404 otherwise, whatever the operation needs), and
    the caller acting on it (403 when it lacks the scope or role)."""
    found = reexecutions.get(_workspaces(request), public_id)
    return within(principal(request), found.workspace, scope=scope, role=role), found


def _principal(caller: Access) -> Any:
    return caller.api_key if caller.api_key is not None else caller.user


def _detail(found: ReexecutionRequest) -> dict[str, Any]:
    from ledger.runtime.reexecute import mode_plan

    plan = None
    if selectors.find_run(found.workspace, found.original_run_id) is not None:  # not pruned since
        plan = mode_plan(
            workspace=found.workspace,
            run_id=found.original_run_id,
            mode=found.mode,
            from_step=found.from_step,
            model_overrides=found.model_overrides or None,
        )
    return {**reexecutions.as_dict(found), "plan": plan}


# --- views -------------------------------------------------------------------------------------


class RunReexecutionsView(APIView):
    @extend_schema(
        operation_id="request_reexecution",
        parameters=[RUN_ID, WORKSPACE],
        request=RequestInputSerializer,
        responses={
            201: ReexecutionSerializer,
            **error_responses(
                e400=["invalid_run_id", "invalid_request", "workspace_required"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
                e409=["run_finished"],
            ),
        },
        summary="Request a re-execution of a run (operator session, or key with execute)",
        tags=TAGS,
        description="simulate starts `approved` and is queued at once; every other mode waits for an approver "
        "(pending_approval, expires after RUNLEDGER_APPROVAL_TTL_HOURS, default 24 h).",
    )
    def post(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "execute", run_id=run_id)
        data = RequestInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        made = services.request_reexecution(
            workspace=caller.workspace,
            run_id=run_id,
            mode=v["mode"],
            reason=v["reason"],
            by=_principal(caller),
            from_step=v.get("fromStep"),
            input=v["input"] if "input" in v else services.NOT_GIVEN,
            model_overrides=v.get("modelOverrides"),
        )
        return Response(reexecutions.as_dict(made), status=201)

    @extend_schema(
        operation_id="list_run_reexecutions",
        parameters=[RUN_ID, WORKSPACE],
        responses={
            200: ReexecutionListSerializer,
            **error_responses(
                e400=["invalid_run_id", "workspace_required"], e403=["insufficient_scope"], e404=["not_found"]
            ),
        },
        summary="The run's re-execution requests, oldest first (scope read)",
        tags=TAGS,
        description="Every request made of this run, and the one that made it when it is a re-execution's new run. "
        "One page: a run has few requests; `next` is always null.",
    )
    def get(self, request: Request, run_id: str) -> Response:
        validate_run_id(run_id)
        caller = access_for(request, "read", run_id=run_id)
        found = list(reexecutions.of_run(caller.workspace, run_id))
        made = reexecutions.made_run(caller.workspace, run_id)
        if made is not None and all(r.pk != made.pk for r in found):
            found.insert(0, made)
        return Response({"reexecutions": [reexecutions.as_dict(r) for r in found], "next": None})


class ReexecutionListView(APIView):
    @extend_schema(
        operation_id="list_reexecutions",
        parameters=[
            OpenApiParameter(
                "status",
                OpenApiTypes.STR,
                enum=Status.values,
                description="e.g. pending_approval: what approvers have to decide",
            ),
            OpenApiParameter("limit", OpenApiTypes.INT, description="page size, default 50, 1..500"),
            CURSOR,
            WORKSPACE,
        ],
        responses={
            200: ReexecutionListSerializer,
            **error_responses(
                e400=["invalid_parameter", "invalid_cursor", "workspace_required"],
                e403=["insufficient_scope"],
                e404=["not_found"],
            ),
        },
        summary="Re-execution requests of the workspace, oldest first (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        caller = access_for(request, "read")
        status = request.query_params.get("status") or None
        if status is not None and status not in Status.values:
            raise InvalidParameter(f"status must be one of {', '.join(Status.values)}", parameter="status")
        limit = limit_param(request)
        query = list_query(request, "status")
        after = row_cursor(request, "after", kind="reexecutions", scope=caller.workspace, query=query)
        rows = reexecutions.page(caller.workspace, after_pk=after, limit=limit + 1, status=status)
        more = len(rows) > limit
        rows = rows[:limit]
        return Response(
            {
                "reexecutions": [reexecutions.as_dict(r) for r in rows],
                "next": encode_cursor({"after": rows[-1].pk}, kind="reexecutions", scope=caller.workspace, query=query)
                if more
                else None,
            }
        )


class ReexecutionView(APIView):
    @extend_schema(
        operation_id="get_reexecution",
        parameters=[RX_ID, WORKSPACE],
        responses={
            200: ReexecutionDetailSerializer,
            **error_responses(e403=["insufficient_scope"], e404=["not_found"]),
        },
        summary="A re-execution request: status, new run id, approver, note, digest, plan (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request, reexecution_id: str) -> Response:
        _, found = _find(request, reexecution_id, "read")
        return Response(_detail(found))


class _DecisionView(APIView):
    decide: Any = None

    def post(self, request: Request, reexecution_id: str) -> Response:
        caller, found = _find(request, reexecution_id, "execute", role="approver")
        data = DecisionInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        decided = type(self).decide(
            workspace=found.workspace, reexecution_id=found.public_id, by=caller.user, note=data.validated_data["note"]
        )
        return Response({"reexecutions": [reexecutions.as_dict(r) for r in decided]})


_DECISION_ERRORS = error_responses(
    e400=["invalid_request"],
    e403=["forbidden", "self_approval_forbidden", "insufficient_scope"],
    e404=["not_found"],
    e409=["approval_expired", "plan_changed", "reexecution_not_pending"],
)


class ApproveView(_DecisionView):
    decide = staticmethod(services.approve)

    @extend_schema(
        operation_id="approve_reexecution",
        parameters=[RX_ID, WORKSPACE],
        request=DecisionInputSerializer,
        responses={200: DecisionSerializer, **_DECISION_ERRORS},
        summary="Approve a request (approver or admin session, not the requester)",
        tags=TAGS,
        description="Binds to the request's digest: 409 plan_changed when the run's log or replay plan moved since; "
        "409 approval_expired past expiresAt (the request is then expired). API keys: 403. For a "
        "request of an evaluate batch, approves the whole batch.",
    )
    def post(self, request: Request, reexecution_id: str) -> Response:
        return super().post(request, reexecution_id)


class DenyView(_DecisionView):
    decide = staticmethod(services.deny)

    @extend_schema(
        operation_id="deny_reexecution",
        parameters=[RX_ID, WORKSPACE],
        request=DecisionInputSerializer,
        responses={200: DecisionSerializer, **_DECISION_ERRORS},
        summary="Deny a request with a note (approver or admin session)",
        tags=TAGS,
        description="For a request of an evaluate batch, denies the whole batch. API keys: 403.",
    )
    def post(self, request: Request, reexecution_id: str) -> Response:
        return super().post(request, reexecution_id)


class ClaimView(APIView):
    @extend_schema(
        operation_id="claim_reexecution",
        request=ClaimInputSerializer,
        responses={
            200: ClaimedSerializer,
            204: OpenApiResponse(description="nothing to claim"),
            **error_responses(e400=["invalid_request"], e403=["insufficient_scope", "forbidden"]),
        },
        summary="An external executor takes the next approved request (key with execute)",
        tags=TAGS,
        description="Hands out, oldest approval first, an approved request of the key's workspace whose workflow "
        "this deployment does not execute itself (executor external), or one whose previous claimant's "
        "lease ran out — it continues the same newRunId. The request becomes running under a lease "
        "(RUNLEDGER_REEXEC_LEASE_SECONDS); renew it with POST /api/v1/reexecutions/{id}/lease. Append "
        "the new run to newRunId through POST /api/v1/runs/{runId}/events; its RunCompleted or "
        "RunFailed settles the request (succeeded or failed).",
    )
    def post(self, request: Request) -> Response:
        if not isinstance(request.auth, ApiKey):
            raise RoleRequired("claiming is for executors: an API key with the execute scope")
        access_for(request, "execute")
        data = ClaimInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        claimed = execution.claim_next(api_key=request.auth, owner=data.validated_data.get("owner", ""))
        if claimed is None:
            return Response(status=204)
        return Response(
            {
                "request": reexecutions.as_dict(claimed),
                "newRunId": claimed.new_run_id,
                "leaseToken": claimed.lease_token,
                # a taken lease always has its expiry
                "leaseExpiresAt": clock.iso(claimed.lease_expires_at),
            }
        )


class LeaseView(APIView):
    @extend_schema(
        operation_id="renew_reexecution_lease",
        parameters=[RX_ID],
        request=LeaseInputSerializer,
        responses={
            200: LeaseSerializer,
            **error_responses(
                e400=["invalid_request"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
                e409=["lease_lost"],
            ),
        },
        summary="The claimant renews its lease on a request (key with execute)",
        tags=TAGS,
    )
    def post(self, request: Request, reexecution_id: str) -> Response:
        if not isinstance(request.auth, ApiKey):
            _find(request, reexecution_id, "read")  # another tenant's request is 404 for a person too
            raise RoleRequired("leases are held by executors: an API key with the execute scope")
        caller, found = _find(request, reexecution_id, "execute")
        data = LeaseInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        renewed = execution.renew_lease(
            workspace=caller.workspace, reexecution_id=found.public_id, lease_token=data.validated_data["leaseToken"]
        )
        expires = renewed.lease_expires_at
        assert expires is not None  # a taken lease always has its expiry
        return Response({"id": renewed.public_id, "leaseExpiresAt": clock.iso(expires)})


class DivergenceView(APIView):
    @extend_schema(
        operation_id="reexecution_divergence",
        parameters=[RX_ID, WORKSPACE],
        responses={
            200: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="the step-by-step comparison of the original and the new run, computed from both logs",
            ),
            **error_responses(e403=["insufficient_scope"], e404=["not_found"], e409=["not_started"]),
        },
        summary="How the new run differs from the original, step by step (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request, reexecution_id: str) -> Response:
        _, found = _find(request, reexecution_id, "read")
        if not found.new_run_id or selectors.find_run(found.workspace, found.new_run_id) is None:
            raise NotStarted(
                f"re-execution {found.public_id} has no new run yet ({found.status})",
                reexecutionId=found.public_id,
                status=found.status,
            )
        from ledger.replay.divergence import divergence_report  # built with the runtime's re-execution

        return Response(
            divergence_report(
                workspace=found.workspace, original_run_id=found.original_run_id, new_run_id=found.new_run_id
            )
        )


class BatchesView(APIView):
    @extend_schema(
        operation_id="request_evaluate_batch",
        parameters=[WORKSPACE],
        request=BatchInputSerializer,
        responses={
            201: BatchSerializer,
            **error_responses(
                e400=["invalid_request", "invalid_run_id", "workspace_required"],
                e403=["insufficient_scope", "forbidden"],
                e404=["not_found"],
            ),
        },
        summary="Request an evaluate over many runs: one approval for the batch",
        tags=TAGS,
        description="One evaluate request per run, sharing a batchId; approving or denying any of them (or the "
        "batch) decides them all, and plan_changed on any run refuses the whole approval.",
    )
    def post(self, request: Request) -> Response:
        caller = access_for(request, "execute")
        data = BatchInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        batch_id, made = services.request_batch(
            workspace=caller.workspace,
            run_ids=v["runIds"],
            reason=v["reason"],
            by=_principal(caller),
            mode=v["mode"],
            model_overrides=v.get("modelOverrides"),
        )
        return Response(_batch(batch_id, made), status=201)


def _batch(batch_id: str, made: list[ReexecutionRequest]) -> dict[str, Any]:
    return {"batchId": batch_id, "status": made[0].status, "reexecutions": [reexecutions.as_dict(r) for r in made]}


class BatchView(APIView):
    @extend_schema(
        operation_id="get_evaluate_batch",
        parameters=[BATCH_ID, WORKSPACE],
        responses={200: BatchSerializer, **error_responses(e403=["insufficient_scope"], e404=["not_found"])},
        summary="An evaluate batch and its requests (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request, batch_id: str) -> Response:
        for workspace in _workspaces(request):
            try:
                made = reexecutions.of_batch(workspace, batch_id)
            except NotFound:
                continue
            _find(request, made[0].public_id, "read")
            return Response(_batch(batch_id, made))
        raise NotFound(f"batch {batch_id} not found", batchId=batch_id)


urlpatterns = [
    path("runs/<str:run_id>/reexecutions", RunReexecutionsView.as_view(), name="run-reexecutions"),
    path("reexecutions", ReexecutionListView.as_view(), name="reexecutions"),
    path("reexecutions/claim", ClaimView.as_view(), name="reexecution-claim"),
    path("reexecutions/batches", BatchesView.as_view(), name="reexecution-batches"),
    path("reexecutions/batches/<str:batch_id>", BatchView.as_view(), name="reexecution-batch"),
    path("reexecutions/<str:reexecution_id>", ReexecutionView.as_view(), name="reexecution"),
    path("reexecutions/<str:reexecution_id>/approve", ApproveView.as_view(), name="reexecution-approve"),
    path("reexecutions/<str:reexecution_id>/deny", DenyView.as_view(), name="reexecution-deny"),
    path("reexecutions/<str:reexecution_id>/lease", LeaseView.as_view(), name="reexecution-lease"),
    path("reexecutions/<str:reexecution_id>/divergence", DivergenceView.as_view(), name="reexecution-divergence"),
]
