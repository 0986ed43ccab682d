"""An evaluation's spend and the guard that keeps it inside its ceiling (docs/evaluations.md
"Budget").

Spend is what the evaluation's new runs cost (their live model calls, priced like any run's)
plus its model-graded scores' calls. The guard is asked before each live model call of a request
of the evaluation's batch: when the evaluation has spent its ceiling, or the policy's runs of the
day have spent the daily one, the call is refused before the provider is asked (the call is
recorded as failed with `BudgetExhausted`) and the evaluation is marked `budget_exhausted`. A
call that starts under the ceiling completes: the ceiling can be passed by at most one call's
cost per run executing at that moment, never by a call started after.
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


def _runs_cost(workspace_id: int, batch_ids: list[str]) -> Decimal:
    new_runs = ReexecutionRequest.objects.filter(workspace_id=workspace_id, batch_id__in=batch_ids).exclude(
        new_run_id=""
    )
    total = Run.objects.filter(workspace_id=workspace_id, run_id__in=new_runs.values("new_run_id")).aggregate(
        total=Sum("cost_usd")
    )["total"]
    return total or Decimal(0)


def spend(evaluation: Evaluation) -> Decimal:
    return _runs_cost(evaluation.workspace_id, [evaluation.batch_id]) + evaluation.grader_cost_usd


def _day_start(now: datetime) -> datetime:
    return datetime.combine(now.date(), time.min, tzinfo=now.tzinfo)


def day_spend(policy: EvaluationPolicy, now: datetime | None = None) -> Decimal:
    """What the policy's evaluations started this UTC day spent."""
    today = list(
        Evaluation.objects.filter(policy=policy, created_at__gte=_day_start(now or clock.now())).values_list(
            "batch_id", "grader_cost_usd"
        )
    )
    if not today:
        return Decimal(0)
    return _runs_cost(policy.workspace_id, [b for b, _ in today]) + sum((g for _, g in today), Decimal(0))


def exhausted(evaluation: Evaluation) -> str | None:
    """Why no further live call may be made for this evaluation, or None."""
    if evaluation.ceiling_usd is not None and spend(evaluation) >= evaluation.ceiling_usd:
        return f"evaluation {evaluation.public_id} spent its ceiling of {evaluation.ceiling_usd.normalize()} USD"
    policy = evaluation.policy
    if policy is not None and day_spend(policy) >= policy.ceiling_per_day_usd:
        return f"policy {policy.public_id} spent its ceiling of {policy.ceiling_per_day_usd.normalize()} USD for today"
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
