"""A run's cost projections brought to the price table in force: its cost entries, the usage
totals of the run and of the steps that own them, and the daily (and through the triggers the
monthly) usage cells they count in, rewritten from a fold of the whole log with that table.

Two callers (docs/operations.md § Prices):

- the append that folds a run afresh (a miss of the state cache, ledger/log/states.py) and finds
  cost entries that name another table (`align`): the fold it has just paid for prices with the
  table in force, and the batch's rows are written from that fold, so the rows it would leave
  beside them (older entries, totals) are rewritten first, in the same transaction, under the
  run's head lock. Without this the run's totals would sum new prices over entries that keep old
  ones until a reprice. An append whose state came from the cache writes nothing more: that
  state was folded, and its rows written, with the same table;
- `reprice_run`, run by run, for the console's reprice of one workspace (ledger/tenancy/
  repricing.py): under the head lock, a run whose entries all name the table in force is left
  alone (one query), so running it again is harmless.

The usage cells are corrected by difference (the old entries' sums taken out, the new ones'
added), row by row like an append's, so the rewrite is exact while other runs of the workspace
append to the same cells; `ledger reprice` and `ledger rebuild` count whole days again instead.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db import transaction

from ..fold import RunState, fold
from ..fold.pricing import PriceTable, prices_of
from ..models import CostEntry, Event, Run, Step
from . import rollup
from .bulk import insert_rows, upsert_rows
from .envelopes import log_of
from .projection import POSITIONED, _comparable, _usage, cost_fields, step_fields
from .states import STATES

_OLD = (
    "sequence",
    "provider",
    "model_id",
    *rollup.TOKENS,
    "cost_usd",
    "price_table_version",
    "priced_as",
    "recorded_at",
)


def stale(run_pk: int, version: str) -> bool:
    """Whether a cost entry of the run names a price table other than `version`."""
    return CostEntry.objects.filter(run_id=run_pk).exclude(price_table_version=version).exists()


def align(run: Run, state: RunState, prices: PriceTable) -> int:
    """After the append folded `run`'s whole log afresh into `state` with `prices` (the caller
    holds the head lock): when a stored cost entry names another table, the run's cost
    projections rewritten to `state`. How many entries changed."""
    if not state.cost_entries or not stale(run.pk, prices.version):
        return 0
    return rewrite(run, state)


def rewrite(run: Run, state: RunState) -> int:
    """The run's cost entries, the usage columns of the run and of the steps that own entries, and
    the usage cells of the entries' days, rewritten to `state` (the fold of the whole log, under
    the head lock). How many entries changed dollars, table or `pricedAs`."""
    old = list(CostEntry.objects.filter(run_id=run.pk).values(*_OLD))
    recorded = {row["sequence"]: row["recorded_at"] for row in old}
    missing = [e.sequence for e in state.cost_entries if e.sequence not in recorded]
    if missing:  # a projection short of entries: their times are the events'
        recorded.update(
            Event.objects.filter(run_id=run.pk, sequence__in=missing).values_list("sequence", "recorded_at")
        )
    no_times: defaultdict[int, str] = defaultdict(str)
    rows = []
    for i in range(len(state.cost_entries)):
        row = cost_fields(state, i, no_times)
        row["recorded_at"] = recorded[row["sequence"]]
        rows.append(row)
    workflow = state.workflow_version_id or ""
    wrong = rollup.subtract(rollup.cells(run.workspace_id, workflow, old))
    CostEntry.objects.filter(run_id=run.pk).delete()
    insert_rows(CostEntry, [{"run_id": run.pk, **row} for row in rows])
    rollup.add(rollup.cells(run.workspace_id, workflow, rows))
    for workspace_id, days in wrong.items():  # cells that were wrong before: counted again
        rollup.recount(workspace_id, days)
    Run.objects.filter(pk=run.pk).update(**_usage(state.usage))
    owners = {e.step_path for e in state.cost_entries if e.step_path}
    upsert_rows(
        Step,
        ("run_id", "step_path"),
        [{"run_id": run.pk, **step_fields(state, path, i)} for i, path in enumerate(state.steps) if path in owners],
        keep=POSITIONED,
    )
    return _changed(old, rows)


def _changed(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> int:
    before = {row["sequence"]: row for row in old}
    count = 0
    for row in new:
        was = before.get(row["sequence"])
        if (
            was is None
            or _comparable(was["cost_usd"]) != _comparable(row["cost_usd"])
            or was["price_table_version"] != row["price_table_version"]
            or was["priced_as"] != row["priced_as"]
        ):
            count += 1
    return count


@transaction.atomic
def reprice_run(run_pk: int) -> int:
    """One run's cost projections brought to the table its workspace prices with now, under its
    head lock; a run already there (or gone) is left alone. How many entries changed."""
    run = Run.objects.select_for_update().select_related("workspace").filter(pk=run_pk).first()
    if run is None:
        return 0
    prices = prices_of(run)
    if not stale(run.pk, prices.version):
        return 0
    state = fold(log_of(run), prices=prices, run_id=run.run_id)
    changed = rewrite(run, state)
    STATES.take(run.workspace_id, run.run_id, prices.version)  # this process's cached state, if any: dropped
    return changed
