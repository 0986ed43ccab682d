"""Usage and cost over time, aggregated in SQL from the usage rollups (ledger/log/rollup.py: the cost
entries, one per answered model call, summed per workspace, day, model and workflow; and those days
summed per month), so a report reads a row per cell and day, or per cell and month for the whole
months of a long range, however many calls the days hold.

A report over a long range comes in coarser periods (`granularity_for`: days up to 92 days, weeks up
to 183, months beyond), as cost explorers do: a year is 12 or 13 months, read from the monthly rollup
(and the days of a month the range only partly covers from the daily one).

Dollars follow docs/design.md §4: a row's cost is NULL only when every call in it is unpriced; a true
0 means no model calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import CharField, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Concat, TruncMonth, TruncWeek

from ..fold.pricing import UsageTotals
from ..models import DailyUsage, MonthlyUsage, Tenant, Workspace

GRANULARITIES = ("day", "week", "month")
GROUPINGS = ("day", "week", "month", "model", "workflow", "workspace")
DAILY_UP_TO = 92  # days: a range this long or shorter is shown by day,
WEEKLY_UP_TO = 183  # this long or shorter by week (Monday to Sunday), longer by calendar month
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
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cached_input_tokens=self.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens,
            cost_usd=self.cost_usd,
            priced_calls=self.priced_calls,
            unpriced_calls=self.unpriced_calls,
        )
        return {"key": self.key, **totals.to_json()}


def granularity_for(start: date, end: date) -> str:
    """The periods a range is shown in unless the reader chooses: days up to DAILY_UP_TO days, weeks
    up to WEEKLY_UP_TO, months beyond (a year: 12 or 13 bars, not 365)."""
    days = (end - start).days + 1
    return "day" if days <= DAILY_UP_TO else "week" if days <= WEEKLY_UP_TO else "month"


def period_of(day: date, granularity: str) -> date:
    """The first day of the period (day, ISO week from Monday, calendar month) that holds `day`."""
    if granularity == "week":
        return day - timedelta(days=day.weekday())
    if granularity == "month":
        return day.replace(day=1)
    return day


def period_end(first: date, granularity: str) -> date:
    """The last day of the period that begins on `first`."""
    if granularity == "week":
        return first + timedelta(days=6)
    if granularity == "month":
        return _next_month(first) - timedelta(days=1)
    return first


def periods(start: date, end: date, granularity: str) -> list[tuple[date, date]]:
    """The periods from `start` to `end` (both inclusive) as (first, last) days, cut to the range."""
    out = []
    first = start
    while first <= end:
        last = min(period_end(period_of(first, granularity), granularity), end)
        out.append((first, last))
        first = last + timedelta(days=1)
    return out


def _next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


def _scoped(qs: QuerySet[Any], workspace: Workspace | None, tenant: Tenant | None) -> QuerySet[Any]:
    if workspace is not None:
        return qs.filter(workspace=workspace)
    assert tenant is not None
    return qs.filter(workspace__tenant=tenant)


def cells(*, workspace: Workspace | None, tenant: Tenant | None, start: date, end: date) -> QuerySet[DailyUsage]:
    """The rollup's cells from `start` to `end` (both inclusive, UTC days), of one workspace or a tenant's."""
    return _scoped(DailyUsage.objects.filter(day__gte=start, day__lte=end), workspace, tenant)


def _whole_months(start: date, end: date) -> tuple[date, date]:
    """The first days of the first whole month in the range and of the month after the last whole
    one (equal when the range holds no whole month)."""
    first = start if start.day == 1 else _next_month(start)
    after = period_of(end + timedelta(days=1), "month")
    return first, max(first, after)


def by_period(
    *,
    start: date,
    end: date,
    granularity: str,
    keys: Sequence[str] = (),
    workspace: Workspace | None = None,
    tenant: Tenant | None = None,
) -> list[dict[str, Any]]:
    """The rollups summed in SQL per period and `keys` (cell fields: provider, model_id,
    workflow_version_id), ordered by period and keys; each row's "period" is the period's first day
    in the range. Days and weeks sum the daily cells; months read the monthly rollup for the whole
    months of the range and sum the daily cells of the months it covers only in part, so a year
    reads at most a row per cell and month plus the days of its first and last month."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}")
    order = ("period", *keys)
    if granularity == "day":
        return list(
            cells(workspace=workspace, tenant=tenant, start=start, end=end)
            .values(*keys, period=F("day"))
            .annotate(**_AGGREGATES)
            .order_by(*order)
        )
    trunc = TruncWeek if granularity == "week" else TruncMonth
    first, after = _whole_months(start, end) if granularity == "month" else (start, start)
    rows: list[dict[str, Any]] = []
    if first < after:
        rows += (
            _scoped(MonthlyUsage.objects.filter(month__gte=first, month__lt=after), workspace, tenant)
            .values(*keys, period=F("month"))
            .annotate(**_AGGREGATES)
            .order_by(*order)
        )
    if start < first or after <= end:  # days outside the whole months (all of them by week)
        days = Q(day__gte=start, day__lte=end) & ~Q(day__gte=first, day__lt=after)
        rows += (
            _scoped(DailyUsage.objects.filter(days), workspace, tenant)
            .values(*keys, period=trunc("day"))
            .annotate(**_AGGREGATES)
            .order_by(*order)
        )
    for row in rows:
        row["period"] = max(row["period"], start)  # a period the range begins inside: from the range's first day
    return sorted(rows, key=lambda row: tuple(row[k] for k in order))


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
    if group_by not in GROUPINGS or group_by in ("week", "month"):
        raise ValueError(f"group_by must be one of {GROUPINGS}")
    return (
        entries.annotate(group_key=_key_expression(group_by))
        .values("group_key")
        .annotate(**_AGGREGATES)
        .order_by("group_key")
    )


def _rows(grouped: Iterable[Mapping[str, Any]], group_by: str) -> list[UsageRow]:
    rows = [_row(r["group_key"], r) for r in grouped]
    if group_by == "workflow":
        # A run without a RunStarted workflow id projects as "": report it as null.
        rows = [r if r.key else replace(r, key=None) for r in rows]
    return rows


def usage_rows(
    *, group_by: str, start: date, end: date, workspace: Workspace | None = None, tenant: Tenant | None = None
) -> tuple[list[UsageRow], UsageRow]:
    """Rows ordered by key, and the total over all of them, for cost entries recorded from `start`
    to `end` (both inclusive, UTC days) in one workspace or across a tenant. By week or month, a row's
    key is its period's first day in the range (ISO date)."""
    if group_by in ("week", "month"):
        periodic = by_period(start=start, end=end, granularity=group_by, workspace=workspace, tenant=tenant)
        return [_row(values["period"].isoformat(), values) for values in periodic], _row(None, _added(periodic))
    entries = cells(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by), group_by)
    return rows, _row(None, entries.aggregate(**_AGGREGATES))


def usage_page(
    *,
    group_by: str,
    start: date,
    end: date,
    offset: int,
    limit: int,
    workspace: Workspace | None = None,
    tenant: Tenant | None = None,
) -> tuple[list[UsageRow], UsageRow, bool]:
    """`usage_rows`, `limit` rows from the `offset`-th (paged in SQL), the total over all rows,
    and whether more rows follow."""
    if group_by in ("week", "month"):  # a few dozen rows at most: paged here
        rows, total = usage_rows(group_by=group_by, start=start, end=end, workspace=workspace, tenant=tenant)
        return rows[offset : offset + limit], total, len(rows) > offset + limit
    entries = cells(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by)[offset : offset + limit + 1], group_by)
    return rows[:limit], _row(None, entries.aggregate(**_AGGREGATES)), len(rows) > limit


@dataclass(frozen=True)
class PeriodModelCost:
    day: date  # the period's first day in the range
    provider: str
    model_id: str
    cost_usd: Decimal | None  # NULL when every call of the cell is unpriced
    calls: int
    priced_calls: int
    last: date | None = None  # the period's last day in the range; None: `day` alone

    @property
    def model(self) -> str:
        return f"{self.provider}/{self.model_id}"


@dataclass(frozen=True)
class Report:
    """What the console's usage report shows: rows by model and by period (day, week or month), their
    total, and the chart's cells (cost per period and model)."""

    granularity: str
    by_model: list[UsageRow]
    by_period: list[UsageRow]  # key: the period's first day in the range (ISO date)
    total: UsageRow
    cells: list[PeriodModelCost]


def report(
    *,
    start: date,
    end: date,
    granularity: str | None = None,
    workspace: Workspace | None = None,
    tenant: Tenant | None = None,
) -> Report:
    """The report from `start` to `end` (inclusive, UTC days) in periods of `granularity` (default:
    `granularity_for` the range) from one read of the rollups summed by period and model (a row per
    period and model, whatever the workflows), the rest summed from that here rather than read again
    once per table."""
    granularity = granularity or granularity_for(start, end)
    grouped = by_period(
        start=start, end=end, granularity=granularity, keys=("provider", "model_id"), workspace=workspace, tenant=tenant
    )
    chart = []
    for values in grouped:
        row = _row(None, values)
        first = values["period"]
        last = min(period_end(period_of(first, granularity), granularity), end)
        chart.append(
            PeriodModelCost(
                day=first,
                provider=values["provider"],
                model_id=values["model_id"],
                cost_usd=row.cost_usd,
                calls=row.priced_calls + row.unpriced_calls,
                priced_calls=row.priced_calls,
                last=None if last == first else last,
            )
        )
    return Report(
        granularity=granularity,
        by_model=_summed(grouped, lambda values: f"{values['provider']}/{values['model_id']}"),
        by_period=_summed(grouped, lambda values: values["period"].isoformat()),
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
