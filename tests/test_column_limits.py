"""A payload value a projection cannot hold is a 400 `invalid_event` naming the field, on SQLite and
PostgreSQL alike, never a 500 from a varchar or integer column (ledger/log/vocabulary.py, COLUMN_LIMITS);
so is a request item's type, key or occurrence id that is not Unicode text (a lone surrogate)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import models
from django.test import Client

from ledger.clock import backdated
from ledger.log.envelopes import log_of
from ledger.log.vocabulary import COLUMN_LIMITS, INT32_MAX, MAX_TOKENS, MODEL_COLUMN_LIMITS, VOCABULARY
from ledger.models import CostEntry, DailyUsage, Event, MonthlyUsage, Run, Step, ToolCall
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

# Each limited payload field and the columns its text ends up in.
COLUMNS: dict[str, list[tuple[type[models.Model], str]]] = {
    "workflowVersionId": [
        (Run, "workflow_version_id"),
        (DailyUsage, "workflow_version_id"),
        (MonthlyUsage, "workflow_version_id"),
    ],
    "label": [(Run, "label")],
    "parentRunId": [(Run, "parent_run_id"), (Run, "root_run_id")],
    "replayOf": [(Run, "replay_of")],
    "outputRef": [(Run, "output_ref"), (Step, "output_ref")],
    "stepPath": [(Step, "step_path"), (ToolCall, "step_path"), (CostEntry, "step_path")],
    "callId": [(ToolCall, "call_id"), (CostEntry, "call_id")],
    "toolName": [(ToolCall, "tool_name")],
    "caller": [(ToolCall, "caller")],
    "model.provider": [(CostEntry, "provider"), (DailyUsage, "provider"), (MonthlyUsage, "provider")],
    "model.modelId": [(CostEntry, "model_id"), (DailyUsage, "model_id"), (MonthlyUsage, "model_id")],
}


@pytest.fixture
def api(workspace) -> Client:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _post(api: Client, run_id: str, *events: dict[str, Any]) -> Any:
    return api.post(
        f"/api/v1/runs/{run_id}/events", data=json.dumps({"events": list(events)}), content_type="application/json"
    )


def _refused(response: Any, field: str) -> None:
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "invalid_event"
    assert response.json()["error"]["details"]["field"] == field


def test_the_limits_are_the_columns_the_values_land_in() -> None:
    limits = {**COLUMN_LIMITS, **{f"model.{k}": v for k, v in MODEL_COLUMN_LIMITS.items()}}
    assert set(limits) == set(COLUMNS)
    for field, columns in COLUMNS.items():
        for model, name in columns:
            assert model._meta.get_field(name).max_length == limits[field], (field, model, name)
    assert isinstance(ToolCall._meta.get_field("turn"), models.IntegerField)
    assert not isinstance(ToolCall._meta.get_field("turn"), models.BigIntegerField)
    assert isinstance(Step._meta.get_field("visit"), models.IntegerField)
    assert not isinstance(Step._meta.get_field("visit"), models.BigIntegerField)


def _with_field(field: str, value: Any) -> list[dict[str, Any]]:
    """A run whose events put `value` in the payload field `field`, where the fold projects it."""
    model = {"provider": "openai", "modelId": "gpt-4o-mini"}
    responded = {
        "turn": 1,
        "callId": "m1",
        "stepPath": "s",
        "model": model,
        "response": {"text": "hi", "usage": {"inputTokens": 10, "outputTokens": 2}},
    }
    tool = {"callId": "t1", "caller": "model", "toolName": "lookup", "args": {}, "turn": 1, "stepPath": "s"}
    if field in ("workflowVersionId", "label", "parentRunId", "replayOf"):
        return [started(**{"workflowVersionId": "wf", field: value}), ev("harness.model.responded", **responded)]
    if field == "outputRef":
        return [started(), ev("StepCompleted", stepPath="s", attempt=1, outputRef=value)]
    if field in ("callId", "toolName", "caller", "stepPath"):
        return [
            started(),
            ev("harness.tool_call.started", **{**tool, field: value}),
            ev(
                "harness.model.responded",
                **{**responded, **({field: value} if field in ("callId", "stepPath") else {})},
            ),
        ]
    leaf = field.removeprefix("model.")
    return [started(), ev("harness.model.responded", **{**responded, "model": {**model, leaf: value}})]


@pytest.mark.parametrize("field", sorted(COLUMNS))
def test_a_value_at_its_columns_limit_is_stored_and_one_longer_is_refused(api: Client, field: str) -> None:
    limit = COLUMNS[field][0][0]._meta.get_field(COLUMNS[field][0][1]).max_length
    fits = "run_" + "a" * (limit - 4) if field == "parentRunId" else "r" * limit
    response = _post(api, "run_fits", *_with_field(field, fits))
    assert response.status_code == 200, response.content[:300]
    too_long = _post(api, "run_too_long", *_with_field(field, fits + "x"))
    _refused(too_long, f"payload.{field}")
    assert not Run.objects.filter(run_id="run_too_long").exists()
    assert not Event.objects.filter(run__run_id="run_too_long").exists()


def test_a_turn_or_visit_past_32_bits_is_refused_and_the_largest_is_stored(api: Client, append) -> None:
    append("run_t", started())
    tool = {"callId": "t1", "caller": "model", "toolName": "lookup", "args": {}}
    _refused(_post(api, "run_t", ev("harness.tool_call.started", **tool, turn=INT32_MAX + 1)), "payload.turn")
    _refused(
        _post(api, "run_t", ev("harness.model.called", turn=-INT32_MAX - 2, promptHash="h", request={})), "payload.turn"
    )
    _refused(_post(api, "run_t", ev("StepScheduled", stepPath=f"loop.visit[{INT32_MAX + 1}]")), "payload.stepPath")
    assert [e["type"] for e in log_of(Run.objects.get(run_id="run_t"))] == ["RunStarted"]
    stored = _post(
        api,
        "run_t",
        ev("harness.tool_call.started", **tool, turn=INT32_MAX),
        ev("StepScheduled", stepPath=f"loop.visit[{INT32_MAX}]"),
    )
    assert stored.status_code == 200, stored.content[:300]
    assert ToolCall.objects.get(run__run_id="run_t", call_id="t1").turn == INT32_MAX
    assert Step.objects.get(run__run_id="run_t", step_path=f"loop.visit[{INT32_MAX}]").visit == INT32_MAX


@pytest.mark.parametrize("field", ["type", "idempotencyKey", "occurrenceId"])
def test_a_lone_surrogate_in_a_request_item_is_refused(api: Client, append, field: str) -> None:
    append("run_s", started())
    item = {"type": "custom.note", "payload": {}, field: "custom.x\ud800" if field == "type" else "k\ud800"}
    # json.dumps writes the lone surrogate as the \ud800 escape a client's JSON would carry.
    response = api.post(
        "/api/v1/runs/run_s/events", data=json.dumps({"events": [item]}), content_type="application/json"
    )
    _refused(response, field)
    assert len(log_of(Run.objects.get(run_id="run_s"))) == 1


def _valid_payload(event_type: str) -> dict[str, Any]:
    """The smallest payload VOCABULARY accepts for `event_type`: every listed field, of its type."""
    samples = {(str,): "x", (int,): 1, (int, float): 1, (dict,): {}, (list,): [], (list, dict): [], (object,): {}}
    payload: dict[str, Any] = {}
    for field, (kinds, _) in sorted(VOCABULARY[event_type].items()):
        parent, _, leaf = field.rpartition(".")
        holder = payload.setdefault(parent, {}) if parent else payload
        if leaf not in holder:
            holder[leaf] = copy.deepcopy(samples[kinds])
    return payload


def test_no_text_field_of_the_vocabulary_makes_a_500_at_any_length(api: Client, append) -> None:
    """Every text field the vocabulary lists, and every limited one in every event type, 10,000
    characters long in an otherwise valid event: stored or refused, never a server error."""
    long = "z" * 10_000
    fields = {(t, f) for t, spec in VOCABULARY.items() for f, (kinds, _) in spec.items() if kinds == (str,)}
    fields |= {(t, f) for t in VOCABULARY for f in [*COLUMN_LIMITS, "model.provider", "model.modelId"]}
    statuses = set()
    for number, (event_type, field) in enumerate(sorted(fields)):
        run_id = f"run_long_{number}"
        if event_type != "RunStarted":
            append(run_id, started())
        payload = _valid_payload(event_type)
        parent, _, leaf = field.rpartition(".")
        holder = payload.setdefault(parent, {}) if parent else payload
        if not isinstance(holder, dict):
            payload[parent] = holder = {}
        holder[leaf] = long
        response = _post(api, run_id, {"type": event_type, "payload": payload})
        assert response.status_code < 500, (event_type, field, response.content[:300])
        statuses.add(response.status_code)
        if response.status_code == 400 and field in COLUMN_LIMITS:
            assert response.json()["error"]["details"]["field"] == f"payload.{field}", (event_type, field)
    assert statuses == {200, 400}  # some stored (unprojected fields), the projected ones refused


# --- token counts (docs/api.md "Token counts") -----------------------------------------------


def _answered(
    usage: dict[str, Any], model: str = "gpt-4o", call: str = "m1", provider: str = "openai"
) -> dict[str, Any]:
    return ev(
        "harness.model.responded",
        turn=1,
        callId=call,
        stepPath="s",
        model={"provider": provider, "modelId": model},
        response={"text": "hi", "usage": usage},
    )


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"inputTokens": 4 * 10**17, "outputTokens": 1}, "inputTokens"),
        ({"inputTokens": 10**18, "outputTokens": 1}, "inputTokens"),
        ({"inputTokens": 1, "outputTokens": 1e300}, "outputTokens"),
        ({"inputTokens": 1, "outputTokens": 1, "cachedInputTokens": MAX_TOKENS + 1}, "cachedInputTokens"),
        (
            {"inputTokens": 1, "outputTokenDetails": {"reasoningTokens": 9 * 10**18}},
            "outputTokenDetails.reasoningTokens",
        ),
    ],
)
def test_a_token_count_past_the_bound_is_refused_naming_it(
    api: Client, append, usage: dict[str, Any], field: str
) -> None:
    append("run_t", started())
    _refused(_post(api, "run_t", _answered(usage)), f"payload.response.usage.{field}")
    assert [e["type"] for e in log_of(Run.objects.get(run_id="run_t"))] == ["RunStarted"]
    assert not CostEntry.objects.exists() and not DailyUsage.objects.exists()


def test_the_largest_token_counts_are_counted_and_priced(api: Client) -> None:
    most = {"inputTokens": MAX_TOKENS, "outputTokens": MAX_TOKENS}
    response = _post(api, "run_t", started(), _answered(most, call="m1"), _answered(most, call="m2"))
    assert response.status_code == 200, response.content[:300]
    usage = api.get("/api/v1/runs/run_t").json()["usage"]
    # gpt-4o: $2.50 in, $10 out per million tokens.
    assert usage["inputTokens"] == usage["outputTokens"] == 2 * MAX_TOKENS
    assert usage["costUsd"] == 2 * (MAX_TOKENS * 2.5 + MAX_TOKENS * 10) / 1_000_000
    assert usage["pricedCalls"] == 2 and usage["unpricedCalls"] == 0


def test_huge_counts_of_an_unpriced_model_leave_the_days_usage_working(api: Client) -> None:
    """Two calls of 5e18 tokens once overflowed the day's bigint cell, and every later run of the
    model that day failed with it."""
    huge = {"inputTokens": 5 * 10**18, "outputTokens": 1}
    _refused(
        _post(api, "run_a", started(), _answered(huge, "nopriced", provider="house")),
        "payload.response.usage.inputTokens",
    )
    _refused(
        _post(api, "run_b", started(), _answered(huge, "nopriced", provider="house")),
        "payload.response.usage.inputTokens",
    )
    assert not Run.objects.exists()
    fine = _post(
        api, "run_c", started(), _answered({"inputTokens": 10, "outputTokens": 1}, "nopriced", provider="house")
    )
    assert fine.status_code == 200, fine.content[:300]
    rows = api.get("/api/v1/usage?groupBy=model").json()["rows"]
    assert [(r["key"], r["inputTokens"], r["costUsd"], r["unpricedCalls"]) for r in rows] == [
        ("house/nopriced", 10, None, 1)
    ]


def test_a_run_whose_dollars_pass_what_a_total_holds_is_refused(api: Client, workspace) -> None:
    """Counts within the bound at the highest rate a workspace may set ($1 a token): the run's cost
    would pass the twelve digits of its money columns. Refused whole, never a 500."""
    workspace.price_overrides = {"house/dear": {"input": 1_000_000, "output": 0}}
    workspace.save()
    most = {"inputTokens": MAX_TOKENS, "outputTokens": 0}
    assert _post(api, "run_d", started(), _answered(most, "dear", provider="house")).status_code == 200
    assert Run.objects.get(run_id="run_d").cost_usd == 100_000_000_000
    many = [_answered(most, "dear", call=f"m{i}", provider="house") for i in range(2, 12)]
    response = _post(api, "run_d", *many)
    _refused(response, "payload.response.usage")
    assert response.json()["error"]["details"]["index"] == 0
    assert [e["type"] for e in log_of(Run.objects.get(run_id="run_d"))] == ["RunStarted", "harness.model.responded"]


def _dearest(workspace) -> list[dict[str, Any]]:
    """Nine calls at the highest rate a workspace may set ($1 a token): $900,000,000,000, which a
    run's own columns hold."""
    workspace.price_overrides = {"house/dear": {"input": 1_000_000, "output": 0}}
    workspace.save()
    most = {"inputTokens": MAX_TOKENS, "outputTokens": 0}
    return [_answered(most, "dear", call=f"m{i}", provider="house") for i in range(9)]


def _usage_reads(api: Client, member_client: Client) -> None:
    """The usage report, API and page, still reads the cells (a float past them was a 500)."""
    rows = api.get("/api/v1/usage?groupBy=model")
    assert rows.status_code == 200 and rows.json()["rows"][0]["costUsd"] == 900_000_000_000
    assert member_client.get("/w/acme/support/usage/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_days_usage_cell_past_its_columns_is_a_refusal_never_a_500(api: Client, workspace, member) -> None:
    """Two runs of $900,000,000,000 each fit their own columns; their day's cell of that model adds
    them up past twelve digits. The column refuses the sum — PostgreSQL's by its type, SQLite's by
    its triggers (migration 0048; it kept the sum as a float, and the usage page failed) — which is
    the append's 400 with the log untouched, on both databases alike."""
    nine = _dearest(workspace)
    assert _post(api, "run_1", started(), *nine).status_code == 200
    second = _post(api, "run_2", started(), *nine)
    _refused(second, "payload.response.usage")
    assert second.json()["error"]["details"]["index"] == 1
    assert "usage totals of the day or the month" in second.json()["error"]["message"]
    assert not Run.objects.filter(run_id="run_2").exists() and not Event.objects.filter(run__run_id="run_2").exists()
    assert Run.objects.get(run_id="run_1").cost_usd == 900_000_000_000
    assert [c.cost_usd for c in DailyUsage.objects.all()] == [900_000_000_000]
    assert [c.cost_usd for c in MonthlyUsage.objects.all()] == [900_000_000_000]
    browser = Client()
    browser.force_login(member)
    _usage_reads(api, browser)


@pytest.mark.django_db(transaction=True)
def test_a_months_usage_cell_past_its_columns_is_a_refusal_too(api: Client, workspace, member) -> None:
    """Two days' cells of $900,000,000,000 each hold, their month's does not: refused alike."""
    nine = _dearest(workspace)
    with backdated(datetime(2026, 3, 10, 12, tzinfo=UTC)):
        assert _post(api, "run_1", started(), *nine).status_code == 200
    with backdated(datetime(2026, 3, 11, 12, tzinfo=UTC)):
        second = _post(api, "run_2", started(), *nine)
    _refused(second, "payload.response.usage")
    assert not Run.objects.filter(run_id="run_2").exists()
    assert [(c.day.isoformat(), c.cost_usd) for c in DailyUsage.objects.all()] == [("2026-03-10", 900_000_000_000)]
    assert [c.cost_usd for c in MonthlyUsage.objects.all()] == [900_000_000_000]
    browser = Client()
    browser.force_login(member)
    rows = api.get("/api/v1/usage?groupBy=model&from=2026-03-01&to=2026-03-31")
    assert rows.status_code == 200 and rows.json()["rows"][0]["costUsd"] == 900_000_000_000
    assert browser.get("/w/acme/support/usage/?from=2026-03-01&to=2026-03-31").status_code == 200
