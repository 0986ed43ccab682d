"""Migrations 0012 and 0020: the event, projection and gateway tables keep one index for lookups by
run, the unique (run_id, …) constraint's, and no second index on run_id alone that every insert
had to write (and that the gateway's generic plans chose, filtering every claim of the run).
Migration 0022: the usage rollups likewise keep one index for their reads by workspace and range,
the unique (workspace_id, day or month, …) constraint's, and none on workspace_id alone (which the
planner chose for a range of days, filtering every day of the workspace). Migration 0023: and no
table of the ledger has an index that another of its indexes leads with: one more B-tree for
every insert to write, and a second path for the planner to take. A partial index (migration 0036:
the steps whose retry is scheduled) holds only the rows its condition names and serves only the
queries that imply it, so it is not the start of another whatever its columns."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection
from django.db.backends.utils import CursorWrapper

pytestmark = pytest.mark.django_db

LEADING = {
    "ledger_event": ["run_id", "sequence"],
    "ledger_step": ["run_id", "step_path"],
    "ledger_toolcall": ["run_id", "call_id"],
    "ledger_costentry": ["run_id", "sequence"],
    "ledger_toolgatewayclaim": ["run_id", "call_id"],
}


@pytest.mark.parametrize("table", sorted(LEADING))
def test_run_lookups_have_the_unique_index_and_no_other(table: str) -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    by_columns = [c["columns"] for c in constraints.values() if c["index"] or c["unique"]]
    assert LEADING[table] in by_columns
    assert ["run_id"] not in by_columns


@pytest.mark.parametrize("table, leading", [("ledger_dailyusage", "day"), ("ledger_monthlyusage", "month")])
def test_usage_reads_have_the_unique_index_and_no_other(table: str, leading: str) -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    by_columns = [c["columns"] for c in constraints.values() if c["index"] or c["unique"]]
    assert ["workspace_id", leading, "provider", "model_id", "workflow_version_id"] in by_columns
    assert ["workspace_id"] not in by_columns


LEDGER_TABLES = sorted(model._meta.db_table for model in apps.get_app_config("ledger").get_models())


def _partial(cursor: CursorWrapper, table: str) -> set[str]:
    """The names of `table`'s partial indexes (those with a WHERE condition)."""
    if connection.vendor == "postgresql":
        sql = "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = %s::regclass AND indpred IS NOT NULL"
    else:
        sql = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = %s AND sql LIKE '% WHERE %'"
    cursor.execute(sql, [table])
    return {name.strip('"') for (name,) in cursor.fetchall()}


def test_the_partial_indexes_are_seen() -> None:
    with connection.cursor() as cursor:
        assert _partial(cursor, "ledger_step") == {"step_retry_in_run"}
        assert _partial(cursor, "ledger_run") == {"run_below", "run_unfinished"}


@pytest.mark.parametrize("table", LEDGER_TABLES)
def test_no_index_is_the_start_of_another(table: str) -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        partial = _partial(cursor, table)
    # PostgreSQL's `…_like` indexes (varchar_pattern_ops, for LIKE 'x%') answer other queries.
    indexes = {
        name: c
        for name, c in constraints.items()
        if (c["index"] or c["unique"]) and c["columns"] and not name.endswith("_like") and name not in partial
    }
    redundant = sorted(
        (name, other)
        for name, index in indexes.items()
        if not index["unique"]
        for other, longer in indexes.items()
        if other != name and longer["columns"][: len(index["columns"])] == index["columns"]
    )
    assert redundant == []
