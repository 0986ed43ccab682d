"""An evaluation's spend and the guard that keeps it inside its ceiling (docs/evaluations.md
"Budget").

Spend is what the evaluation's new runs cost (their live model calls, priced like any run's)
plus its scorers' paid calls (`model_graded`'s, and a registered scorer's through the provider
registry). `exhausted` is asked before each of those paid calls: by the guard before each live
model call of a request of the evaluation's batch, and by the scoring before each scorer's call
(evaluations._spending). When the evaluation has spent its ceiling, or
the policy's evaluations of the day have spent the daily one, the call is refused before the
provider is asked (a run's call is recorded as failed with `BudgetExhausted`, a grader's fails its
score) and the evaluation is marked `budget_exhausted`. A call that starts under the ceiling
completes: the ceiling can be passed by at most one call's cost per run executing (or grader
asked) at that moment, never by a call started after.

A ceiling is kept only over calls whose cost is known. Once one of the evaluation's new runs or
one of its scorers made a call that is unpriced (its model has no price, the provider reported no
usage, or the provider failed after the request left: scorers.py "Paid calls", a run's fold), the
spend is unknown, so the guard refuses the next live call (and the scorer the next
grader call) as it does past the ceiling, and says why; the same for the policy's daily ceiling.
A price for the model (Settings, Prices) is the way on. Why it stopped is kept on the evaluation
(`budget_reason`, a `Stop`'s JSON), the first time it does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, time
from decimal import Decimal
from typing import Any, NamedTuple

from django.db.models import OuterRef, Subquery, Sum

from .. import clock
from ..models import Evaluation, EvaluationPolicy, ReexecutionRequest, Run
from .errors import BudgetExhausted


def _runs_cost(workspace_id: int, batch_ids: list[str]) -> tuple[Decimal, int]:
    """What the batches' new runs cost, and how many of their calls have no known cost."""
    new_runs = ReexecutionRequest.objects.filter(workspace_id=workspace_id, batch_id__in=batch_ids).exclude(
        new_run_id=""
    )
    sums = Run.objects.filter(workspace_id=workspace_id, run_id__in=new_runs.values("new_run_id")).aggregate(
        total=Sum("cost_usd"), unpriced=Sum("unpriced_calls")
    )
    return sums["total"] or Decimal(0), sums["unpriced"] or 0


def spend(evaluation: Evaluation) -> Decimal:
    """What the evaluation spent, as far as it is known: a lower bound while `unpriced_calls` is
    above 0 (those calls add nothing to it)."""
    return _runs_cost(evaluation.workspace_id, [evaluation.batch_id])[0] + evaluation.grader_cost_usd


def unpriced_calls(evaluation: Evaluation) -> int:
    """The evaluation's calls whose cost is unknown (no price, no usage reported, or a failure after
    the request left): its new runs' and its scorers'."""
    return _runs_cost(evaluation.workspace_id, [evaluation.batch_id])[1] + evaluation.grader_unpriced_calls


def unpriced_calls_of(workspace_id: int, rows: Sequence[Evaluation]) -> dict[int, int]:
    """`unpriced_calls` of each of a workspace's evaluations (by pk), in one query for them all
    (a page of the list)."""
    batches = {e.batch_id for e in rows}
    runs_unpriced = Subquery(
        Run.objects.filter(workspace_id=OuterRef("workspace_id"), run_id=OuterRef("new_run_id")).values(
            "unpriced_calls"
        )[:1]
    )
    by_batch = dict(
        ReexecutionRequest.objects.filter(workspace_id=workspace_id, batch_id__in=batches)
        .exclude(new_run_id="")
        .values("batch_id")
        .annotate(unpriced=Sum(runs_unpriced))
        .values_list("batch_id", "unpriced")
        if batches
        else ()
    )
    return {e.pk: (by_batch.get(e.batch_id) or 0) + e.grader_unpriced_calls for e in rows}


def _day_start(now: datetime) -> datetime:
    return datetime.combine(now.date(), time.min, tzinfo=now.tzinfo)


def day_spend(policy: EvaluationPolicy, now: datetime | None = None) -> Decimal:
    """What the policy's evaluations started this UTC day spent."""
    return _day(policy, now)[0]


class _Unknown(NamedTuple):
    """Calls of unknown cost: of the new runs, and of the graders."""

    runs: int
    graders: int


def _day(
    policy: EvaluationPolicy, now: datetime | None = None, current: Evaluation | None = None
) -> tuple[Decimal, _Unknown]:
    """What the policy's evaluations started this UTC day spent, and their calls of unknown cost;
    `current`'s grader spend as it is in memory (its scoring adds to it before saving the row)."""
    rows = Evaluation.objects.filter(policy=policy, created_at__gte=_day_start(now or clock.now()))
    today = [
        (batch, current.grader_cost_usd, current.grader_unpriced_calls)
        if current is not None and pk == current.pk
        else (batch, cost, unpriced)
        for pk, batch, cost, unpriced in rows.values_list("pk", "batch_id", "grader_cost_usd", "grader_unpriced_calls")
    ]
    if not today:
        return Decimal(0), _Unknown(0, 0)
    runs, unpriced = _runs_cost(policy.workspace_id, [b for b, _, _ in today])
    graders = sum((g for _, g, _ in today), Decimal(0))
    return runs + graders, _Unknown(unpriced, sum(u for _, _, u in today))


def day_spent(policy: EvaluationPolicy) -> bool:
    """The policy's daily ceiling is spent, or cannot be kept (a call of unknown cost today)."""
    spent, unknown = _day(policy)
    return any(unknown) or spent >= policy.ceiling_per_day_usd


def usd_text(usd: Decimal) -> str:
    """Dollars as the API and the messages write them: 1000 and 0.25, not 1E+3 (what `normalize()`
    alone writes) nor 0.250000000000 (the column's places)."""
    return f"{usd.normalize():f}"


def _unknown(unknown: _Unknown) -> str:
    parts = []
    if unknown.runs:
        parts.append("a model call of its runs" if unknown.runs == 1 else f"{unknown.runs} model calls of its runs")
    if unknown.graders:
        parts.append("a grader call" if unknown.graders == 1 else f"{unknown.graders} grader calls")
    verb = "has" if sum(unknown) == 1 else "have"
    why = "no price for the model, no usage reported, or a failure after the request left"
    return f"{' and '.join(parts)} {verb} no known cost ({why})"


# Why a ceiling stopped an evaluation (docs/api.md "Evaluations", `budgetReason.code`): its own
# ceiling was spent or cannot be kept (a call of unknown cost), or its policy's daily one.
STOP_CODES = ("ceiling_reached", "cost_unknown", "day_ceiling_reached", "day_cost_unknown")


class Stop(NamedTuple):
    """Why no further paid call may be made for an evaluation: one of STOP_CODES and a message."""

    code: str
    message: str

    def as_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def exhausted(evaluation: Evaluation) -> Stop | None:
    """Why no further paid call (a live call of its runs, or a grader's) may be made for this
    evaluation, or None. Reads the grader's spend from `evaluation` as it is in memory: the
    scoring that is adding to it asks between its calls."""
    if evaluation.ceiling_usd is not None:
        ceiling = usd_text(evaluation.ceiling_usd)
        runs, unpriced = _runs_cost(evaluation.workspace_id, [evaluation.batch_id])
        unknown = _Unknown(unpriced, evaluation.grader_unpriced_calls)
        if any(unknown):
            return Stop(
                "cost_unknown",
                f"evaluation {evaluation.public_id} cannot keep its ceiling of {ceiling} USD: {_unknown(unknown)}",
            )
        if runs + evaluation.grader_cost_usd >= evaluation.ceiling_usd:
            return Stop("ceiling_reached", f"evaluation {evaluation.public_id} spent its ceiling of {ceiling} USD")
    policy = evaluation.policy
    if policy is not None:
        spent, unknown = _day(policy, current=evaluation)
        ceiling = usd_text(policy.ceiling_per_day_usd)
        if any(unknown):
            return Stop(
                "day_cost_unknown",
                f"policy {policy.public_id} cannot keep its ceiling of {ceiling} USD for today: {_unknown(unknown)}",
            )
        if spent >= policy.ceiling_per_day_usd:
            return Stop(
                "day_ceiling_reached", f"policy {policy.public_id} spent its ceiling of {ceiling} USD for today"
            )
    return None


def mark_exhausted(evaluation_pk: int, stop: Stop) -> None:
    """Record on the evaluation's row that the ceiling stopped it, and why (the first reason
    stays: it is what stopped it; what follows from it says the same or less)."""
    rows = Evaluation.objects.filter(pk=evaluation_pk)
    rows.update(budget_exhausted=True)
    rows.filter(budget_reason__isnull=True).update(budget_reason=stop.as_json())


def guard_for(request: Any) -> Callable[[Any], None] | None:
    """The guard of a request of an evaluation's batch (executor.register_guard_factory)."""
    if not getattr(request, "batch_id", ""):
        return None
    evaluation = (
        Evaluation.objects.filter(workspace_id=request.workspace_id, batch_id=request.batch_id)
        .select_related("policy")
        .first()
    )
    if evaluation is None or (evaluation.ceiling_usd is None and evaluation.policy is None):
        return None  # approved by a person: no ceiling to keep
    pk = evaluation.pk

    def guard(model_request: Any) -> None:
        current = Evaluation.objects.select_related("policy").get(pk=pk)
        stop = exhausted(current)
        if stop is not None:
            mark_exhausted(pk, stop)
            raise BudgetExhausted(f"budget_exhausted: {stop.message}; no live call is made past it")

    return guard
