"""The runs list's sorting and nesting: a sort key, keyset pages on it, and the totals of a tree.

A sort is one of SORT_KEYS, descending or ascending, always ending on the row id so a page's last
row is a unique position (the keyset cursor: `(value, id)`, no OFFSET). A run without a value for
the key (unpriced: no cost; still going: no duration) comes last in both directions.

Nested (`nested=True`) the list holds the runs without a parent, and cost and tokens are those of
the run's whole tree: its own plus every run whose `root_run_id` is its id (one correlated
aggregate each over the partial `run_below` index, migration 0034). Flat, every run is a row with its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    DecimalField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import Combinable
from django.db.models.functions import Coalesce

from .. import limits
from ..models import Run

SORT_KEYS = ("started", "duration", "cost", "tokens")
MONEY: DecimalField[Decimal, Decimal] = DecimalField(max_digits=30, decimal_places=12)
WHOLE: BigIntegerField[int, int] = BigIntegerField()


def _below(column: str, output: Any) -> Subquery:
    """The sum of `column` over the runs below a root (its tree less itself), NULL without any."""
    below = (
        Run.objects.filter(workspace=OuterRef("workspace"), root_run_id=OuterRef("run_id"))
        .exclude(root_run_id="")  # always true here; it lets PostgreSQL use the index run_below
        .order_by()
        .values("root_run_id")
    )
    aggregate = Count("pk") if column == "pk" else Sum(column)
    return Subquery(below.annotate(total=aggregate).values("total")[:1], output_field=output)


def with_tree_totals(qs: QuerySet[Run]) -> QuerySet[Run]:
    """Annotate each run with its tree's totals: tree_cost (NULL only when every call in the tree
    is unpriced, docs/design.md §4), tree_input_tokens, tree_output_tokens, tree_priced_calls,
    tree_unpriced_calls and below (how many runs under it, any depth)."""
    zero = Value(0, output_field=WHOLE)
    qs = qs.annotate(
        tree_input_tokens=F("input_tokens") + Coalesce(_below("input_tokens", WHOLE), zero),
        tree_output_tokens=F("output_tokens") + Coalesce(_below("output_tokens", WHOLE), zero),
        tree_priced_calls=F("priced_calls") + Coalesce(_below("priced_calls", WHOLE), zero),
        tree_unpriced_calls=F("unpriced_calls") + Coalesce(_below("unpriced_calls", WHOLE), zero),
        below=Coalesce(_below("pk", WHOLE), zero),
    )
    money_zero = Value(Decimal(0), output_field=MONEY)
    return qs.annotate(
        tree_cost=Case(
            When(Q(tree_priced_calls=0, tree_unpriced_calls__gt=0), then=Value(None, output_field=MONEY)),
            default=ExpressionWrapper(
                Coalesce(F("cost_usd"), money_zero) + Coalesce(_below("cost_usd", MONEY), money_zero),
                output_field=MONEY,
            ),
            output_field=MONEY,
        )
    )


def _key(sort: str, nested: bool) -> Combinable | F:
    if sort == "started":
        return F("created_at")
    if sort == "duration":
        return ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    if sort == "cost":
        return F("tree_cost") if nested else F("cost_usd")
    if sort == "tokens":
        if nested:
            return ExpressionWrapper(F("tree_input_tokens") + F("tree_output_tokens"), output_field=WHOLE)
        return ExpressionWrapper(F("input_tokens") + F("output_tokens"), output_field=WHOLE)
    raise ValueError(f"unknown sort {sort!r}")


@dataclass(frozen=True)
class Sort:
    key: str = "started"
    descending: bool = True
    nested: bool = True

    @property
    def default(self) -> bool:
        return self.key == "started" and self.descending


def sorted_runs(qs: QuerySet[Run], sort: Sort) -> QuerySet[Run]:
    """The runs ordered by the sort (nested: only those without a parent, with tree totals)."""
    if sort.nested:
        qs = with_tree_totals(qs.filter(parent_run_id=""))
    qs = qs.annotate(sort_value=_key(sort.key, sort.nested))
    value = F("sort_value")
    # A start time is never NULL: its order says nothing of NULLs, since DESC NULLS LAST would not
    # be the order of the index run_newest_first and PostgreSQL would sort every run of the
    # workspace for a page (bench/README.md, bench/scale.py "runs list, first page").
    nulls_last = None if sort.key == "started" else True
    if sort.descending:
        return qs.order_by(value.desc(nulls_last=nulls_last), "-pk")
    return qs.order_by(value.asc(nulls_last=nulls_last), "pk")


Position = tuple[datetime | Decimal | int | timedelta | None, int]


def after(qs: QuerySet[Run], sort: Sort, position: Position) -> QuerySet[Run]:
    """The runs of a sorted list strictly after `position` (the last row of the previous page)."""
    value, pk = position
    beyond, tie = ("lt", "lt") if sort.descending else ("gt", "gt")
    if value is None:  # the page ended among the runs without a value: they come last
        return qs.filter(**{"sort_value__isnull": True, f"pk__{tie}": pk})
    if sort.key == "started" and sort.descending:
        # Bounded as well: the range the index (workspace, -created_at) starts at; the OR alone is
        # a filter only, and a deep page would read every newer row first.
        qs = qs.filter(created_at__lte=value)
    return qs.filter(
        Q(**{f"sort_value__{beyond}": value}) | Q(sort_value=value, **{f"pk__{tie}": pk}) | Q(sort_value__isnull=True)
    )


def position_of(run: Run) -> Position:
    return getattr(run, "sort_value", run.created_at), run.pk


def dump_position(sort: Sort, run: Run) -> dict[str, Any]:
    """The position after this row as a cursor's JSON: `{t, id}` for the default order (the form
    links and API cursors had before sorting existed), `{k, v, id}` for the others (`k`: the key,
    `-` before it when descending, as docs/api.md writes a sort, so a cursor serves only its own
    direction; `v`: ISO time, whole microseconds of a duration, the cost as a decimal string, a
    token count; null among the runs without a value)."""
    value, pk = position_of(run)
    if sort.default:
        assert isinstance(value, datetime)
        return {"t": value.isoformat(), "id": pk}
    written: Any = value
    if isinstance(value, datetime):
        written = value.isoformat()
    elif isinstance(value, timedelta):
        written = value // timedelta(microseconds=1)
    elif isinstance(value, Decimal):
        written = str(value)
    return {"k": _signed(sort), "v": written, "id": pk}


def _signed(sort: Sort) -> str:
    return f"-{sort.key}" if sort.descending else sort.key


def load_position(sort: Sort, decoded: Any) -> Position:
    """A cursor's JSON back from a client (theirs to forge: every part is checked) as a position
    of this sort; ValueError (or TypeError, ArithmeticError) when it is not one we gave out."""
    if sort.default:
        return limits.keyset_position(decoded)
    if not isinstance(decoded, dict) or decoded.get("k") != _signed(sort):
        raise ValueError("a cursor of another sort or direction")
    pk, value = limits.row_id(decoded.get("id")), decoded.get("v")
    if value is None:
        return None, pk
    if sort.key == "started":
        return limits.keyset_position({"t": value, "id": pk})
    if sort.key == "cost":
        if not isinstance(value, str) or len(value) > 40:
            raise ValueError("not an amount")
        amount = Decimal(value)
        if not amount.is_finite():
            raise ValueError("not an amount")
        return amount, pk
    whole = limits.row_id(value)  # tokens, or a duration in microseconds: a non-negative bigint
    if sort.key == "duration":
        return timedelta(microseconds=whole), pk
    return whole, pk


def page(qs: QuerySet[Run], sort: Sort, *, limit: int, position: Position | None) -> tuple[list[Run], bool]:
    """One page of a sorted list after `position`; and whether more follow."""
    qs = sorted_runs(qs, sort)
    if position is not None:
        qs = after(qs, sort, position)
    rows = list(qs[: limit + 1])
    return rows[:limit], len(rows) > limit


def family_below(roots: list[Run], *, limit: int) -> list[Run]:
    """Runs below these roots (any depth; direct children recorded before their root was known
    too), oldest first, at most `limit` in all."""
    if not roots:
        return []
    ids = [r.run_id for r in roots]
    workspace_id = roots[0].workspace_id
    return list(
        Run.objects.filter(Q(root_run_id__in=ids) | Q(parent_run_id__in=ids), workspace_id=workspace_id)
        .exclude(parent_run_id="")
        .order_by("created_at", "pk")[:limit]
    )
