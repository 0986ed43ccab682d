"""Repricing (docs/operations.md § Prices): a run appended to across a change of its workspace's
prices stays exactly what the fold with the new table says (ledger/log/repricing.py), whichever
process changed them and however long the appending one has held its workspace (a runtime
executor, a worker); and `ledger reprice` reprices one run, one workspace's runs or every run."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import CommandError
from django.db import connection

from ledger import clock, log
from ledger.fold.pricing import prices_for
from ledger.log import repricing
from ledger.log.states import STATES
from ledger.log.strategies import PIPELINE_FROM
from ledger.models import CostEntry, DailyUsage, MonthlyUsage, Run, Step, Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.tenancy import price_settings
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, ledger_cli, named_user, started
from tests.runtime_support import round_trips
from tests.runtime_workflows import SCRIPT, build_drill


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


def changed_elsewhere(workspace: Workspace, rates: dict[str, Any], by: AbstractBaseUser) -> Workspace:
    """openai/gpt-4o's override set as the Prices page sets it, on a Workspace loaded for it, as
    another process (the console's) would: `workspace`, what a long-lived process holds, is left
    as it was. The workspace as loaded again after the change."""
    price_settings.set_override(
        workspace=Workspace.objects.get(pk=workspace.pk), key="openai/gpt-4o", rates=rates, by=by
    )
    fresh = Workspace.objects.get(pk=workspace.pk)
    assert workspace.price_overrides != fresh.price_overrides
    return fresh


@pytest.fixture
def no_cached_states() -> Iterator[None]:
    STATES.clear()
    yield
    STATES.clear()


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


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("calls", [1, PIPELINE_FROM], ids=["one_call", "a_long_batch"])
def test_a_process_holding_its_workspace_from_before_a_price_change_appends_at_the_new_prices(
    calls: int, no_cached_states: None
) -> None:
    held = bootstrap(tenant="acme", workspace="support")  # what a long-lived process loaded once
    admin = named_user("alice", "admin")
    log.append(workspace=held, run_id="run_a", events=[started(), responded("s", 1)])
    log.append(workspace=held, run_id="run_a", events=[responded("s", 2)])  # its state cached here
    fresh = changed_elsewhere(held, {"input": 1, "output": 2}, admin)
    log.append(workspace=held, run_id="run_a", events=[responded("t", turn) for turn in range(1, calls + 1)])
    log.append(workspace=held, run_id="run_b", events=[started(), responded("s", 1)])  # a run it starts now
    for run_id, entries in (("run_a", calls + 2), ("run_b", 1)):
        run = Run.objects.get(run_id=run_id)
        assert run.cost_usd == Decimal(entries)  # every call at $1 per 1M input tokens, none at $2.5
        assert {e.price_table_version for e in CostEntry.objects.filter(run=run)} == {prices_for(fresh).version}
        sums_agree(run)
    rollups_agree(fresh)
    assert ledger_cli("verify")[0] == 0
    # Found out once: the process's appends are one statement again, at the new prices (the
    # second: the pipeline that missed rolled back, and on a rollback psycopg deallocates the
    # connection's prepared statements, so the first prepares its own again).
    log.append(workspace=held, run_id="run_a", events=[responded("u", 1)])
    with round_trips() as sent:
        log.append(workspace=held, run_id="run_a", events=[responded("u", 2)])
    assert sent == ([1] if connection.vendor == "postgresql" else [])
    assert Run.objects.get(run_id="run_a").cost_usd == Decimal(calls + 4)
    assert ledger_cli("verify", "run_a")[0] == 0


@pytest.mark.django_db
def test_a_run_executing_across_a_price_change_prices_its_later_calls_with_the_new_table(
    workspace: Workspace, no_cached_states: None
) -> None:
    admin = named_user("alice", "admin")

    def reply(request: ModelRequest) -> dict[str, Any]:
        step = request.step_path.split(".")[0]
        if (step, request.turn) == ("research", 2):  # an admin changes the prices while the run executes
            changed_elsewhere(workspace, {"input": 1, "output": 2}, admin)
        return SCRIPT[step][request.turn - 1]

    provider = ScriptedProvider(script=reply, name="openai", model_id="gpt-4o")
    outcome = start_run(
        workspace=workspace, workflow=build_drill(provider=provider), input={"cities": ["Oslo"], "to": "ops"}
    )

    assert outcome.status == "completed"
    run = Run.objects.get(run_id=outcome.run_id)
    entries = list(CostEntry.objects.filter(run=run).order_by("sequence"))
    # (input - cached) x $1 + cached x $1.25 (gpt-4o's cache rate, not overridden) + output x $2, per 1M
    assert [e.cost_usd for e in entries] == [
        Decimal("0.00026"),
        Decimal("0.000406"),
        Decimal("0.000424"),
        Decimal("0.000098"),
    ]
    assert {e.price_table_version for e in entries} == {prices_for(Workspace.objects.get(pk=workspace.pk)).version}
    sums_agree(run)
    rollups_agree(workspace)
    assert ledger_cli("verify", outcome.run_id)[0] == 0
