"""Usage and cost over time, aggregated in SQL from the daily usage rollup (ledger/rollup.py: the
cost entries, one per answered model call, summed per workspace, day, model and workflow), so a
report reads a row per cell and day, however many calls the days hold.

Dollars follow DESIGN.md §4: a row's cost is NULL only when every call in it is unpriced; a true
0 means no model calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date
from decimal import Decimal
from typing import Any

from django.db.models import CharField, F, QuerySet, Sum, Value
from django.db.models.functions import Concat

from .models import DailyUsage, Tenant, Workspace
from .pricing import UsageTotals

GROUPINGS = ("day", "model", "workflow", "workspace")
_TOKENS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")


@dataclass(frozen=True)
class UsageRow:
    key: str | None
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    reasoning_tokens: int
    cost_usd: Decimal | None
    priced_calls: int
    unpriced_calls: int

    def to_json(self) -> dict[str, Any]:
        totals = UsageTotals(
            input_tokens=self.input_tokens, output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens, reasoning_tokens=self.reasoning_tokens,
            cost_usd=self.cost_usd, priced_calls=self.priced_calls, unpriced_calls=self.unpriced_calls,
        )
        return {"key": self.key, **totals.to_json()}


def cells(*, workspace: Workspace | None, tenant: Tenant | None, start: date, end: date) -> QuerySet[DailyUsage]:
    """The rollup's cells from `start` to `end` (both inclusive, UTC days), of one workspace or a tenant's."""
    qs = DailyUsage.objects.filter(day__gte=start, day__lte=end)
    if workspace is not None:
        return qs.filter(workspace=workspace)
    assert tenant is not None
    return qs.filter(workspace__tenant=tenant)


_AGGREGATES = {
    **{name: Sum(name) for name in _TOKENS},
    "cost": Sum("cost_usd"),
    "calls": Sum("calls"),
    "priced": Sum("priced_calls"),
}


def _row(key: Any, values: Mapping[str, Any]) -> UsageRow:
    calls, priced = values["calls"] or 0, values["priced"] or 0
    cost = values["cost"]
    if priced == 0:
        cost = None if calls else Decimal(0)
    return UsageRow(
        key=None if key is None else str(key),
        **{name: values[name] or 0 for name in _TOKENS},
        cost_usd=None if cost is None else Decimal(cost),
        priced_calls=priced,
        unpriced_calls=calls - priced,
    )


def _key_expression(group_by: str) -> Any:
    if group_by == "day":
        return F("day")
    if group_by == "model":
        return Concat(F("provider"), Value("/"), F("model_id"), output_field=CharField())
    if group_by == "workflow":
        return F("workflow_version_id")
    return Concat(F("workspace__tenant__slug"), Value("/"), F("workspace__slug"), output_field=CharField())


def _grouped(entries: QuerySet[DailyUsage], group_by: str) -> QuerySet[Any]:
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {GROUPINGS}")
    return (entries.annotate(group_key=_key_expression(group_by)).values("group_key")
            .annotate(**_AGGREGATES).order_by("group_key"))


def _rows(grouped: Iterable[Mapping[str, Any]], group_by: str) -> list[UsageRow]:
    rows = [_row(r["group_key"], r) for r in grouped]
    if group_by == "workflow":
        # A run without a RunStarted workflow id projects as "": report it as null.
        rows = [r if r.key else replace(r, key=None) for r in rows]
    return rows


def usage_rows(*, group_by: str, start: date, end: date, workspace: Workspace | None = None,
               tenant: Tenant | None = None) -> tuple[list[UsageRow], UsageRow]:
    """Rows ordered by key, and the total over all of them, for cost entries recorded from `start`
    to `end` (both inclusive, UTC days) in one workspace or across a tenant."""
    entries = cells(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by), group_by)
    return rows, _row(None, entries.aggregate(**_AGGREGATES))


def usage_page(*, group_by: str, start: date, end: date, offset: int, limit: int,
               workspace: Workspace | None = None, tenant: Tenant | None = None,
               ) -> tuple[list[UsageRow], UsageRow, bool]:
    """`usage_rows`, `limit` rows from the `offset`-th (paged in SQL), the total over all rows,
    and whether more rows follow."""
    entries = cells(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by)[offset:offset + limit + 1], group_by)
    return rows[:limit], _row(None, entries.aggregate(**_AGGREGATES)), len(rows) > limit


@dataclass(frozen=True)
class DailyModelCost:
    day: date
    provider: str
    model_id: str
    cost_usd: Decimal | None  # NULL when every call of the cell is unpriced
    calls: int
    priced_calls: int

    @property
    def model(self) -> str:
        return f"{self.provider}/{self.model_id}"


@dataclass(frozen=True)
class Report:
    """What the console's usage report shows: rows by model and by day, their total, and the
    chart's cells (cost per day and model)."""

    by_model: list[UsageRow]
    by_day: list[UsageRow]
    total: UsageRow
    cells: list[DailyModelCost]


def report(*, start: date, end: date, workspace: Workspace | None = None, tenant: Tenant | None = None) -> Report:
    """The report from `start` to `end` (inclusive, UTC days) from one read: the rollup summed by day
    and model (a row per day and model, whatever the workflows), the rest summed from that here
    rather than read again once per table."""
    grouped = list(cells(workspace=workspace, tenant=tenant, start=start, end=end)
                   .values("day", "provider", "model_id").annotate(**_AGGREGATES).order_by("day", "provider", "model_id"))
    chart = []
    for values in grouped:
        row = _row(None, values)
        chart.append(DailyModelCost(day=values["day"], provider=values["provider"], model_id=values["model_id"],
                                    cost_usd=row.cost_usd, calls=row.priced_calls + row.unpriced_calls,
                                    priced_calls=row.priced_calls))
    return Report(
        by_model=_summed(grouped, lambda values: f"{values['provider']}/{values['model_id']}"),
        by_day=_summed(grouped, lambda values: values["day"].isoformat()),
        total=_row(None, _added(grouped)),
        cells=chart,
    )


def _summed(grouped: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]) -> list[UsageRow]:
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for values in grouped:
        by_key.setdefault(key(values), []).append(values)
    return [_row(k, _added(by_key[k])) for k in sorted(by_key)]


def _added(grouped: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = dict.fromkeys(_AGGREGATES, 0)
    for values in grouped:
        for name in _AGGREGATES:
            total[name] += values[name] or 0
    return total
