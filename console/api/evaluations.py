"""/api/v1/ datasets, evaluation policies and evaluations (docs/api.md "Evaluations",
docs/evaluations.md): one small view per operation over ledger/evaluation. Another tenant's
dataset, policy or evaluation is 404, never 403."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.evaluation import budget, datasets, evaluations, policies
from ledger.evaluation.access import require_member
from ledger.evaluation.errors import EvaluationForbidden
from ledger.models import Evaluation, Role, Workspace

from .auth import access_for, principal
from .base import WrittenText
from .inputs import Input
from .pagination import (
    InvalidCursor,
    InvalidParameter,
    decode_cursor,
    encode_cursor,
    keyset_cursor,
    limit_param,
)
from .schema import CURSOR, LIMIT, WORKSPACE, enum, error_responses

TAGS = ["evaluations"]
NAME = OpenApiParameter("name", OpenApiTypes.STR, OpenApiParameter.PATH, description="the dataset's name")
VERSION = OpenApiParameter("version", OpenApiTypes.INT, description="a version number (default: the latest)")
POLICY_ID = OpenApiParameter("policy_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="evp_<random>")
EVALUATION_ID = OpenApiParameter("evaluation_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="ev_<random>")
READ_ERRORS = error_responses(e400=["workspace_required"], e403=["insufficient_scope"], e404=["not_found"])
LIST_ERRORS = error_responses(
    e400=["invalid_parameter", "invalid_cursor", "workspace_required"], e403=["insufficient_scope"], e404=["not_found"]
)


def _page(rows: list[Any], limit: int, cursor: Any, *, kind: str, scope: Workspace) -> tuple[list[Any], str | None]:
    """The first `limit` of `rows` (asked for one more) and the `next` cursor: `cursor(last row)`,
    sealed for the list `kind` of the workspace."""
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, encode_cursor(cursor(rows[-1]), kind=kind, scope=scope) if more else None


def _newest_first(row: Any) -> dict[str, Any]:
    return {"t": row.created_at.isoformat(), "id": row.pk}


def _name_cursor(request: Request, workspace: Workspace) -> str | None:
    cursor = decode_cursor(request, kind="datasets", scope=workspace)
    if cursor is None:
        return None
    name = cursor.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 100 or "\x00" in name:
        raise InvalidCursor("cursor is not one this API gave out")
    return name


WRITE_ERRORS = error_responses(
    e400=["invalid_request", "workspace_required"], e403=["insufficient_scope", "forbidden"], e404=["not_found"]
)
# A dataset's runs are named by id: one of the wrong form is 400 invalid_run_id (details.field), not 404.
DATASET_WRITE_ERRORS = error_responses(
    e400=["invalid_request", "invalid_run_id", "workspace_required"],
    e403=["insufficient_scope", "forbidden"],
    e404=["not_found"],
)


# --- shapes ------------------------------------------------------------------------------------


class DatasetSerializer(serializers.Serializer):
    name = serializers.CharField()
    createdBy = serializers.CharField()
    createdAt = serializers.DateTimeField()
    latestVersion = serializers.IntegerField(allow_null=True)
    size = serializers.IntegerField(help_text="runs in the latest version")
    digest = serializers.CharField(allow_null=True, help_text="the latest version's digest")


class DatasetVersionSerializer(serializers.Serializer):
    dataset = serializers.CharField()
    version = serializers.IntegerField()
    digest = serializers.CharField(help_text="sha256 of canonical {dataset, members}")
    createdBy = serializers.CharField()
    createdAt = serializers.DateTimeField()
    members = serializers.JSONField(help_text="[{runId, lastSequence, expected, expectedEditedBy?}] in run id order")


class RunIdsSerializer(Input):
    # Run ids are taken as sent (no trimming): "run_a\n" is not run_a, but 400 invalid_run_id.
    runIds = serializers.ListField(
        child=serializers.CharField(max_length=84, trim_whitespace=False), min_length=1, max_length=200
    )


class ExpectedSerializer(Input):
    runId = serializers.CharField(max_length=84, trim_whitespace=False)
    expected = serializers.JSONField(allow_null=True)


class PolicySerializer(serializers.Serializer):
    id = serializers.CharField(help_text="evp_<random>")
    dataset = serializers.CharField()
    changeKinds = serializers.ListField(child=serializers.CharField())
    scorers = serializers.ListField(child=serializers.CharField())
    ceilingPerEvaluationUsd = serializers.CharField()
    ceilingPerDayUsd = serializers.CharField()
    expiresAt = serializers.DateTimeField()
    digest = serializers.CharField(help_text="what the approval binds to")
    approvedBy = serializers.CharField()
    note = serializers.CharField()
    createdAt = serializers.DateTimeField()
    revokedAt = serializers.DateTimeField(allow_null=True)
    active = serializers.BooleanField()


class PolicyInputSerializer(Input):
    dataset = serializers.CharField(max_length=100)
    changeKinds = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1, max_length=10)
    scorers = serializers.ListField(child=serializers.CharField(max_length=100), min_length=1, max_length=20)
    ceilingPerEvaluationUsd = serializers.CharField(max_length=40)
    ceilingPerDayUsd = serializers.CharField(max_length=40)
    ttlHours = serializers.FloatField()
    note = WrittenText(required=False, default="")


class NoteSerializer(Input):
    note = WrittenText(required=False, default="")


class BudgetReasonSerializer(serializers.Serializer):
    code = enum(
        list(budget.STOP_CODES),
        help_text="ceiling_reached / cost_unknown: the evaluation's own ceiling was spent, or cannot be kept "
        "(a model call of its runs or of its scorers has no known cost); day_…: the same for its policy's daily "
        "ceiling",
    )
    message = serializers.CharField(help_text="for a person: which ceiling, and why")


class EvaluationSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="ev_<random>")
    dataset = serializers.CharField()
    datasetVersion = serializers.IntegerField()
    datasetDigest = serializers.CharField()
    change = serializers.JSONField(
        help_text="one of {kind: model, modelOverrides: {slot: {provider, model}}}, {kind: prompt, prompts: {stepId: "
        "{system?, prompt?}}}, {kind: input, inputs: {runId: input}} or {kind: input, mergePatch: {...}}, "
        '{kind: workflow, workflow, version} (docs/evaluations.md "Changes")'
    )
    scorers = serializers.JSONField(help_text="[{name, args}]")
    failIf = serializers.CharField(allow_null=True)
    policyId = serializers.CharField(allow_null=True, help_text="the policy it started under; null: a person approved")
    ceilingUsd = serializers.CharField(allow_null=True)
    batchId = serializers.CharField(help_text="its evaluate batch of re-executions")
    status = enum(list(Evaluation.Status.values))
    verdict = enum([v for v in Evaluation.Verdict.values if v], allow_null=True)
    budgetExhausted = serializers.BooleanField()
    budgetReason = BudgetReasonSerializer(
        allow_null=True, help_text="why the spend ceiling stopped it (the first time it did); null until then"
    )
    unpricedCalls = serializers.IntegerField(
        min_value=0,
        help_text="its paid model calls of unknown cost so far, its new runs' and its scorers' (no price for the "
        "model, no usage reported, or a scorer's call that failed after its request left): while above 0 the "
        "spend (report.aggregates.spendUsd) is a lower bound, and a ceiling stops it at its next paid call",
    )
    reason = serializers.CharField()
    requestedBy = serializers.CharField()
    createdAt = serializers.DateTimeField()
    finishedAt = serializers.DateTimeField(allow_null=True)
    report = serializers.JSONField(allow_null=True, required=False, help_text="{runs, aggregates}; docs/evaluations.md")


class EvaluationInputSerializer(Input):
    dataset = serializers.CharField(max_length=100)
    version = serializers.IntegerField(required=False, min_value=1)
    change = serializers.JSONField(
        help_text="the change, one kind per evaluation: model, prompt, input or workflow (as in the evaluation)"
    )
    scorers = serializers.JSONField()
    failIf = serializers.CharField(required=False, default="", allow_blank=True, max_length=500)
    reason = WrittenText()


def _version_param(request: Request) -> int | None:
    raw = request.query_params.get("version")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidParameter("version must be a positive integer", parameter="version")
    return int(raw)


def _approver(request: Request, workspace: Workspace) -> User:
    """A policy is a person's decision: a key is refused (403), and so is a member below approver,
    before the body is read (a refusal does not depend on what was sent)."""
    by = principal(request)
    if not isinstance(by, User):
        raise EvaluationForbidden("an evaluation policy is approved by a person in a console session", role="approver")
    require_member(by, workspace, Role.APPROVER)
    return by


def _by(caller: Any) -> Any:
    return caller.api_key if caller.api_key is not None else caller.user


# --- datasets ----------------------------------------------------------------------------------


class DatasetListSerializer(serializers.Serializer):
    datasets = DatasetSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="pass as ?cursor= for the next page; null on the last")


class DatasetsView(APIView):
    @extend_schema(
        operation_id="list_datasets",
        parameters=[LIMIT, CURSOR, WORKSPACE],
        responses={200: DatasetListSerializer, **LIST_ERRORS},
        summary="The workspace's datasets by name (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        caller = access_for(request, "read")
        limit = limit_param(request)
        found = datasets.datasets(caller.workspace, limit=limit + 1, after=_name_cursor(request, caller.workspace))
        rows, next_cursor = _page(found, limit, lambda d: {"name": d.name}, kind="datasets", scope=caller.workspace)
        return Response({"datasets": [datasets.dataset_json(d) for d in rows], "next": next_cursor})


class DatasetView(APIView):
    @extend_schema(
        operation_id="get_dataset",
        parameters=[NAME, VERSION, WORKSPACE],
        responses={200: DatasetVersionSerializer, **error_responses(
            e400=["invalid_parameter", "workspace_required"], e403=["insufficient_scope"], e404=["not_found"]
        )},
        summary="A dataset's version, its runs and expected outputs (scope read)",
        tags=TAGS,
    )  # fmt: skip
    def get(self, request: Request, name: str) -> Response:
        caller = access_for(request, "read")
        number = _version_param(request)
        version = datasets.get_version(datasets.get_dataset(caller.workspace, name), number)
        return Response(datasets.version_json(version))


class DatasetRunsView(APIView):
    @extend_schema(
        operation_id="add_dataset_runs",
        parameters=[NAME, WORKSPACE],
        request=RunIdsSerializer,
        responses={
            201: DatasetVersionSerializer,
            200: OpenApiResponse(
                DatasetVersionSerializer, description="every run named was already in it: the latest version"
            ),
            **DATASET_WRITE_ERRORS,
        },
        summary="Add finished runs to a dataset (made on first use): its next version",
        tags=TAGS,
    )
    def post(self, request: Request, name: str) -> Response:
        caller = access_for(request, "execute")
        data = RunIdsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        added = datasets.add_runs(
            workspace=caller.workspace, name=name, run_ids=data.validated_data["runIds"], by=_by(caller)
        )
        return Response(datasets.version_json(added.version), status=201 if added.made else 200)


class DatasetRemoveView(APIView):
    @extend_schema(
        operation_id="remove_dataset_runs",
        parameters=[NAME, WORKSPACE],
        request=RunIdsSerializer,
        responses={201: DatasetVersionSerializer, **DATASET_WRITE_ERRORS},
        summary="Remove runs from a dataset: its next version",
        tags=TAGS,
    )
    def post(self, request: Request, name: str) -> Response:
        caller = access_for(request, "execute")
        data = RunIdsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = datasets.remove_runs(
            workspace=caller.workspace, name=name, run_ids=data.validated_data["runIds"], by=_by(caller)
        )
        return Response(datasets.version_json(version), status=201)


class DatasetExpectedView(APIView):
    @extend_schema(
        operation_id="set_dataset_expected",
        parameters=[NAME, WORKSPACE],
        request=ExpectedSerializer,
        responses={201: DatasetVersionSerializer, **DATASET_WRITE_ERRORS},
        summary="Set one member run's expected output: the dataset's next version",
        tags=TAGS,
    )
    def post(self, request: Request, name: str) -> Response:
        caller = access_for(request, "execute")
        data = ExpectedSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = datasets.set_expected(
            workspace=caller.workspace,
            name=name,
            run_id=data.validated_data["runId"],
            expected=data.validated_data["expected"],
            by=_by(caller),
        )
        return Response(datasets.version_json(version), status=201)


# --- policies ----------------------------------------------------------------------------------


class PolicyListSerializer(serializers.Serializer):
    policies = PolicySerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="pass as ?cursor= for the next page; null on the last")


class PoliciesView(APIView):
    @extend_schema(
        operation_id="list_evaluation_policies",
        parameters=[LIMIT, CURSOR, WORKSPACE],
        responses={200: PolicyListSerializer, **LIST_ERRORS},
        summary="The workspace's evaluation policies, newest first (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        caller = access_for(request, "read")
        limit = limit_param(request)
        after = keyset_cursor(request, kind="evaluation-policies", scope=caller.workspace)
        found = policies.policies(caller.workspace, limit=limit + 1, after=after)
        rows, next_cursor = _page(found, limit, _newest_first, kind="evaluation-policies", scope=caller.workspace)
        return Response({"policies": [policies.policy_json(p) for p in rows], "next": next_cursor})

    @extend_schema(
        operation_id="approve_evaluation_policy",
        parameters=[WORKSPACE],
        request=PolicyInputSerializer,
        responses={201: PolicySerializer, **WRITE_ERRORS},
        summary="Approve an evaluation policy (an approver in a console session)",
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        caller = access_for(request, "read")
        by = _approver(request, caller.workspace)
        data = PolicyInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        policy = policies.approve_policy(
            workspace=caller.workspace,
            dataset=v["dataset"],
            change_kinds=v["changeKinds"],
            scorers=v["scorers"],
            ceiling_per_evaluation_usd=v["ceilingPerEvaluationUsd"],
            ceiling_per_day_usd=v["ceilingPerDayUsd"],
            ttl_hours=v["ttlHours"],
            note=v["note"],
            by=by,
        )
        return Response(policies.policy_json(policy), status=201)


class PolicyRevokeView(APIView):
    @extend_schema(
        operation_id="revoke_evaluation_policy",
        parameters=[POLICY_ID, WORKSPACE],
        request=NoteSerializer,
        responses={200: PolicySerializer, **WRITE_ERRORS},
        summary="Revoke an evaluation policy (an approver in a console session)",
        tags=TAGS,
    )
    def post(self, request: Request, policy_id: str) -> Response:
        caller = access_for(request, "read")
        policies.get_policy(caller.workspace, policy_id)  # another workspace's is 404, for a key too
        by = _approver(request, caller.workspace)
        data = NoteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy = policies.revoke_policy(
            workspace=caller.workspace,
            public_id=policy_id,
            by=by,
            note=data.validated_data["note"],
        )
        return Response(policies.policy_json(policy))


# --- evaluations -------------------------------------------------------------------------------


class EvaluationListSerializer(serializers.Serializer):
    evaluations = EvaluationSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="pass as ?cursor= for the next page; null on the last")


class EvaluationsView(APIView):
    @extend_schema(
        operation_id="list_evaluations",
        parameters=[LIMIT, CURSOR, WORKSPACE],
        responses={200: EvaluationListSerializer, **LIST_ERRORS},
        summary="The workspace's evaluations, newest first, without their reports (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request) -> Response:
        caller = access_for(request, "read")
        limit = limit_param(request)
        after = keyset_cursor(request, kind="evaluations", scope=caller.workspace)
        found = evaluations.evaluations(caller.workspace, limit=limit + 1, after=after)
        rows, next_cursor = _page(found, limit, _newest_first, kind="evaluations", scope=caller.workspace)
        unpriced = budget.unpriced_calls_of(caller.workspace.pk, rows)
        return Response(
            {
                "evaluations": [
                    evaluations.evaluation_json(e, report=False, unpriced_calls=unpriced[e.pk]) for e in rows
                ],
                "next": next_cursor,
            }
        )

    @extend_schema(
        operation_id="start_evaluation",
        parameters=[WORKSPACE],
        request=EvaluationInputSerializer,
        responses={201: EvaluationSerializer, **WRITE_ERRORS},
        summary="Evaluate a change against a dataset: starts inside a policy, else waits for an approver",
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        caller = access_for(request, "execute")
        data = EvaluationInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        made = evaluations.start_evaluation(
            workspace=caller.workspace,
            dataset=v["dataset"],
            version=v.get("version"),
            change=v["change"],
            scorers=v["scorers"],
            fail_if=v["failIf"],
            reason=v["reason"],
            by=_by(caller),
        )
        return Response(evaluations.evaluation_json(made), status=201)


class EvaluationView(APIView):
    @extend_schema(
        operation_id="get_evaluation",
        parameters=[EVALUATION_ID, WORKSPACE],
        responses={200: EvaluationSerializer, **READ_ERRORS},
        summary="An evaluation, its verdict and report (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request, evaluation_id: str) -> Response:
        caller = access_for(request, "read")
        return Response(evaluations.evaluation_json(evaluations.get_evaluation(caller.workspace, evaluation_id)))


class EvaluationJUnitView(APIView):
    @extend_schema(
        operation_id="get_evaluation_junit",
        parameters=[EVALUATION_ID, WORKSPACE],
        responses={
            (200, "application/xml"): OpenApiResponse(OpenApiTypes.STR, description="JUnit XML"),
            **READ_ERRORS,
        },
        summary="An evaluation's report as JUnit XML for CI (scope read)",
        tags=TAGS,
    )
    def get(self, request: Request, evaluation_id: str) -> HttpResponse:
        caller = access_for(request, "read")
        found = evaluations.get_evaluation(caller.workspace, evaluation_id)
        return HttpResponse(evaluations.junit_xml(found), content_type="application/xml; charset=utf-8")


urlpatterns = [
    path("datasets", DatasetsView.as_view(), name="datasets"),
    path("datasets/<str:name>", DatasetView.as_view(), name="dataset"),
    path("datasets/<str:name>/runs", DatasetRunsView.as_view(), name="dataset-runs"),
    path("datasets/<str:name>/runs/remove", DatasetRemoveView.as_view(), name="dataset-runs-remove"),
    path("datasets/<str:name>/expected", DatasetExpectedView.as_view(), name="dataset-expected"),
    path("evaluation-policies", PoliciesView.as_view(), name="evaluation-policies"),
    path("evaluation-policies/<str:policy_id>/revoke", PolicyRevokeView.as_view(), name="evaluation-policy-revoke"),
    path("evaluations", EvaluationsView.as_view(), name="evaluations"),
    path("evaluations/<str:evaluation_id>", EvaluationView.as_view(), name="evaluation"),
    path("evaluations/<str:evaluation_id>/junit", EvaluationJUnitView.as_view(), name="evaluation-junit"),
]
