"""The daily usage rollup: kept by every append, equal to the cost entries, checked by `ledger verify`
(of a workspace or all), recounted by `ledger rebuild` and `ledger reprice`, filled from the stored
entries by its migration."""

from __future__ import annotations

import importlib
from datetime import UTC, date, datetime, time
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from django.apps import apps

from ledger import clock
from ledger.log import rollup
from ledger.models import CostEntry, DailyUsage, MonthlyUsage, Run, Workspace
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, ledger_cli, started

pytestmark = pytest.mark.django_db

DAY1, DAY2 = date(2026, 3, 1), date(2026, 3, 2)
# The whole database's verify also checks that the rows name runs (tests/test_run_reference.py).
REFERENCES = "checked that every event, step, tool call and cost entry names a run that exists\n"


def responded(
    call: str, provider: str, model: str, *, step: str | None = None, inp: int = 1000, out: int = 100
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "turn": 1,
        "callId": call,
        "model": {"provider": provider, "modelId": model},
        "response": {"text": "ok", "usage": {"inputTokens": inp, "outputTokens": out}},
    }
    if step:
        payload["stepPath"] = step
    return {"type": "harness.model.responded", "payload": payload}


def on(day: date, hour: int = 12) -> Any:
    return clock.backdated(datetime.combine(day, time(hour), tzinfo=UTC))


def cells(workspace: Workspace) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        tuple(r[k] for k in rollup.KEY): tuple(r[s] for s in rollup.SUMS)
        for r in DailyUsage.objects.filter(workspace=workspace).values(*rollup.KEY, *rollup.SUMS)
    }


@pytest.fixture
def spent(append, workspace: Workspace) -> None:
    """Two days of calls in two runs of two workflows, priced and unpriced, over several appends."""
    with on(DAY1):
        append("run_a", started("wf_a"), responded("c1", "openai", "gpt-4o-mini", inp=2000, out=200))
        append("run_a", responded("c2", "openai", "gpt-4o-mini"), responded("c3", "acme.chat", "house", inp=5))
    with on(DAY2, hour=0):
        append("run_a", responded("c4", "openai", "gpt-4o-mini", inp=10))
        append(
            "run_b",
            started("wf_b"),
            ev("StepScheduled", stepPath="s"),
            responded("c1", "openai", "gpt-4o-mini", step="s", inp=300),
        )


def test_every_append_adds_its_cost_entries_to_their_day_model_and_workflow(spent, workspace: Workspace) -> None:
    mini = ("openai", "gpt-4o-mini")
    got = cells(workspace)
    assert set(got) == {
        (DAY1, *mini, "wf_a"),
        (DAY1, "acme.chat", "house", "wf_a"),
        (DAY2, *mini, "wf_a"),
        (DAY2, *mini, "wf_b"),
    }
    # input, output, cached, reasoning tokens; dollars; calls, priced calls
    assert got[(DAY1, *mini, "wf_a")][:4] == (3000, 300, 0, 0) and got[(DAY1, *mini, "wf_a")][5:] == (2, 2)
    assert got[(DAY1, "acme.chat", "house", "wf_a")][4:] == (Decimal(0), 1, 0)  # unpriced: no dollars
    assert got[(DAY2, *mini, "wf_b")][0] == 300
    assert rollup.differences(workspace.pk) == [] and rollup.differences(workspace.pk, {DAY2}) == []
    assert ledger_cli("verify")[0] == 0


def test_verify_catches_a_wrong_rollup_row_and_rebuild_mends_it(spent, workspace: Workspace) -> None:
    DailyUsage.objects.filter(workspace=workspace, day=DAY1, model_id="gpt-4o-mini").update(calls=7)
    for scope in ((), ("--workspace", "acme/support")):
        code, out = ledger_cli("verify", *scope)
        assert code == 1 and "FAIL acme/support usage_rollup: 2026-03-01 openai/gpt-4o-mini wf_a" in out, scope
        assert "calls=7" in out and "1 failure(s)" in out
    # One run's verify checks that run; the rollup sums the whole workspace and is checked with it.
    assert ledger_cli("verify", "run_a") == (0, "verified 1 run(s): ok\n")
    assert ledger_cli("rebuild", "run_a")[0] == 0
    assert ledger_cli("verify") == (
        0,
        "checked the daily and monthly usage of 1 workspace(s)\n" + REFERENCES + "verified 2 run(s): ok\n",
    )


def test_verify_catches_a_missing_and_a_stray_rollup_row(spent, workspace: Workspace) -> None:
    DailyUsage.objects.filter(workspace=workspace, day=DAY2, workflow_version_id="wf_b").delete()
    DailyUsage.objects.create(
        workspace=workspace,
        day=DAY1,
        provider="openai",
        model_id="gpt-5",
        workflow_version_id="wf_a",
        input_tokens=1,
        calls=1,
    )
    code, out = ledger_cli("verify")
    assert code == 1 and "2026-03-02 openai/gpt-4o-mini wf_b: the rollup has no row" in out
    assert "2026-03-01 openai/gpt-5 wf_a: the rollup has input_tokens=1" in out and "the cost entries say no row" in out
    assert ledger_cli("rebuild")[0] == 0
    assert ledger_cli("verify")[0] == 0


def test_reprice_recounts_the_dollars_of_the_days(spent, workspace: Workspace) -> None:
    before = cells(workspace)[(DAY1, "acme.chat", "house", "wf_a")]
    workspace.price_overrides = {"acme.chat/house": {"input": 1_000_000, "output": 0}}
    workspace.save()
    assert ledger_cli("reprice")[0] == 0
    after = cells(workspace)[(DAY1, "acme.chat", "house", "wf_a")]
    assert before[4:] == (Decimal(0), 1, 0) and after[4:] == (Decimal(5), 1, 1)  # 5 input tokens at $1/token
    assert ledger_cli("verify")[0] == 0


def test_other_workspaces_keep_their_own_cells(spent, append, workspace: Workspace) -> None:
    research = bootstrap(tenant="acme", workspace="research")
    from ledger import log

    with on(DAY1):
        log.append(
            workspace=research, run_id="run_a", events=[started("wf_a"), responded("c1", "openai", "gpt-4o-mini")]
        )
    assert list(cells(research)) == [(DAY1, "openai", "gpt-4o-mini", "wf_a")]
    assert cells(workspace)[(DAY1, "openai", "gpt-4o-mini", "wf_a")][5] == 2


def test_the_migration_counts_the_cost_entries_already_stored(spent, workspace: Workspace) -> None:
    kept = cells(workspace)
    DailyUsage.objects.all().delete()
    migration = importlib.import_module("ledger.migrations.0009_daily_usage")
    migration.count_existing_cost_entries(apps, None)
    assert cells(workspace) == kept
    assert Run.objects.count() == 2


# --- the monthly rollup (kept from the daily cells by triggers: migration 0018) --------------------


def months(workspace: Workspace) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {
        tuple(r[k] for k in rollup.MONTH_KEY): tuple(r[s] for s in rollup.SUMS)
        for r in MonthlyUsage.objects.filter(workspace=workspace).values(*rollup.MONTH_KEY, *rollup.SUMS)
    }


def comparable(cells: dict[tuple[Any, ...], tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {k: rollup._comparable(v) for k, v in cells.items()}


def test_every_write_of_a_daily_cell_keeps_its_month(spent, append, workspace: Workspace) -> None:
    mini, march = ("openai", "gpt-4o-mini"), date(2026, 3, 1)
    assert comparable(months(workspace)) == comparable(rollup.summed_months(workspace.pk))
    got = months(workspace)
    assert set(got) == {(march, *mini, "wf_a"), (march, "acme.chat", "house", "wf_a"), (march, *mini, "wf_b")}
    assert got[(march, *mini, "wf_a")][0] == 3010 and got[(march, *mini, "wf_a")][5:] == (3, 3)
    with on(date(2026, 4, 30), hour=23):  # another month
        append("run_c", started("wf_a"), responded("c1", "openai", "gpt-4o-mini", inp=7))
    assert months(workspace)[(date(2026, 4, 1), *mini, "wf_a")][0] == 7
    # A recount (delete and insert of daily cells) and a subtraction (update to none, delete) keep it.
    rollup.recount(workspace.pk, {DAY1, DAY2})
    assert comparable(months(workspace)) == comparable(rollup.summed_months(workspace.pk))
    rows = rollup.cells(
        workspace.pk,
        "wf_b",
        CostEntry.objects.filter(run__run_id="run_b").values(
            "recorded_at", "provider", "model_id", *rollup.TOKENS, "cost_usd"
        ),
    )
    assert rollup.subtract(rows) == {}
    assert (march, *mini, "wf_b") not in months(workspace)  # its only day went: the month goes too
    assert comparable(months(workspace)) == comparable(rollup.summed_months(workspace.pk))


def test_verify_catches_a_wrong_month_and_rebuild_mends_it(spent, workspace: Workspace) -> None:
    MonthlyUsage.objects.filter(workspace=workspace, model_id="house").update(calls=9)
    MonthlyUsage.objects.filter(workspace=workspace, workflow_version_id="wf_b").delete()
    code, out = ledger_cli("verify")
    assert code == 1 and "month 2026-03 acme.chat/house wf_a: the monthly rollup has" in out and "calls=9" in out
    assert "month 2026-03 openai/gpt-4o-mini wf_b: the monthly rollup has no row" in out
    assert ledger_cli("rebuild")[0] == 0
    assert ledger_cli("verify") == (
        0,
        "checked the daily and monthly usage of 1 workspace(s)\n" + REFERENCES + "verified 2 run(s): ok\n",
    )


def test_the_migration_sums_the_daily_cells_already_stored(spent, workspace: Workspace) -> None:
    from django.db import connection

    kept = months(workspace)
    migration = importlib.import_module("ledger.migrations.0018_monthly_usage")

    editor = SimpleNamespace(connection=connection)
    migration.drop_triggers(apps, editor)
    MonthlyUsage.objects.all().delete()
    migration.keep_months(apps, editor)  # the sums, then the triggers again
    assert comparable(months(workspace)) == comparable(kept)
    rollup.recount(workspace.pk, {DAY1})
    assert comparable(months(workspace)) == comparable(kept)
