"""The daily usage rollup (models.DailyUsage): cost entries summed per workspace, UTC day, model and
workflow, so the usage report reads at most a row per cell and day instead of every model call; a
year's report costs the same at ten thousand events as at ten million (bench/scale.py).

It is written three ways, all inside the caller's transaction:
- in the append transaction: a batch's new cost entries (`cells`) added to their cells with one
  upsert (`add`, or inside the append's one statement on PostgreSQL: `upsert_sql`), the cells in
  key order (two appends that share cells lock them in the same order);
- `recount`: the cells of some days counted again from the cost entries, for what rewrites
  cost entries (`ledger rebuild` and `ledger reprice`);
- `subtract`: the cost entries of runs about to be deleted (`ledger prune`) taken out of their
  cells, a cell left with no calls deleted: exact under concurrent appends, unlike a recount;
- and `differences` compares the cells with a fresh count, for `ledger verify`.

The monthly rollup (models.MonthlyUsage: the daily cells summed per calendar month, what a long
usage report reads) is kept from the daily cells by database triggers (migration 0018), so each of
these writes keeps it in the same statement; `recount` also counts the months of its days again from
the daily cells, and `differences` compares every month with the sum of its days.

A recount is exact when no append to the same workspace and day commits while it runs (the
maintenance commands); `ledger verify` would show such a race and `ledger rebuild` mend it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import TruncDate, TruncMonth

from ..models import CostEntry, DailyUsage, MonthlyUsage
from .bulk import table

Cell = tuple[date, str, str, str]  # day, provider, model_id, workflow_version_id
KEY = ("day", "provider", "model_id", "workflow_version_id")
TOKENS = ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
SUMS = (*TOKENS, "cost_usd", "calls", "priced_calls")
COLUMNS = ("workspace_id", *KEY, *SUMS)
# SQLite keeps decimals as floats: compare money at a precision both databases keep.
COMPARE_PLACES = Decimal("1e-9")


def utc_day(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def _sums(entries: Iterable[Mapping[str, Any]], workflow_version_id: str) -> dict[Cell, list[Any]]:
    cells: dict[Cell, list[Any]] = {}
    days: dict[datetime, date] = {}  # a batch's entries share one recorded_at: its day worked out once
    for entry in entries:
        moment = entry["recorded_at"]
        day = days.get(moment)
        if day is None:
            day = days[moment] = utc_day(moment)
        cell = (day, entry["provider"], entry["model_id"], workflow_version_id)
        sums = cells.get(cell)
        if sums is None:
            sums = cells[cell] = [0, 0, 0, 0, Decimal(0), 0, 0]
        # SUMS' order, written out: a loop over TOKENS cost as much as the rest of an entry.
        sums[0] += entry["input_tokens"]
        sums[1] += entry["output_tokens"]
        sums[2] += entry["cached_input_tokens"]
        sums[3] += entry["reasoning_tokens"]
        sums[5] += 1
        cost = entry["cost_usd"]
        if cost is not None:
            sums[4] += cost
            sums[6] += 1
    return cells


def cells(workspace_id: int, workflow_version_id: str, entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rollup rows that new cost entries (rows of `projection.cost_fields`) of one run add to
    their cells, in key order (COLUMNS: what `add` and `upsert_sql` take)."""
    sums = _sums(entries, workflow_version_id)
    return [
        {"workspace_id": workspace_id, **dict(zip(KEY, cell)), **dict(zip(SUMS, sums[cell]))} for cell in sorted(sums)
    ]


def upsert_sql(source: str, *, one_row: bool = False) -> str:
    """INSERT of the rows of `source` (a FROM list whose columns include COLUMNS), each added to its
    cell; in key order, so that two transactions lock the cells they share in the same order (a
    `one_row` source needs no sort). The appends on PostgreSQL put it in their one statement
    (ledger/log/statements.py)."""
    order = "" if one_row else f"ORDER BY {', '.join(KEY)} "
    return (
        f"INSERT INTO {table(DailyUsage)} ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} FROM {source} "
        f"{order}{_added_to_cell()}"
    )


def add(rows: Sequence[Mapping[str, Any]]) -> None:
    """Add `rows` (`cells`, in key order) to the rollup, in the caller's transaction."""
    if not rows:
        return
    values = ", ".join(["(" + ", ".join(["%s"] * len(COLUMNS)) + ")"] * len(rows))
    params = [row[c].isoformat() if c == "day" else row[c] for row in rows for c in COLUMNS]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table(DailyUsage)} ({', '.join(COLUMNS)}) VALUES {values} {_added_to_cell()}", params
        )


def subtract(rows: Sequence[Mapping[str, Any]]) -> dict[int, set[date]]:
    """Take `rows` (`cells` of cost entries about to be deleted) out of the rollup, in the caller's
    transaction; a cell whose calls drop to none goes (a fresh count would not have it). A cell that
    holds less than is taken out (a rollup already wrong) is left alone: its days come back
    (workspace id -> days) for the caller to `recount` once the cost entries are gone."""
    merged: dict[tuple[Any, ...], list[Any]] = {}
    for row in rows:
        key = (row["workspace_id"], *(row[k] for k in KEY))
        sums = merged.setdefault(key, [0] * len(SUMS))
        for i, name in enumerate(SUMS):
            sums[i] += row[name]
    name = table(DailyUsage)
    where = " AND ".join(f"{c} = %s" for c in ("workspace_id", *KEY))
    sets = ", ".join(f"{c} = {c} - %s" for c in SUMS)
    wrong: dict[int, set[date]] = {}
    with connection.cursor() as cursor:
        for key in sorted(merged):  # key order, as the appends lock cells
            sums = merged[key]
            where_params = [key[0], key[1].isoformat(), *key[2:]]
            cursor.execute(
                f"UPDATE {name} SET {sets} WHERE {where} AND calls >= %s AND priced_calls >= %s",
                [*sums, *where_params, sums[SUMS.index("calls")], sums[SUMS.index("priced_calls")]],
            )
            if cursor.rowcount != 1:
                wrong.setdefault(key[0], set()).add(key[1])
                continue
            cursor.execute(f"DELETE FROM {name} WHERE {where} AND calls = 0", where_params)
    return wrong


def _added_to_cell() -> str:
    name = table(DailyUsage)
    return f"ON CONFLICT ({', '.join(('workspace_id', *KEY))}) DO UPDATE SET " + ", ".join(
        f"{c} = {name}.{c} + EXCLUDED.{c}" for c in SUMS
    )


def days_of(run_pks: Iterable[int]) -> dict[int, set[date]]:
    """workspace id -> the days on which these runs have cost entries: what to recount once they change."""
    days: dict[int, set[date]] = {}
    for workspace_id, recorded_at in CostEntry.objects.filter(run_id__in=list(run_pks)).values_list(
        "run__workspace_id", "recorded_at"
    ):
        days.setdefault(workspace_id, set()).add(utc_day(recorded_at))
    return days


def recount(workspace_id: int, days: Iterable[date]) -> None:
    """Count the cells of `days` in the workspace again from its cost entries."""
    wanted = set(days)
    if not wanted:
        return
    DailyUsage.objects.filter(workspace_id=workspace_id, day__in=wanted).delete()
    DailyUsage.objects.bulk_create(
        [
            DailyUsage(workspace_id=workspace_id, **dict(zip(KEY, cell)), **dict(zip(SUMS, sums)))
            for cell, sums in sorted(counted(workspace_id, wanted).items())
        ]
    )
    recount_months(workspace_id, {day.replace(day=1) for day in wanted})


def recount_months(workspace_id: int, months: Iterable[date]) -> None:
    """Count the monthly cells of `months` (their first days) in the workspace again from its daily
    cells (the triggers keep them; this mends a month that was wrong before)."""
    firsts = set(months)
    if not firsts:
        return
    MonthlyUsage.objects.filter(workspace_id=workspace_id, month__in=firsts).delete()
    MonthlyUsage.objects.bulk_create(
        [
            MonthlyUsage(workspace_id=workspace_id, **dict(zip(MONTH_KEY, cell)), **dict(zip(SUMS, sums)))
            for cell, sums in sorted(summed_months(workspace_id, firsts).items())
        ]
    )


MONTH_KEY = ("month", "provider", "model_id", "workflow_version_id")


def summed_months(workspace_id: int, months: set[date] | None = None) -> dict[Cell, tuple[Any, ...]]:
    """The monthly cells of `months` (None: every month) as the workspace's daily cells sum up now."""
    days = DailyUsage.objects.filter(workspace_id=workspace_id)
    if months is not None:
        last = max(months)
        days = days.filter(day__gte=min(months), day__lt=(last.replace(day=28) + timedelta(days=4)).replace(day=1))
    rows = (
        days.annotate(month=TruncMonth("day"))
        .values("month", "provider", "model_id", "workflow_version_id")
        .annotate(**{name: Sum(name) for name in SUMS})
        .order_by()
    )
    return {
        tuple(r[k] for k in MONTH_KEY): tuple(r[s] for s in SUMS)
        for r in rows
        if months is None or r["month"] in months
    }


def counted(workspace_id: int, days: set[date] | None = None) -> dict[Cell, tuple[Any, ...]]:
    """The cells of `days` (None: every day) as the cost entries of the workspace sum up now."""
    entries = CostEntry.objects.filter(run__workspace_id=workspace_id)
    if days is not None:
        entries = entries.filter(
            recorded_at__gte=datetime.combine(min(days), time.min, tzinfo=UTC),
            recorded_at__lt=datetime.combine(max(days) + timedelta(days=1), time.min, tzinfo=UTC),
        )
    rows = (
        entries.annotate(day=TruncDate("recorded_at", tzinfo=UTC))
        .values("day", "provider", "model_id", workflow=F("run__workflow_version_id"))
        .annotate(
            **{name: Sum(name) for name in TOKENS},
            cost=Sum("cost_usd"),
            calls=Count("pk"),
            priced=Count("pk", filter=Q(cost_usd__isnull=False)),
        )
    )
    return {
        (r["day"], r["provider"], r["model_id"], r["workflow"]): (
            *(r[name] for name in TOKENS),
            Decimal(r["cost"] or 0),
            r["calls"],
            r["priced"],
        )
        for r in rows
        if days is None or r["day"] in days
    }


def differences(workspace_id: int, days: set[date] | None = None) -> list[str]:
    """Where the stored cells of `days` (None: every day) differ from a fresh count of the workspace's
    cost entries (empty when equal); both read in one snapshot, so an append meanwhile cannot make
    them differ; and the monthly cells of their months (None: every month) against the sums of the
    daily cells. `ledger verify` checks every day and month of every workspace."""
    if days is not None and not days:
        return []
    with _snapshot():
        cells = DailyUsage.objects.filter(workspace_id=workspace_id)
        if days is not None:
            cells = cells.filter(day__in=days)
        stored = {tuple(r[k] for k in KEY): tuple(r[s] for s in SUMS) for r in cells.values(*KEY, *SUMS)}
        expected = counted(workspace_id, days)
        months = None if days is None else {day.replace(day=1) for day in days}
        monthly = MonthlyUsage.objects.filter(workspace_id=workspace_id)
        if months is not None:
            monthly = monthly.filter(month__in=months)
        stored_months = {
            tuple(r[k] for k in MONTH_KEY): tuple(r[s] for s in SUMS) for r in monthly.values(*MONTH_KEY, *SUMS)
        }
        # The months as the daily cells now stored sum up (the daily cells are checked just above).
        expected_months = summed_months(workspace_id, months)
    problems = []
    for cell in sorted(set(stored) | set(expected)):
        have, want = stored.get(cell), expected.get(cell)
        if have is None or want is None or _comparable(have) != _comparable(want):
            problems.append(
                f"{cell[0]} {cell[1]}/{cell[2]} {cell[3] or '(no workflow)'}: the rollup has "
                f"{_describe(have)}, the cost entries say {_describe(want)}"
            )
    for cell in sorted(set(stored_months) | set(expected_months)):
        have, want = stored_months.get(cell), expected_months.get(cell)
        if have is None or want is None or _comparable(have) != _comparable(want):
            problems.append(
                f"month {cell[0]:%Y-%m} {cell[1]}/{cell[2]} {cell[3] or '(no workflow)'}: the monthly "
                f"rollup has {_describe(have)}, its days sum to {_describe(want)}"
            )
    return problems


def _comparable(sums: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(Decimal(v).quantize(COMPARE_PLACES) if name == "cost_usd" else v for name, v in zip(SUMS, sums))


def _describe(sums: tuple[Any, ...] | None) -> str:
    if sums is None:
        return "no row"
    return ", ".join(f"{name}={value}" for name, value in zip(SUMS, sums))


@contextmanager
def _snapshot() -> Iterator[None]:
    """A transaction whose reads see one snapshot (PostgreSQL's default, READ COMMITTED, takes one
    per statement); inside a caller's transaction, that transaction as it is."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield
