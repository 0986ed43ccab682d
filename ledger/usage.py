"""Usage and cost over time, aggregated in SQL from the cost entries (one per answered model call).

Dollars follow DESIGN.md §4: a row's cost is NULL only when every call in it is unpriced; a true
0 means no model calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

from django.db.models import CharField, Count, F, Q, QuerySet, Sum, Value
from django.db.models.functions import Concat, TruncDate

from .models import CostEntry, Tenant, Workspace
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


def _entries(*, workspace: Workspace | None, tenant: Tenant | None, start: date, end: date) -> QuerySet[CostEntry]:
    # `end` is inclusive: the whole of its UTC day counts.
    since = datetime.combine(start, time.min, tzinfo=timezone.utc)
    until = datetime.combine(end + timedelta(days=1), time.min, tzinfo=timezone.utc)
    qs = CostEntry.objects.filter(recorded_at__gte=since, recorded_at__lt=until)
    if workspace is not None:
        return qs.filter(run__workspace=workspace)
    assert tenant is not None
    return qs.filter(run__workspace__tenant=tenant)


_AGGREGATES = {
    **{name: Sum(name) for name in _TOKENS},
    "cost": Sum("cost_usd"),
    "calls": Count("pk"),
    "priced": Count("pk", filter=Q(cost_usd__isnull=False)),
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
        return TruncDate("recorded_at", tzinfo=timezone.utc)
    if group_by == "model":
        return Concat(F("provider"), Value("/"), F("model_id"), output_field=CharField())
    if group_by == "workflow":
        return F("run__workflow_version_id")
    return Concat(F("run__workspace__tenant__slug"), Value("/"), F("run__workspace__slug"), output_field=CharField())


def _grouped(entries: QuerySet[CostEntry], group_by: str) -> QuerySet[Any]:
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
    entries = _entries(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by), group_by)
    return rows, _row(None, entries.aggregate(**_AGGREGATES))


def usage_page(*, group_by: str, start: date, end: date, offset: int, limit: int,
               workspace: Workspace | None = None, tenant: Tenant | None = None,
               ) -> tuple[list[UsageRow], UsageRow, bool]:
    """`usage_rows`, `limit` rows from the `offset`-th (paged in SQL), the total over all rows,
    and whether more rows follow."""
    entries = _entries(workspace=workspace, tenant=tenant, start=start, end=end)
    rows = _rows(_grouped(entries, group_by)[offset:offset + limit + 1], group_by)
    return rows[:limit], _row(None, entries.aggregate(**_AGGREGATES)), len(rows) > limit
