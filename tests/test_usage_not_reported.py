"""A model call whose recorded usage gives no token count (`{}`: an OpenAI stream without
`include_usage`, traced to the OTLP endpoint) costs an unknown amount: it is unpriced, never a
priced $0, in the cost entries and everything they feed, through `ledger verify`, `rebuild` and
`reprice`, and in the rows a database wrote before this rule (migration 0039)."""

from __future__ import annotations

import importlib
import json
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.db import connection
from django.test import Client

from ledger.fold.pricing import load_default_prices
from ledger.log import rollup, snapshots
from ledger.log.envelopes import log_of
from ledger.models import CostEntry, DailyUsage, FoldSnapshot, MonthlyUsage, Run, Step, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ledger_cli, started

pytestmark = pytest.mark.django_db
MINI = ("openai", "gpt-4o-mini")
HOUSE = ("acme.chat", "house")


def answer(call: str, usage: dict[str, Any], *, step: str | None = "ask", model: tuple[str, str] = MINI) -> Any:
    payload: dict[str, Any] = {
        "turn": 1,
        "callId": call,
        "model": {"provider": model[0], "modelId": model[1]},
        "response": {"text": "ok", "usage": usage},
    }
    if step is not None:
        payload["stepPath"] = step
    return {"type": "harness.model.responded", "payload": payload}


@pytest.fixture
def logs(append) -> None:
    """Native runs with calls whose usage was not reported, beside priced and unpriced ones, and a
    run imported from Little Workflow, whose rule reads `{}` as zero tokens."""
    append(
        "run_mixed",
        started("wf_stream"),
        answer("c1", {"inputTokens": 10_000, "outputTokens": 2_000}),
        answer("c2", {}),
        answer("c3", {"inputTokens": 0, "outputTokens": 0}),
        answer("c4", {}, step=None),
    )
    append("run_all", started("wf_stream"), answer("c1", {}), answer("c2", {"totalTokens": 9}))
    append("run_house", started("wf_stream"), answer("c1", {}, model=HOUSE))
    append("run_little", started("wf_stream"), answer("c1", {}))
    little = Run.objects.get(run_id="run_little")
    little.imported_from = "little-workflow"
    little.save(update_fields=["imported_from"])
    assert ledger_cli("rebuild", "run_little")[0] == 0


def test_the_projections_count_such_calls_unpriced_and_verify_rebuild_reprice_agree(logs) -> None:
    mixed = Run.objects.get(run_id="run_mixed")
    assert (mixed.priced_calls, mixed.unpriced_calls, mixed.cost_usd) == (2, 2, Decimal("0.0027"))
    entries = {c.call_id: c for c in CostEntry.objects.filter(run=mixed)}
    assert [(entries[c].cost_usd, entries[c].usage_reported, entries[c].priced_as) for c in ("c2", "c4")] == [
        (None, False, "")
    ] * 2
    assert (entries["c3"].cost_usd, entries["c3"].usage_reported) == (Decimal(0), True)
    step = Step.objects.get(run=mixed, step_path="ask")
    assert (step.priced_calls, step.unpriced_calls) == (2, 1)
    assert (Run.objects.get(run_id="run_all").cost_usd, Run.objects.get(run_id="run_all").unpriced_calls) == (None, 2)
    house = CostEntry.objects.get(run__run_id="run_house")
    assert (house.cost_usd, house.usage_reported) == (None, False)
    little = CostEntry.objects.get(run__run_id="run_little")
    assert (little.cost_usd, little.usage_reported, little.price_table_version.endswith("+little")) == (0, True, True)

    assert ledger_cli("verify")[0] == 0
    assert ledger_cli("reprice") == (0, "repriced 4 run(s): 0 cost entries changed\n")
    assert ledger_cli("rebuild")[0] == 0
    assert ledger_cli("verify")[0] == 0


def _write_the_old_rule(workspace: Workspace) -> None:
    """The rows a database held before migration 0039: each call without reported usage priced by
    its model's rate at zero tokens ($0, counted priced) where the model has one."""
    table = load_default_prices()
    for entry in CostEntry.objects.filter(usage_reported=False):
        resolved = table.resolve(entry.provider, entry.model_id)
        entry.usage_reported = True
        if resolved is None:
            entry.save(update_fields=["usage_reported"])
            continue
        entry.cost_usd, entry.priced_as = Decimal(0), resolved[0]
        entry.save(update_fields=["usage_reported", "cost_usd", "priced_as"])
        run = Run.objects.get(pk=entry.run_id)
        run.priced_calls, run.unpriced_calls = run.priced_calls + 1, run.unpriced_calls - 1
        run.cost_usd = run.cost_usd or Decimal(0)
        run.save(update_fields=["priced_calls", "unpriced_calls", "cost_usd"])
        if entry.step_path:
            step = Step.objects.get(run_id=entry.run_id, step_path=entry.step_path)
            step.priced_calls, step.unpriced_calls = step.priced_calls + 1, step.unpriced_calls - 1
            step.cost_usd = step.cost_usd or Decimal(0)
            step.save(update_fields=["priced_calls", "unpriced_calls", "cost_usd"])
        cell = DailyUsage.objects.get(
            workspace=workspace,
            day=rollup.utc_day(entry.recorded_at),
            provider=entry.provider,
            model_id=entry.model_id,
            workflow_version_id=run.workflow_version_id,
        )
        cell.priced_calls += 1
        cell.save(update_fields=["priced_calls"])  # its month follows (migration 0018's triggers)


def _rows() -> dict[str, Any]:
    return {
        "entries": sorted(
            CostEntry.objects.values_list("run__run_id", "sequence", "cost_usd", "priced_as", "usage_reported")
        ),
        "runs": sorted(Run.objects.values_list("run_id", "cost_usd", "priced_calls", "unpriced_calls")),
        "steps": sorted(Step.objects.values_list("run__run_id", "step_path", "cost_usd", "priced_calls")),
        "days": sorted(DailyUsage.objects.values_list("model_id", "cost_usd", "calls", "priced_calls")),
        "months": sorted(MonthlyUsage.objects.values_list("model_id", "cost_usd", "calls", "priced_calls")),
    }


def test_the_migration_reprices_the_rows_the_old_rule_wrote(logs, workspace: Workspace) -> None:
    now = _rows()
    mixed = Run.objects.get(run_id="run_mixed")
    # A fold snapshot stored by a read before the upgrade, the call priced $0 in it too.
    old_state = snapshots.decode(snapshots.encode(snapshots.state_after(mixed)))
    stale = old_state.cost_entries[1]
    stale.cost_usd, stale.usage_reported, stale.priced_as = Decimal(0), True, "openai/gpt-4o-mini"
    FoldSnapshot.objects.create(
        run=mixed,
        sequence=mixed.last_sequence,
        price_version=load_default_prices().version,
        state=snapshots.encode(old_state),
    )
    _write_the_old_rule(workspace)
    assert Run.objects.get(run_id="run_all").cost_usd == 0
    code, out = ledger_cli("verify")
    assert code == 1
    assert "cost entry @3.cost_usd: projection has" in out and "cost entry @3.usage_reported" in out
    assert "run.unpriced_calls: projection has 0, the log says 2" in out  # run_all
    assert snapshots.check(mixed, log_of(mixed)) == ["snapshot at event 5 differs from the fold of events 1..5"]

    migration = importlib.import_module("ledger.migrations.0039_reprice_usage_not_reported")
    migration.reprice_usage_not_reported(apps, None)

    assert _rows() == now
    assert not FoldSnapshot.objects.filter(run=mixed).exists()
    code, out = ledger_cli("verify")
    assert code == 0, out
    # Run again, it finds nothing left to do.
    migration.reprice_usage_not_reported(apps, None)
    assert _rows() == now


def _page(client: Client, url: str, **params: Any) -> str:
    response = client.get(url, params)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_the_console_reads_such_a_call_as_unknown_and_says_why(logs, append, browser: Client) -> None:
    append("run_priceless", started("wf_stream"), answer("c1", {"inputTokens": 5, "outputTokens": 1}, model=HOUSE))
    base = "/w/acme/support/runs/run_mixed/"
    header = _page(browser, base)
    assert '$0.0027 <span class="muted">2/4 priced (50%)</span>' in header
    evidence = _page(browser, f"{base}evidence/")
    assert evidence.count("<td>n/a (usage not reported)</td>") == 2 and "<td>$0</td>" in evidence
    assert "<td>n/a (no price)</td>" in _page(browser, "/w/acme/support/runs/run_priceless/evidence/")
    # Both hold: no price added later could price it.
    assert "<td>n/a (usage not reported)</td>" in _page(browser, "/w/acme/support/runs/run_house/evidence/")
    conversation = _page(browser, f"{base}conversation/")
    assert conversation.count('<span class="usage">usage not reported</span> · <span class="cost">n/a</span>') == 2
    assert '<span class="usage">0 in / 0 out</span> · <span class="cost">$0</span>' in conversation  # c3
    waterfall = _page(browser, f"{base}waterfall/")
    assert waterfall.count('<span class="wf-usage">n/a · usage not reported</span>') == 2
    assert "0 in / 0 out" in waterfall  # the explicit zeros
    detail = _page(browser, f"{base}waterfall/detail/", kind="model", id="3", HTTP_HX_REQUEST="true")
    assert '<span class="wf-tokens">usage not reported</span>' in detail and "cost n/a" in detail
    costs = _page(browser, f"{base}costs/")
    assert "<td>$0.0027</td><td>2/4 priced (50%)</td>" in costs
    runs = _page(browser, "/w/acme/support/", sort="cost")
    assert 'title="2 of 4 model calls priced"' in runs and 'aria-label="partly priced"' in runs
    assert "0 of 2 model calls priced" in runs  # run_all: every call unknown, its cost n/a


def test_the_api_evidence_export_and_report_say_why(logs, append, workspace: Workspace, client: Client) -> None:
    append("run_priceless", started("wf_stream"), answer("c1", {"inputTokens": 5, "outputTokens": 1}, model=HOUSE))
    _, key = create_key(workspace=workspace, scopes=["read"])
    headers = {"Authorization": f"Bearer {key}"}
    costs = client.get("/api/v1/runs/run_mixed/evidence", headers=headers).json()["costs"]
    assert [(c["callId"], c["costUsd"], c["unpricedReason"], c["pricedAs"]) for c in costs] == [
        ("c1", 0.0027, None, "openai/gpt-4o-mini"),
        ("c2", None, "usage_not_reported", None),
        ("c3", 0.0, None, "openai/gpt-4o-mini"),
        ("c4", None, "usage_not_reported", None),
    ]
    priceless = client.get("/api/v1/runs/run_priceless/evidence", headers=headers).json()["costs"]
    assert priceless[0]["unpricedReason"] == "no_price"
    export = client.get("/api/v1/export/costs", {"format": "csv", "runId": "run_mixed"}, headers=headers)
    rows = b"".join(export.streaming_content).decode().splitlines()
    assert rows[1].endswith(",unpricedReason") and rows[3].endswith(",usage_not_reported")
    assert rows[2].endswith("Z,")  # a priced call: no reason

    code, out = ledger_cli("report", "run_mixed", "--table")
    assert code == 0 and out.endswith(
        "\nNote: 2 model call(s) reported no usage and are excluded from the cost above.\n"
    )
    assert "no registry pricing" not in out
    code, out = ledger_cli("report", "run_mixed")
    assert json.loads(out)["usageNotReportedCalls"] == 2


def test_the_previous_release_can_still_insert_cost_entries_mid_deploy(logs) -> None:
    """Its inserts name no usage_reported (migrations run while it serves): the database's default."""
    run = Run.objects.get(run_id="run_mixed")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_costentry (run_id, sequence, call_id, step_path, provider, model_id, input_tokens, "
            "output_tokens, cached_input_tokens, reasoning_tokens, cost_usd, price_table_version, priced_as, "
            "recorded_at) VALUES (%s, 99, 'old', '', 'openai', 'gpt-4o-mini', 1, 1, 0, 0, 0, 'v', '', %s)",
            [run.pk, run.created_at],
        )
    assert CostEntry.objects.get(run=run, sequence=99).usage_reported is True
