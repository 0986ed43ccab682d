"""What a person must do about a run: its *attention* state (docs/api.md, the run object).

The run statuses stay pending | running | completed | failed; a run that waits for a person is
`running` to them. Its attention says why it does not move, read from the projections the fold
writes in the append's transaction (tool calls, steps) and from the re-execution requests, so it is
exactly as current as the log and `ledger verify` checks every row it reads:

- `tool_call_in_doubt`: a call's request left and no outcome came back; an operator reconciles it;
- `waiting_tool_approval`: a call waits for an approver (ledger/replay/toolapproval.py);
- `reexecution_pending`: a re-execution of the run waits for an approver (also on a finished run);
- `retry_scheduled`: a step failed, and its next attempt is recorded to start at `retryAt`.

The first three ask a person to act, the last tells them when the run moves on by itself (a model
call's retry inside a step, `harness.model.failed {retryAt}`, is the step's own business and not
shown: the step is still running). A run with
several is shown by the first in this order. A finished run has none but `reexecution_pending`:
nothing can be appended to it, so there is nothing left to reconcile, approve or retry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, NullIf
from django.utils.dateparse import parse_datetime

from ..canonical import digest
from ..log.envelopes import format_recorded_at
from ..models import Event, ReexecutionRequest, Run, RunStatus, Step, ToolCall, Workspace

IN_DOUBT = "tool_call_in_doubt"
WAITING_APPROVAL = "waiting_tool_approval"
REEXECUTION_PENDING = "reexecution_pending"
RETRY_SCHEDULED = "retry_scheduled"
KINDS = (IN_DOUBT, WAITING_APPROVAL, REEXECUTION_PENDING, RETRY_SCHEDULED)  # most urgent first
ANY = "any"
LABELS = {
    IN_DOUBT: "tool call in doubt",
    WAITING_APPROVAL: "waiting for tool approval",
    REEXECUTION_PENDING: "re-execution awaiting approval",
    RETRY_SCHEDULED: "retry scheduled",
}
_CALL_STATUS = {IN_DOUBT: "in_doubt", WAITING_APPROVAL: "waiting_approval"}


@dataclass(frozen=True)
class Attention:
    kind: str
    since: datetime | None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    @property
    def retry_at(self) -> datetime | None:
        value = self.detail.get("retryAt")
        return parse_datetime(value) if isinstance(value, str) else None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "since": None if self.since is None else format_recorded_at(self.since),
            "detail": self.detail,
        }


def _unfinished(run_field: str = "run") -> Q:
    return ~Q(**{f"{run_field}__status__in": RunStatus.finished()})


def _waiting_calls(run_pks: list[int]) -> QuerySet[ToolCall]:
    started = Event.objects.filter(run_id=OuterRef("run_id"), sequence=OuterRef("started_sequence"))
    return (
        ToolCall.objects.filter(run_id__in=run_pks, status__in=list(_CALL_STATUS.values()))
        .filter(_unfinished())
        .annotate(since=Subquery(started.values("recorded_at")[:1]))
        .order_by("run_id", "position")
    )


def _retries(run_pks: list[int]) -> QuerySet[Step]:
    return (
        Step.objects.filter(run_id__in=run_pks, status="failed", error__has_key="retryAt")
        .filter(_unfinished())
        .order_by("run_id", "position")
    )


def _pending_requests(workspace: Workspace, run_ids: list[str]) -> QuerySet[ReexecutionRequest]:
    return ReexecutionRequest.objects.filter(
        workspace=workspace, original_run_id__in=run_ids, status=ReexecutionRequest.Status.PENDING_APPROVAL
    ).order_by("created_at", "pk")


def args_digest(tool_name: str, args: Any) -> str:
    """What a tool approval binds to (ledger/replay/toolapproval.py): the digest of the tool's
    name and its arguments as the log holds them."""
    return digest({"toolName": tool_name, "args": args})


def _call_detail(call: ToolCall) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "callId": call.call_id,
        "toolName": call.tool_name or None,
        "stepPath": call.step_path or None,
    }
    if call.status == "waiting_approval":
        detail["argsDigest"] = args_digest(call.tool_name, call.args)
    return detail


def _retry_detail(step: Step) -> dict[str, Any]:
    error = step.error if isinstance(step.error, dict) else {}
    attempts = step.attempts if isinstance(step.attempts, list) else []
    last = attempts[-1] if attempts and isinstance(attempts[-1], dict) else {}
    return {
        "stepPath": step.step_path,
        "attempt": last.get("attempt"),
        "retryAt": error.get("retryAt"),
        "error": {"name": error.get("name"), "message": error.get("message")},
    }


def for_runs(
    workspace: Workspace, runs: Iterable[Run], *, pending: Iterable[ReexecutionRequest] | None = None
) -> dict[str, Attention]:
    """The attention of each run that has one, by run id: three queries for a whole page (one
    when every run of it has finished; none then when the caller has read the runs' pending
    re-execution requests, oldest first, as `pending`)."""
    rows = list(runs)
    if not rows:
        return {}
    by_pk = {r.pk: r.run_id for r in rows}
    open_pks = [r.pk for r in rows if r.status not in RunStatus.finished()]
    found: dict[str, dict[str, Attention]] = {}

    def keep(run_id: str, attention: Attention) -> None:
        found.setdefault(run_id, {}).setdefault(attention.kind, attention)  # the oldest of a kind

    for call in _waiting_calls(open_pks) if open_pks else []:
        kind = IN_DOUBT if call.status == "in_doubt" else WAITING_APPROVAL
        keep(by_pk[call.run_id], Attention(kind, call.since, _call_detail(call)))  # type: ignore[attr-defined]
    for step in _retries(open_pks) if open_pks else []:
        keep(by_pk[step.run_id], Attention(RETRY_SCHEDULED, step.finished_at, _retry_detail(step)))
    for rx in _pending_requests(workspace, list(by_pk.values())) if pending is None else pending:
        detail = {"reexecutionId": rx.public_id, "mode": rx.mode, "requestedBy": rx.requested_by}
        keep(rx.original_run_id, Attention(REEXECUTION_PENDING, rx.created_at, detail))
    return {run_id: next(kinds[k] for k in KINDS if k in kinds) for run_id, kinds in found.items()}


def of_run(run: Run, *, pending: list[ReexecutionRequest] | None = None) -> Attention | None:
    """The run's attention; `pending`: its re-execution requests waiting for an approver, oldest
    first, when the caller has read them (reexecutions.around_run), else read here."""
    return for_runs(run.workspace, [run], pending=pending).get(run.run_id)


def matching(qs: QuerySet[Run], workspace: Workspace, kind: str) -> QuerySet[Run]:
    """`qs` narrowed to runs with attention `kind` (or ANY). A run whose shown kind is another one
    still matches: the filter asks "does this need X", not "is X the first of its needs"."""
    unfinished = ~Q(status__in=RunStatus.finished())
    tests = {
        IN_DOUBT: unfinished & Q(Exists(ToolCall.objects.filter(run=OuterRef("pk"), status="in_doubt"))),
        WAITING_APPROVAL: unfinished
        & Q(Exists(ToolCall.objects.filter(run=OuterRef("pk"), status="waiting_approval"))),
        RETRY_SCHEDULED: unfinished
        & Q(Exists(Step.objects.filter(run=OuterRef("pk"), status="failed", error__has_key="retryAt"))),
        REEXECUTION_PENDING: Q(
            Exists(
                ReexecutionRequest.objects.filter(
                    workspace=workspace,
                    original_run_id=OuterRef("run_id"),
                    status=ReexecutionRequest.Status.PENDING_APPROVAL,
                )
            )
        ),
    }
    if kind == ANY:
        condition = Q()
        for test in tests.values():
            condition |= test
        return qs.filter(condition)
    return qs.filter(tests[kind])


def waiting_for_approvers(workspace: Workspace) -> int:
    """What the Approvals page lists as pending: one card per pending re-execution request (one for
    a whole batch, decided at once) and one per tool call waiting for an approver. The navigation's
    badge, so it counts what the page shows."""
    requests = ReexecutionRequest.objects.filter(workspace=workspace, status=ReexecutionRequest.Status.PENDING_APPROVAL)
    cards = (
        requests.values("workspace_id")
        .annotate(n=Count(Coalesce(NullIf("batch_id", Value("")), "public_id"), distinct=True), kind=Value(_CARDS))
        .values_list("kind", "n")
    )
    # The runs still going first (the partial index run_unfinished), then their waiting calls: as
    # one join, PostgreSQL's guess of how many runs are unfinished (none in its sample) could make
    # it read every run of the workspace instead, on every page (bench/README.md, scale). The runs
    # come with the count of cards, in one statement: a page asks one query, two when runs are going.
    going = (
        Run.objects.filter(workspace=workspace)
        .exclude(status__in=RunStatus.finished())
        .annotate(kind=Value(_GOING))
        .values_list("kind", "pk")
    )
    rows = list(cards.union(going, all=True))
    count = sum(n for kind, n in rows if kind == _CARDS)
    running = [pk for kind, pk in rows if kind == _GOING]
    calls = ToolCall.objects.filter(run_id__in=running, status="waiting_approval").count() if running else 0
    return count + calls


_CARDS, _GOING = 0, 1  # which part of waiting_for_approvers' one statement a row comes from
