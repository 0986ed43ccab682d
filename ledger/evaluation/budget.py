"""An evaluation's spend and the guard that keeps it inside its ceiling (docs/evaluations.md
"Budget").

Spend is what the evaluation's new runs cost (their live model calls, priced like any run's)
plus its model-graded scores' calls. The guard is asked before each live model call of a request
of the evaluation's batch: when the evaluation has spent its ceiling, or the policy's runs of the
day have spent the daily one, the call is refused before the provider is asked (the call is
recorded as failed with `BudgetExhausted`) and the evaluation is marked `budget_exhausted`. A
call that starts under the ceiling completes: the ceiling can be passed by at most one call's
cost per run executing at that moment, never by a call started after.

A ceiling is kept only over calls whose cost is known. Once one of the evaluation's new runs made
a call that is unpriced (its model has no price, or the provider reported no usage), the spend is
unknown, so the guard refuses the next live call as it does past the ceiling, and says why; the
same for the policy's daily ceiling. A price for the model (Settings, Prices) is the way on.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, time
from decimal import Decimal
from typing import Any

from django.db.models import Sum

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
    return _runs_cost(evaluation.workspace_id, [evaluation.batch_id])[0] + evaluation.grader_cost_usd


def unpriced_calls(evaluation: Evaluation) -> int:
    """The evaluation's new runs' calls whose cost is unknown (no price, or no usage reported)."""
    return _runs_cost(evaluation.workspace_id, [evaluation.batch_id])[1]


def _day_start(now: datetime) -> datetime:
    return datetime.combine(now.date(), time.min, tzinfo=now.tzinfo)


def day_spend(policy: EvaluationPolicy, now: datetime | None = None) -> Decimal:
    """What the policy's evaluations started this UTC day spent."""
    return _day(policy, now)[0]


def _day(policy: EvaluationPolicy, now: datetime | None = None) -> tuple[Decimal, int]:
    """What the policy's evaluations started this UTC day spent, and their calls of unknown cost."""
    today = list(
        Evaluation.objects.filter(policy=policy, created_at__gte=_day_start(now or clock.now())).values_list(
            "batch_id", "grader_cost_usd"
        )
    )
    if not today:
        return Decimal(0), 0
    runs, unpriced = _runs_cost(policy.workspace_id, [b for b, _ in today])
    return runs + sum((g for _, g in today), Decimal(0)), unpriced


def day_spent(policy: EvaluationPolicy) -> bool:
    """The policy's daily ceiling is spent, or cannot be kept (a call of unknown cost today)."""
    spent, unpriced = _day(policy)
    return unpriced > 0 or spent >= policy.ceiling_per_day_usd


def usd_text(usd: Decimal) -> str:
    """Dollars as the API and the messages write them: 1000 and 0.25, not 1E+3 (what `normalize()`
    alone writes) nor 0.250000000000 (the column's places)."""
    return f"{usd.normalize():f}"


def _unknown(unpriced: int) -> str:
    calls = "a model call of its runs has" if unpriced == 1 else f"{unpriced} model calls of its runs have"
    return f"{calls} no known cost (no price for the model, or no usage reported)"


def exhausted(evaluation: Evaluation) -> str | None:
    """Why no further live call may be made for this evaluation, or None."""
    if evaluation.ceiling_usd is not None:
        ceiling = usd_text(evaluation.ceiling_usd)
        runs, unpriced = _runs_cost(evaluation.workspace_id, [evaluation.batch_id])
        if unpriced:
            return f"evaluation {evaluation.public_id} cannot keep its ceiling of {ceiling} USD: {_unknown(unpriced)}"
        if runs + evaluation.grader_cost_usd >= evaluation.ceiling_usd:
            return f"evaluation {evaluation.public_id} spent its ceiling of {ceiling} USD"
    policy = evaluation.policy
    if policy is not None:
        spent, unpriced = _day(policy)
        ceiling = usd_text(policy.ceiling_per_day_usd)
        if unpriced:
            return f"policy {policy.public_id} cannot keep its ceiling of {ceiling} USD for today: {_unknown(unpriced)}"
        if spent >= policy.ceiling_per_day_usd:
            return f"policy {policy.public_id} spent its ceiling of {ceiling} USD for today"
    return None


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
        why = exhausted(current)
        if why is not None:
            Evaluation.objects.filter(pk=pk).update(budget_exhausted=True)
            raise BudgetExhausted(f"budget_exhausted: {why}; no live call is made past it")

    return guard
