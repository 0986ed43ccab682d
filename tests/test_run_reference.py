"""The event, step, tool call and cost entry rows name their run without a database foreign key
(migration 0019, ledger/models.py Event.run): the append writes them only for the run row its
statement holds, retention deletes them before their runs, and `ledger verify` of the whole
database finds any row whose run is gone."""

from __future__ import annotations

import pytest
from django.db import connection

from ledger.models import CostEntry, Event, Run, Step, ToolCall
from tests.conftest import ev, ledger_cli, started
from tests.test_rollup import responded

pytestmark = pytest.mark.django_db

ROWS = (Event, Step, ToolCall, CostEntry)


@pytest.fixture
def two_runs(append, workspace) -> tuple[Run, Run]:
    for run_id in ("run_kept", "run_gone"):
        append(
            run_id,
            started("wf"),
            ev("StepScheduled", stepPath="s"),
            responded("c1", "openai", "gpt-4o-mini", step="s"),
            ev("harness.tool_call.started", callId="t1", toolName="lookup", caller="agent", stepPath="s", args={}),
        )
    kept, gone = (Run.objects.get(run_id=r) for r in ("run_kept", "run_gone"))
    assert all(model.objects.filter(run=gone).exists() for model in ROWS)
    return kept, gone


def test_the_database_holds_no_foreign_key_from_these_rows_to_their_run(two_runs) -> None:
    with connection.cursor() as cursor:
        for model in ROWS:
            constraints = connection.introspection.get_constraints(cursor, model._meta.db_table)
            assert not [name for name, c in constraints.items() if c["foreign_key"]], model


def test_verify_of_the_whole_database_finds_rows_whose_run_is_gone(two_runs) -> None:
    kept, gone = two_runs
    assert ledger_cli("verify")[0] == 0
    with connection.cursor() as cursor:  # what no code path of the product does: the run row alone
        cursor.execute("DELETE FROM ledger_run WHERE id = %s", [gone.pk])
    code, out = ledger_cli("verify")
    assert code == 1, out
    for model in ROWS:
        assert f"FAIL run_reference_{model._meta.model_name}: rows name runs that do not exist: pk [{gone.pk}]" in out
    # The workspace's usage (summed over its runs' cost entries) no longer matches its rollup either.
    assert "FAIL acme/support usage_rollup" in out and "5 failure(s)" in out
    # A run's or a workspace's verify cannot see a row that belongs to no run any more.
    assert ledger_cli("verify", "run_kept")[0] == 0
    assert "run_reference" not in ledger_cli("verify", "--workspace", "acme/support")[1]
