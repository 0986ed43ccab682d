"""The Prices screen of a workspace's Settings (admins only): the shipped price table with the
workspace's overrides laid over it; an override set, changed and removed, checked as the fold
checks them (PriceTable.with_overrides, under our rules and Little Workflow's) with each reason
next to its field, audited `price_overrides.changed`; and the reprice of the workspace's recorded
costs, queued for the worker from the page (ledger/tenancy/repricing.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django_tasks_db.models import DBTaskResult

from ledger.fold.pricing import load_default_prices
from ledger.log.projection import reprice as reprice_all
from ledger.models import AuditEntry, RepriceRequest, Run, Workspace
from ledger.tenancy import repricing
from tests.browser import data

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/prices/"
SET = PAGE + "set/"
REMOVE = PAGE + "remove/"
REPRICE = PAGE + "reprice/"


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _overrides() -> dict[str, Any]:
    return Workspace.objects.get(tenant__slug="acme", slug="support").price_overrides


def test_an_admin_sees_the_shipped_rates_in_force(admin: Any) -> None:
    html = as_user(admin).get(PAGE).content.decode()
    shipped = load_default_prices()
    for key in shipped.rates:
        assert f'<tr class="price" data-model="{key}">' in html
    row = html.split('data-model="openai/gpt-4o">')[1].split("</tr>")[0]
    assert ">2.5<" in row and ">1.25<" in row and ">10<" in row and "the table" in row
    assert 'id="no-overrides"' in html and shipped.version in html
    assert 'id="settings-nav-prices" href="/w/acme/support/settings/prices/" aria-current="page"' in html


def test_the_screen_is_for_admins_and_a_404_for_another_tenant(
    admin: Any, approver: Any, viewer: Any, outsider: Any, client: Client
) -> None:
    override = {"key": "openai/gpt-4o", "output": "5"}
    for member in (approver, viewer):
        c = as_user(member)
        refused = c.get(PAGE)
        assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.content.decode()
        assert c.post(SET, override).status_code == 403
        assert c.post(REMOVE, {"key": "openai/gpt-4o"}).status_code == 403
        refused = c.post(REPRICE)
        assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.content.decode()
    c = as_user(outsider)
    assert c.get(PAGE).status_code == 404
    assert c.post(SET, override).status_code == 404
    assert c.post(REMOVE, {"key": "openai/gpt-4o"}).status_code == 404
    assert c.post(REPRICE).status_code == 404
    assert client.get(PAGE).status_code == 302
    assert client.post(REPRICE).status_code == 302
    assert not RepriceRequest.objects.exists()
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()


def test_an_override_is_saved_audited_and_the_page_says_what_reprices_the_past(admin: Any) -> None:
    c = as_user(admin)
    saved = c.post(SET, {"key": " OpenAI/GPT-4o ", "output": "5", "reason": "our negotiated rate"})
    assert saved.status_code == 302
    assert saved["Location"] == PAGE + "?saved=openai%2Fgpt-4o#prices-changed"
    assert _overrides() == {"openai/gpt-4o": {"output": 5}}
    entry = AuditEntry.objects.get(action="price_overrides.changed")
    assert (entry.actor, entry.target, entry.reason, entry.details) == (
        "alice",
        "workspace:acme/support",
        "our negotiated rate",
        {"model": "openai/gpt-4o", "before": None, "after": {"output": 5}},
    )
    html = c.get(saved["Location"]).content.decode()
    assert 'id="prices-changed"' in html and "reprice this workspace's recorded costs</a>" in html
    row = html.split('<tr class="price" data-model="openai/gpt-4o" data-overridden="1">')[1].split("</tr>")[0]
    assert ">2.5<" in row and ">1.25<" in row and ">5<" in row and "overridden here" in row
    assert "+ws." in html.split('id="price-table-version">')[1].split("<")[0]

    # Edit: the form comes back filled with the override as stored; a new rate replaces it.
    edit = c.get(PAGE + "?model=openai/gpt-4o").content.decode()
    assert 'name="key" value="openai/gpt-4o"' in edit and 'name="output" value="5"' in edit
    c.post(SET, {"key": "openai/gpt-4o", "output": "4.5", "no_cache_rate": "1"})
    assert _overrides() == {"openai/gpt-4o": {"output": 4.5, "cachedInput": None}}
    # The same again changes and audits nothing.
    c.post(SET, {"key": "openai/gpt-4o", "output": "4.50", "no_cache_rate": "1"})
    assert AuditEntry.objects.filter(action="price_overrides.changed").count() == 2

    removed = c.post(REMOVE, {"key": "openai/gpt-4o"})
    assert removed.status_code == 302 and "removed=openai%2Fgpt-4o" in removed["Location"]
    assert _overrides() == {}
    last = AuditEntry.objects.filter(action="price_overrides.changed").order_by("-at", "-pk").first()
    assert last is not None and last.details["after"] is None
    assert "was removed" in c.get(removed["Location"]).content.decode()


def test_a_model_the_table_does_not_know_is_priced_from_then_on(admin: Any, workspace: Workspace) -> None:
    data.priced_run(workspace, "run_before", "acme", "house-model")
    assert Run.objects.get(run_id="run_before").cost_usd is None
    c = as_user(admin)
    assert c.post(SET, {"key": "acme/house-model", "input": "1", "output": "2"}).status_code == 302
    workspace.refresh_from_db()  # as the next request reads it
    data.priced_run(workspace, "run_after", "acme", "house-model")
    assert Run.objects.get(run_id="run_after").cost_usd == Decimal("0.0018")  # 1,200 in at $1/M, 300 out at $2/M
    assert Run.objects.get(run_id="run_before").cost_usd is None  # until ledger reprice
    html = c.get(PAGE).content.decode()
    assert "this workspace only" in html and "not priced by the table" in html


@pytest.mark.parametrize(
    "form, field, message",
    [
        ({"key": "gpt-4o", "input": "1", "output": "1"}, "key", "is not &#x27;provider/modelId&#x27;"),
        ({"key": "", "output": "1"}, "key", "Name the model as provider/modelId"),
        ({"key": "acme/new", "input": "1"}, "output", "adds a model, so needs input and output"),
        ({"key": "openai/gpt-4o", "input": "cheap"}, "input", "must be a number, got &#x27;cheap&#x27;"),
        ({"key": "openai/gpt-4o", "output": "-1"}, "output", "must be finite and not negative"),
        ({"key": "openai/gpt-4o", "input": "1e999"}, "input", "must be finite and not negative"),
        ({"key": "openai/gpt-4o", "cachedInput": "1", "no_cache_rate": "1"}, "cachedInput", "not both"),
        ({"key": "openai/gpt-4o"}, "entry", "give at least one rate"),
        # Known to our table, not to Little Workflow's registry, which prices this workspace's imported runs.
        ({"key": "openai/gpt-4o-2024-05-13", "output": "20"}, "input", "not in Little Workflow&#x27;s registry"),
    ],
)
def test_a_refused_override_says_why_next_to_its_field_and_keeps_what_was_typed(
    admin: Any, form: dict[str, str], field: str, message: str
) -> None:
    answer = as_user(admin).post(SET, {**form, "reason": "trying"})
    assert answer.status_code == 400
    html = answer.content.decode()
    error_id = "price-entry-error" if field == "entry" else f"price-{field}-error"
    assert message in html.split(f'id="{error_id}">')[1].split("</")[0]
    assert 'name="reason" value="trying"' in html
    for name, value in form.items():
        if name != "no_cache_rate":
            assert f'name="{name}" value="{value}"' in html
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()


def test_a_model_name_with_a_bidi_override_is_refused_by_its_field(admin: Any) -> None:
    answer = as_user(admin).post(SET, {"key": "acme/\u202eesuoh", "input": "1", "output": "2", "reason": "r"})
    assert answer.status_code == 400
    html = answer.content.decode()
    assert "no spaces, control or invisible characters: this one has U+202E" in html.split('id="price-key-error">')[1]
    assert _overrides() == {}


def test_overrides_stored_before_they_were_checked_are_shown_and_can_be_removed(
    admin: Any, workspace: Workspace
) -> None:
    Workspace.objects.filter(pk=workspace.pk).update(price_overrides={"openai/gpt-x": {"inputPerMillion": "1.5"}})
    c = as_user(admin)
    page = c.get(PAGE)
    assert page.status_code == 200 and 'id="prices-problem"' in page.content.decode()
    assert c.post(REMOVE, {"key": "openai/gpt-x"}).status_code == 302
    assert _overrides() == {}
    assert 'id="prices-problem"' not in c.get(PAGE).content.decode()


def _drain() -> None:
    """What `ledger worker` does with the reprice tasks on the queue, in this test's transaction."""
    while (result := DBTaskResult.objects.ready().filter(queue_name=repricing.QUEUE).first()) is not None:
        result.claim("test-worker")
        result.set_successful(result.task.call(*result.task_result.args, **result.task_result.kwargs))


def _state(html: str) -> str:
    return html.split('id="reprice-state"')[1].split("</div>")[0]


def test_an_admin_reprices_the_workspace_from_the_page_and_the_worker_does_it(
    admin: Any, workspace: Workspace, other_workspace: Workspace
) -> None:
    data.priced_run(workspace, "run_a", "openai", "gpt-4o")  # 1,200 in, 300 out: $0.006
    data.priced_run(workspace, "run_b", "acme", "house-model")  # unpriced
    data.priced_run(other_workspace, "run_x", "openai", "gpt-4o")
    c = as_user(admin)
    html = c.get(PAGE).content.decode()
    assert "No reprice asked for from this page yet" in _state(html) and 'id="reprice-button"' in html
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "1", "output": "1"}).status_code == 302
    assert c.post(SET, {"key": "acme/house-model", "input": "1", "output": "2"}).status_code == 302

    asked = c.post(REPRICE)
    assert asked.status_code == 302 and asked["Location"] == PAGE + "?repricing=1#reprice"
    html = c.get(asked["Location"]).content.decode()
    assert "Reprice queued" in _state(html) and "alice" in _state(html) and 'id="reprice-button"' not in html
    entry = AuditEntry.objects.get(action="prices.reprice_requested")
    assert (entry.actor, entry.target) == ("alice", "acme/support")
    assert list(entry.details) == ["requestedAt"]  # no row id: it would count every tenant's requests
    # A second click while it is queued says so, and queues nothing.
    again = c.post(REPRICE)
    assert again.status_code == 409
    assert "already queued or running" in again.content.decode().split('id="reprice-refused">')[1]
    assert RepriceRequest.objects.count() == 1

    _drain()
    assert Run.objects.get(workspace=workspace, run_id="run_a").cost_usd == Decimal("0.0015")
    assert Run.objects.get(workspace=workspace, run_id="run_b").cost_usd == Decimal("0.0018")
    assert Run.objects.get(run_id="run_x").cost_usd == Decimal("0.006")  # another workspace's: untouched
    html = c.get(PAGE).content.decode()
    assert 'data-status="done"' in html and 'id="reprice-button"' in html
    assert "2 runs, 2 with new prices, 2 cost entries changed" in _state(html)
    done = AuditEntry.objects.get(action="prices.repriced")
    assert (done.actor, done.target) == ("system:reprice", "acme/support")
    assert done.details == {
        "requestedAt": entry.details["requestedAt"],
        "requestedBy": "alice",
        "runs": 2,
        "runsChanged": 2,
        "entriesChanged": 2,
    }
    # Again: harmless, nothing changes.
    assert c.post(REPRICE).status_code == 302
    _drain()
    assert "2 runs, 0 with new prices, 0 cost entries changed" in _state(c.get(PAGE).content.decode())
    assert reprice_all(Run.objects.filter(workspace=workspace))[1] == 0


def test_a_long_reprice_goes_in_bounded_tasks_and_a_lost_one_is_queued_again(
    admin: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import timedelta

    from ledger import clock

    for n in range(5):
        data.priced_run(workspace, f"run_{n}", "openai", "gpt-4o")
    workspace.price_overrides = {"openai/gpt-4o": {"input": 1, "output": 1}}
    workspace.save()
    monkeypatch.setattr(repricing, "RUNS_PER_TASK", 2)
    request = repricing.request_reprice(workspace=workspace, by=admin)
    assert repricing.reprice_workspace.call(request.pk) == "2 run(s), more to come"
    request.refresh_from_db()
    assert (request.status, request.runs, request.entries_changed) == ("running", 2, 2)
    # Its next task was lost with the worker: the sweep queues it again once it has stood still.
    assert repricing.recover_stalled() == []
    with clock.backdated(clock.now() + repricing.STALLED_AFTER + timedelta(seconds=1)):
        assert repricing.recover_stalled() == ["acme/support"]
    # The tasks on the queue (the lost one too, and the one the sweep queued) take it up where it stands.
    _drain()
    request.refresh_from_db()
    assert (request.status, request.runs, request.runs_changed, request.entries_changed) == ("done", 5, 5, 5)
    assert AuditEntry.objects.filter(action="prices.repriced").count() == 1
    assert {r.cost_usd for r in Run.objects.filter(workspace=workspace)} == {Decimal("0.0015")}


def _api(workspace: Workspace) -> Any:
    from ledger.tenancy.services import create_key
    from tests.conftest import http_client

    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    return http_client(headers={"Authorization": f"Bearer {key}"})


def _gpt_4o_call(run_id: str) -> list[dict[str, Any]]:
    return [
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_prices", "input": {}}},
        {
            "type": "harness.model.responded",
            "payload": {
                "callId": "c1",
                "stepPath": "s",
                "turn": 1,
                "model": {"provider": "openai", "modelId": "gpt-4o"},
                "response": {"text": "hi", "usage": {"inputTokens": 1_000_000, "outputTokens": 1_000_000}},
            },
        },
    ]


@pytest.mark.parametrize("rate", ["1e300", "1e308", "1000000.01", "5000000"])
def test_a_rate_whose_costs_the_columns_cannot_hold_is_refused_by_its_field(admin: Any, rate: str) -> None:
    answer = as_user(admin).post(SET, {"key": "openai/gpt-4o", "input": rate, "output": "1", "reason": "huge"})
    assert answer.status_code == 400
    html = answer.content.decode()
    assert "must be at most 1,000,000 USD per 1M tokens" in html.split('id="price-input-error">')[1].split("</")[0]
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()


@pytest.mark.django_db(transaction=True)  # the API's requests end their connections
def test_the_highest_rate_allowed_prices_a_call_the_columns_hold(admin: Any, workspace: Workspace) -> None:
    c = as_user(admin)
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "1000000", "output": "1000000"}).status_code == 302
    with _api(workspace) as api:
        answer = api.post("/api/v1/runs/run_dear/events", json={"events": _gpt_4o_call("run_dear")})
        assert answer.status_code == 200, answer.text
        assert Decimal(api.get("/api/v1/runs/run_dear").json()["usage"]["costUsd"]) == Decimal(2_000_000)


@pytest.mark.parametrize(
    "stored",
    [
        {"openai/gpt-4o": {"input": 1e300, "output": 1e300}},  # written before the bound
        {"openai/gpt-4o": {"input": "cheap"}, "acme/house": {"input": 1, "output": 2}},  # by hand
        ["not", "an", "object"],
    ],
)
@pytest.mark.django_db(transaction=True)
def test_an_override_stored_out_of_bounds_is_left_out_not_a_failed_append(
    admin: Any, workspace: Workspace, stored: Any
) -> None:
    from tests.conftest import ledger_cli

    Workspace.objects.filter(pk=workspace.pk).update(price_overrides=stored)
    with _api(workspace) as api:
        answer = api.post("/api/v1/runs/run_huge/events", json={"events": _gpt_4o_call("run_huge")})
        assert answer.status_code == 200, answer.text
        # Priced at the shipped rates, as if gpt-4o had no override: $2.50 + $10 for 1M tokens each.
        assert Decimal(api.get("/api/v1/runs/run_huge").json()["usage"]["costUsd"]) == Decimal("12.5")
    html = as_user(admin).get(PAGE).content.decode()
    problem = html.split('id="prices-problem">')[1].split("</div>")[0]
    assert "priced without them" in problem
    code, out = ledger_cli("verify")
    assert code == 1 and "FAIL acme/support price_overrides:" in out and "is left out of the prices" in out
    assert out.count("FAIL") == 1  # the run itself is what the fold says
    if isinstance(stored, dict) and "acme/house" in stored:  # the good override beside the bad one holds
        row = html.split('data-model="acme/house">')[1].split("</tr>")[0]
        assert ">1<" in row and ">2<" in row


@pytest.mark.parametrize(
    "key, says",
    [
        (" openai / gpt ", "this one has a space"),
        ("openai/gpt\u202e-4o", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
        ("openai/gpt\u200b4o", "U+200B (ZERO WIDTH SPACE)"),
        ("openai/gpt\x074o", "U+0007"),
        ("openai/", "is not &#x27;provider/modelId&#x27;"),
        ("/gpt-4o", "is not &#x27;provider/modelId&#x27;"),
    ],
)
def test_a_model_name_with_spaces_or_invisible_characters_is_refused_by_its_field(
    admin: Any, key: str, says: str
) -> None:
    answer = as_user(admin).post(SET, {"key": key, "input": "1", "output": "1"})
    assert answer.status_code == 400
    assert says in answer.content.decode().split('id="price-key-error">')[1].split("</")[0]
    assert _overrides() == {}


def test_a_reason_over_its_limit_is_refused_by_its_field_not_cut(admin: Any) -> None:
    answer = as_user(admin).post(SET, {"key": "openai/gpt-4o", "output": "5", "reason": "x" * 2001})
    assert answer.status_code == 400
    assert "at most 2000 characters" in answer.content.decode().split('id="price-reason-error">')[1].split("</")[0]
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()
    assert as_user(admin).post(SET, {"key": "openai/gpt-4o", "output": "5", "reason": "x" * 2000}).status_code == 302
    assert len(AuditEntry.objects.get(action="price_overrides.changed").reason) == 2000


def test_a_reprice_that_fails_on_a_run_fails_its_request_audited_and_another_may_be_asked(
    admin: Any, workspace: Workspace
) -> None:
    from datetime import timedelta

    from ledger import clock

    c = as_user(admin)
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "0.0001"}).status_code == 302
    data.priced_run(workspace, "run_a", "openai", "gpt-4o")
    # Eleven calls of 10^11 input tokens, the most a call may count: $10 each at $0.0001 per 1M;
    # at the highest rate allowed $10^11 each, $1.1 * 10^12 for the run, which its cost column
    # (numeric(24,12)) does not hold.
    data.append(workspace, "run_big", data.started(label="big"), *data.step("answer"))
    for turn in range(1, 12):
        data.append(workspace, "run_big", *data.model_call("answer", turn, "openai", "gpt-4o", (10**11, 0)))
    assert Run.objects.get(run_id="run_big").cost_usd == Decimal(110)
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "1000000"}).status_code == 302
    assert c.post(REPRICE).status_code == 302
    _drain()
    request = RepriceRequest.objects.get()
    assert request.status == "failed" and request.runs == 1 and request.entries_changed == 1
    assert request.failure.startswith("run run_big could not be repriced: ")
    assert Run.objects.get(run_id="run_a").cost_usd == Decimal("1200.003")  # the run before it: repriced
    failed = AuditEntry.objects.get(action="prices.reprice_failed")
    assert (failed.actor, failed.target) == ("system:reprice", "acme/support")
    assert failed.details["failure"] == request.failure and failed.details["runs"] == 1
    assert not AuditEntry.objects.filter(action="prices.repriced").exists()
    html = c.get(PAGE).content.decode()
    assert 'data-status="failed"' in html and "run run_big could not be repriced" in _state(html)
    assert 'id="reprice-button"' in html  # no longer open: the page offers another
    # Not open, so the sweep leaves it, however long it stands.
    with clock.backdated(clock.now() + repricing.STALLED_AFTER + timedelta(seconds=1)):
        assert repricing.recover_stalled() == []
    # The cause fixed, a new request goes through.
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "0.01"}).status_code == 302
    assert c.post(REPRICE).status_code == 302
    _drain()
    assert RepriceRequest.objects.order_by("-pk").first().status == "done"  # type: ignore[union-attr]
    assert Run.objects.get(run_id="run_big").cost_usd == Decimal(11_000)


def test_a_price_change_while_a_reprice_runs_sends_it_over_the_runs_again(
    admin: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import ledger_cli

    for n in range(4):
        data.priced_run(workspace, f"run_{n}", "openai", "gpt-4o")
    c = as_user(admin)
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "1", "output": "1"}).status_code == 302
    monkeypatch.setattr(repricing, "RUNS_PER_TASK", 2)
    assert c.post(REPRICE).status_code == 302
    request = RepriceRequest.objects.get()
    assert repricing.reprice_workspace.call(request.pk) == "2 run(s), more to come"  # at $1 and $1
    # The prices change under it: the two runs it went over would keep the older table.
    assert c.post(SET, {"key": "openai/gpt-4o", "input": "2", "output": "2"}).status_code == 302
    request.refresh_from_db()
    assert (request.status, request.after_run_pk, request.runs, request.restarts) == ("running", 0, 0, 1)
    _drain()
    request.refresh_from_db()
    assert (request.status, request.runs, request.runs_changed, request.entries_changed) == ("done", 4, 6, 6)
    # Every run at the table in force now: 1,200 + 300 tokens at $2 per 1M.
    assert {r.cost_usd for r in Run.objects.filter(workspace=workspace)} == {Decimal("0.003")}
    done = AuditEntry.objects.get(action="prices.repriced")
    assert done.details["restarts"] == 1 and done.details["runs"] == 4
    assert ledger_cli("verify")[0] == 0
