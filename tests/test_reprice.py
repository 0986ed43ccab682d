"""Repricing (docs/operations.md § Prices): a run appended to across a change of its workspace's
prices stays exactly what the fold with the new table says (ledger/log/repricing.py), and
`ledger reprice` reprices one run, one workspace's runs or every run."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core.management.base import CommandError

from ledger import clock, log
from ledger.fold.pricing import prices_for
from ledger.log import repricing
from ledger.log.states import STATES
from ledger.models import CostEntry, DailyUsage, MonthlyUsage, Run, Step, Workspace
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, ledger_cli, started


def responded(step: str, turn: int, provider: str = "openai", model: str = "gpt-4o", **usage: int) -> dict[str, Any]:
    return ev(
        "harness.model.responded",
        stepPath=step,
        turn=turn,
        callId=f"m{turn}-{step}",
        model={"provider": provider, "modelId": model},
        response={"text": "ok", "usage": usage or {"inputTokens": 1_000_000, "outputTokens": 0}},
    )


def override(workspace: Workspace, rates: dict[str, Any] | None) -> None:
    workspace.price_overrides = {"openai/gpt-4o": rates} if rates else {}
    workspace.save()


def sums_agree(run: Run) -> None:
    """The run's and its steps' totals are the sums of its cost entries, which all name one table."""
    run.refresh_from_db()
    entries = list(CostEntry.objects.filter(run=run))
    assert run.cost_usd == sum((e.cost_usd for e in entries), Decimal(0))
    assert len({e.price_table_version for e in entries}) == 1
    for step in Step.objects.filter(run=run):
        assert step.cost_usd == sum((e.cost_usd for e in entries if e.step_path == step.step_path), Decimal(0))


def rollups_agree(workspace: Workspace) -> None:
    total = sum((e.cost_usd for e in CostEntry.objects.filter(run__workspace=workspace)), Decimal(0))
    assert sum((c.cost_usd for c in DailyUsage.objects.filter(workspace=workspace)), Decimal(0)) == total
    assert sum((c.cost_usd for c in MonthlyUsage.objects.filter(workspace=workspace)), Decimal(0)) == total


@pytest.mark.django_db
def test_an_append_after_a_price_change_reprices_the_run_it_folds_again(workspace, append) -> None:
    append("run_a", started(), responded("s", 1), responded("t", 1))
    append("run_b", started(), responded("s", 1))  # another run of the workspace, not appended to again
    assert Run.objects.get(run_id="run_a").cost_usd == Decimal(5)  # 2 × 1M input at $2.5
    override(workspace, {"input": 1, "output": 2})
    append("run_a", responded("s", 2))
    run = Run.objects.get(run_id="run_a")
    assert run.cost_usd == Decimal(3)  # every entry at $1 per 1M now, not 2.5 + 2.5 + 1
    assert Step.objects.get(run=run, step_path="s").cost_usd == Decimal(2)
    assert {e.price_table_version for e in CostEntry.objects.filter(run=run)} == {prices_for(workspace).version}
    sums_agree(run)
    rollups_agree(workspace)
    assert ledger_cli("verify", "run_a")[0] == 0
    # run_b still waits for a reprice (verify says so); the workspace's reprice brings it along
    assert ledger_cli("verify", "run_b")[0] == 1
    assert ledger_cli("reprice", "--workspace", "acme/support") == (0, "repriced 2 run(s): 1 cost entry changed\n")
    assert ledger_cli("verify")[0] == 0


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_state_this_process_cached_is_repriced_by_its_next_append() -> None:
    workspace = bootstrap(tenant="acme", workspace="support")
    STATES.clear()
    try:
        log.append(workspace=workspace, run_id="run_c", events=[started(), responded("s", 1)])
        log.append(workspace=workspace, run_id="run_c", events=[responded("s", 2)])  # from the cache
        override(workspace, {"input": 10, "output": 2})
        log.append(workspace=workspace, run_id="run_c", events=[responded("t", 1)])
        run = Run.objects.get(run_id="run_c")
        assert run.cost_usd == Decimal(30)
        sums_agree(run)
        rollups_agree(workspace)
        log.append(workspace=workspace, run_id="run_c", events=[responded("t", 2), ev("RunCompleted")])
        sums_agree(run)
        assert ledger_cli("verify")[0] == 0
        # and back to the shipped rates
        override(workspace, None)
        log.append(workspace=workspace, run_id="run_d", events=[started()])
        assert ledger_cli("verify", "run_c")[0] == 1  # finished: nothing appends to it again
        assert repricing.reprice_run(run.pk) == 4
        assert repricing.reprice_run(run.pk) == 0  # already at the table in force
        sums_agree(run)
        assert run.cost_usd == Decimal(10)
        assert ledger_cli("verify")[0] == 0
    finally:
        STATES.clear()


@pytest.mark.django_db
def test_the_daily_and_monthly_cells_of_the_days_before_follow_the_new_prices(workspace, append) -> None:
    days = [datetime(2026, 2, 28, 12, tzinfo=UTC), datetime(2026, 3, 1, 12, tzinfo=UTC)]
    with clock.backdated(days[0]):
        append("run_e", started(), responded("s", 1, "openai", "gpt-4o-mini", inputTokens=1_000, outputTokens=10))
        append("run_f", started(), responded("s", 1))  # the same cell, of a run not appended to again
    with clock.backdated(days[1]):
        append("run_e", responded("s", 2))
    override(workspace, {"input": 1, "output": 1})
    append("run_e", responded("t", 1))  # today
    rollups_agree(workspace)
    feb = DailyUsage.objects.get(workspace=workspace, day=days[0].date(), model_id="gpt-4o")
    assert (feb.cost_usd, feb.calls) == (Decimal("2.5"), 1)  # run_f's, unchanged until a reprice
    march = MonthlyUsage.objects.get(workspace=workspace, month=date(2026, 3, 1), model_id="gpt-4o")
    assert march.cost_usd == Decimal(1)  # run_e's call of March 1st at the new rate
    assert ledger_cli("verify", "run_e")[0] == 0
    assert ledger_cli("reprice")[0] == 0
    assert ledger_cli("verify")[0] == 0


@pytest.mark.django_db
def test_reprice_takes_one_run_or_one_workspace(workspace, append) -> None:
    other = bootstrap(tenant="globex", workspace="main")
    append("run_a", started(), responded("s", 1))
    log.append(workspace=other, run_id="run_x", events=[started(), responded("s", 1)])
    override(workspace, {"input": 1, "output": 2})
    override(other, {"input": 4, "output": 2})
    assert ledger_cli("reprice", "run_a", "--workspace", "acme/support") == (
        0,
        "repriced 1 run(s): 1 cost entry changed\n",
    )
    assert Run.objects.get(run_id="run_a").cost_usd == Decimal(1)
    assert Run.objects.get(run_id="run_x").cost_usd == Decimal("2.5")  # the other workspace waits
    assert ledger_cli("reprice", "--workspace", "globex/main") == (0, "repriced 1 run(s): 1 cost entry changed\n")
    assert Run.objects.get(run_id="run_x").cost_usd == Decimal(4)
    assert ledger_cli("reprice") == (0, "repriced 2 run(s): 0 cost entries changed\n")
    assert ledger_cli("verify")[0] == 0
    with pytest.raises(CommandError, match="workspace acme/nowhere not found"):
        ledger_cli("reprice", "--workspace", "acme/nowhere")
