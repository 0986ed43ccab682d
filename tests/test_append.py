"""The one write path: sequences, idempotency, atomic batches, lifecycle, validation."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from ledger import errors, log
from ledger.canonical import canonical_json, event_id
from ledger.log import append
from ledger.log.announce import group_for
from ledger.log.verify import verify_run
from ledger.models import Event, Run
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db


def stored(run_id: str) -> list[tuple[int, str]]:
    return list(Event.objects.filter(run__run_id=run_id).order_by("sequence").values_list("sequence", "type"))


def test_appends_get_dense_sequences_and_reproducible_ids(append) -> None:
    first = append("run_a", started())
    second = append("run_a", ev("StepScheduled", stepPath="s1"), ev("StepScheduled", stepPath="s2"))
    assert [e["sequence"] for e in first.events + second.events] == [1, 2, 3]
    assert second.last_sequence == 3
    env = second.events[0]
    assert env["eventId"] == event_id(run_id="run_a", sequence=2, type="StepScheduled", payload={"stepPath": "s1"})
    assert list(env) == ["eventId", "runId", "sequence", "type", "recordedAt", "payload", "replayed"]
    assert env["recordedAt"].endswith("Z") and len(env["recordedAt"]) == 24


def test_vector_log_appends_with_the_vector_ids(workspace) -> None:
    vectors = json.loads(open("tests/data/vectors.json").read())["events"]
    log = [v for v in vectors if v["runId"] == "run_order"]
    result = append(
        workspace=workspace, run_id="run_order", events=[{"type": v["type"], "payload": v["payload"]} for v in log]
    )
    assert [e["eventId"] for e in result.events] == [v["eventId"] for v in log]


def test_occurrence_id_is_hashed_and_returned(append) -> None:
    append("run_a", started())
    env = append("run_a", {**ev("StepScheduled", stepPath="x"), "occurrenceId": "occ_1"}).events[0]
    assert env["occurrenceId"] == "occ_1"
    assert env["eventId"] == event_id(
        run_id="run_a", sequence=2, type="StepScheduled", payload={"stepPath": "x"}, occurrence_id="occ_1"
    )


def test_same_key_same_payload_returns_the_original_and_writes_nothing(append) -> None:
    append("run_a", started())
    original = append("run_a", {**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"}).events[0]
    append("run_a", ev("StepScheduled", stepPath="t"))
    again = append("run_a", {**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"})
    assert again.events[0]["replayed"] is True
    assert {k: v for k, v in again.events[0].items() if k != "replayed"} == {
        k: v for k, v in original.items() if k != "replayed"
    }
    assert again.last_sequence == 3
    assert Event.objects.filter(run__run_id="run_a").count() == 3


def test_retried_batch_with_stale_expected_sequence_still_replays(append) -> None:
    append("run_a", started())
    batch = [{**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"}]
    append("run_a", *batch, expected_sequence=1)
    append("run_a", ev("StepScheduled", stepPath="t"))
    assert append("run_a", *batch, expected_sequence=1).events[0]["replayed"] is True


def test_same_key_other_payload_is_conflict(append) -> None:
    append("run_a", started())
    append("run_a", {**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"})
    with pytest.raises(errors.IdempotencyConflict):
        append("run_a", {**ev("StepScheduled", stepPath="other"), "idempotencyKey": "k1"})
    assert stored("run_a") == [(1, "RunStarted"), (2, "StepScheduled")]


def test_same_key_twice_in_one_batch(append) -> None:
    append("run_a", started())
    item = {**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"}
    result = append("run_a", item, item)
    assert [e["replayed"] for e in result.events] == [False, True]
    assert result.events[0]["sequence"] == result.events[1]["sequence"] == 2
    with pytest.raises(errors.IdempotencyConflict):
        append(
            "run_a", {**item, "idempotencyKey": "k2"}, {**item, "payload": {"stepPath": "z"}, "idempotencyKey": "k2"}
        )


def test_failing_event_leaves_log_unchanged_and_consumes_no_sequence(append) -> None:
    append("run_a", started())
    with pytest.raises(errors.InvalidEvent) as exc:
        append("run_a", ev("StepScheduled", stepPath="ok"), ev("StepScheduled", stepPath=7))
    assert exc.value.details == {"index": 1, "field": "payload.stepPath"}
    assert stored("run_a") == [(1, "RunStarted")]
    assert append("run_a", ev("StepScheduled", stepPath="next")).events[0]["sequence"] == 2
    assert Run.objects.get(run_id="run_a").last_sequence == 2


def test_conflict_in_the_middle_of_a_batch_rolls_back_everything(append) -> None:
    append("run_a", started(), {**ev("StepScheduled", stepPath="s"), "idempotencyKey": "k1"})
    with pytest.raises(errors.IdempotencyConflict):
        append(
            "run_a",
            ev("StepScheduled", stepPath="new"),
            {**ev("StepScheduled", stepPath="changed"), "idempotencyKey": "k1"},
        )
    assert len(stored("run_a")) == 2


def test_expected_sequence_mismatch_is_a_conflict_with_details(append) -> None:
    append("run_a", started(), ev("StepScheduled", stepPath="s"))
    with pytest.raises(errors.SequenceConflict) as exc:
        append("run_a", ev("StepScheduled", stepPath="t"), expected_sequence=1)
    assert exc.value.details == {"expected": 1, "actual": 2}
    assert append("run_a", ev("StepScheduled", stepPath="t"), expected_sequence=2).last_sequence == 3


def test_first_event_must_be_run_started(append) -> None:
    with pytest.raises(errors.RunNotStarted):
        append("run_new", ev("StepScheduled", stepPath="s"))
    assert not Run.objects.filter(run_id="run_new").exists()


def test_run_started_twice_is_refused(append) -> None:
    append("run_a", started())
    with pytest.raises(errors.RunAlreadyStarted):
        append("run_a", started())


def test_nothing_but_custom_events_after_the_run_finished(append) -> None:
    append("run_a", started(), ev("RunCompleted", output={"ok": True}))
    with pytest.raises(errors.RunFinished):
        append("run_a", ev("StepScheduled", stepPath="late"))
    assert append("run_a", ev("custom.note", text="post-mortem")).last_sequence == 3
    assert Run.objects.get(run_id="run_a").status == "completed"


def test_a_model_call_marked_late_is_taken_after_the_run_finished_and_counted(append, workspace) -> None:
    """A model call the OTLP receiver reports after its run ended (docs/otlp.md "Late spans") is
    logged and counted; the run keeps its status and end. Unmarked, marked other than `true`, or
    written by any other writer (`POST …/events`: docs/api.md's run_finished), it is refused."""
    append("run_a", started(), ev("RunCompleted", occurredAt="2026-12-05T10:00:00Z"))
    answer = {
        "turn": 1,
        "callId": "c1",
        "model": {"provider": "openai", "modelId": "gpt-4o"},
        "response": {"usage": {"inputTokens": 1000, "outputTokens": 100}},
    }
    called = ev("harness.model.called", turn=1, callId="c1", promptHash="sha256:x", request={}, late=True)

    def receiver(*events: dict[str, Any]) -> int:
        with transaction.atomic():
            return log.holding(workspace=workspace, run_id="run_a").append(events, late_calls=True).last_sequence

    for late in ({}, {"late": "yes"}, {"late": False}):
        with pytest.raises(errors.RunFinished):
            receiver(ev("harness.model.responded", **answer, **late))
    with pytest.raises(errors.RunFinished):
        receiver(ev("StepScheduled", stepPath="s", late=True))
    with pytest.raises(errors.RunFinished):
        append("run_a", called, ev("harness.model.responded", **answer, late=True))
    assert receiver(called, ev("harness.model.responded", **answer, late=True)) == 4
    run = Run.objects.get(run_id="run_a")
    assert (run.status, run.finished_at.isoformat()) == ("completed", "2026-12-05T10:00:00+00:00")
    assert (run.input_tokens, run.output_tokens, run.priced_calls) == (1000, 100, 1)
    assert all(check.status == "pass" for check in verify_run(run)), verify_run(run)


@pytest.mark.parametrize("run_id", ["run_", "run/../x", "task_1", "run_" + "a" * 81, "run_ok!", 5])
def test_invalid_run_ids(append, run_id) -> None:
    with pytest.raises(errors.InvalidRunId):
        append(run_id, started())


def test_unknown_type_is_refused_and_custom_is_accepted(append) -> None:
    append("run_a", started())
    with pytest.raises(errors.UnknownEventType):
        append("run_a", ev("StepExploded", stepPath="s"))
    assert append("run_a", ev("custom.anything", whatever=[1, 2])).events[0]["payload"] == {"whatever": [1, 2]}


def test_cost_in_recorded_usage_is_refused(append) -> None:
    append("run_a", started())
    responded = ev(
        "harness.model.responded",
        turn=1,
        callId="c1",
        model={"provider": "openai", "modelId": "gpt-4o"},
        response={"usage": {"inputTokens": 10, "outputTokens": 2, "costUsd": 0.5}},
    )
    with pytest.raises(errors.CostNotAllowed) as exc:
        append("run_a", responded)
    assert exc.value.details["field"] == "payload.response.usage.costUsd"
    with pytest.raises(errors.CostNotAllowed):
        append("run_a", ev("harness.session.completed", usage={"costUsd": 1}))


@pytest.mark.parametrize(
    "item, field",
    [
        ({"type": "RunStarted", "payload": {}}, "payload.workflowVersionId"),
        ({"type": "RunStarted", "payload": {"workflowVersionId": True}}, "payload.workflowVersionId"),
        ({"type": "RunStarted", "payload": []}, "payload"),
        ({"type": "", "payload": {}}, "type"),
        ({"type": "RunStarted", "payload": {"workflowVersionId": "w", "x": float("nan")}}, "payload"),
        ({"type": "RunStarted", "payload": {"workflowVersionId": "w"}, "idempotencyKey": 3}, "idempotencyKey"),
    ],
)
def test_invalid_events_name_the_field(append, item, field) -> None:
    with pytest.raises(errors.InvalidEvent) as exc:
        append("run_a", item)
    assert exc.value.details["field"] == field
    assert not Run.objects.filter(run_id="run_a").exists()


def test_nested_required_fields_are_checked(append) -> None:
    append("run_a", started())
    with pytest.raises(errors.InvalidEvent) as exc:
        append(
            "run_a",
            ev("harness.model.responded", turn=1, callId="c", model={"provider": "openai"}, response={"usage": {}}),
        )
    assert exc.value.details["field"] == "payload.model.modelId"


def test_unlisted_fields_are_kept_untouched(append) -> None:
    append("run_a", started())
    payload = {"stepPath": "s", "stepId": "id", "uses": "ai.generate", "nested": {"deep": [1, {"a": None}]}}
    assert append("run_a", ev("StepScheduled", **payload)).events[0]["payload"] == payload


def test_redacted_keys_never_reach_the_database(append) -> None:
    append(
        "run_a",
        started(
            config={"apiKey": "sk-live-1", "nested": [{"Set-Cookie": "sid=1", "client_secret": "cs"}]},
            usage={"inputTokens": 5},
            leaseToken="keep-me",
        ),
    )
    raw = Event.objects.get(run__run_id="run_a", sequence=1).payload
    for secret in ("sk-live-1", "sid=1", 'cs"'):
        assert secret not in raw
    assert '"leaseToken":"keep-me"' in raw and '"inputTokens":5' in raw
    assert json.loads(raw)["config"]["nested"][0] == {"Set-Cookie": "[REDACTED]", "client_secret": "[REDACTED]"}


def test_workspace_redaction_rules_apply(workspace, append) -> None:
    workspace.redact_keys = ["customerEmail"]
    workspace.redact_value_patterns = [r"sk-[A-Za-z0-9]{8,}"]
    workspace.save()
    env = append("run_a", started(customer_email="a@b.c", note="key sk-abcdefgh123 leaked")).events[0]
    assert env["payload"]["customer_email"] == "[REDACTED]"
    assert env["payload"]["note"] == "key [REDACTED] leaked"
    assert "sk-abcdefgh123" not in Event.objects.get(run__run_id="run_a").payload


def test_idempotency_digest_is_over_the_redacted_payload(append) -> None:
    append("run_a", started())
    first = {**ev("custom.login", password="one"), "idempotencyKey": "k"}
    append("run_a", first)
    # Both redact to the same stored payload, so the retry matches rather than conflicts.
    assert append("run_a", {**ev("custom.login", password="two"), "idempotencyKey": "k"}).events[0]["replayed"]


def test_announcement_is_sent_after_commit_with_run_sequence_status_and_the_stored_batch(
    workspace, append, django_capture_on_commit_callbacks
) -> None:
    append("run_a", started())
    run = Run.objects.get(run_id="run_a")
    layer = get_channel_layer()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        append("run_a", ev("StepScheduled", stepPath="s"), ev("StepScheduled", stepPath="t"))
    assert callbacks  # nothing is announced before commit

    # In one event loop: the Redis pub/sub layer's channels live as long as the loop they were made on.
    async def heard() -> dict[str, Any]:
        channel = await layer.new_channel()
        await layer.group_add(group_for(run.pk), channel)
        for callback in callbacks:
            await sync_to_async(callback)()
        return await asyncio.wait_for(layer.receive(channel), 5)

    # The batch rides along as stored: the columns a read of the log returns (envelopes.log_rows).
    stored = [
        [e.sequence, e.event_id, e.type, e.occurrence_id, e.recorded_at, e.payload]
        for e in Event.objects.filter(run=run, sequence__gt=1).order_by("sequence")
    ]
    heard_message = async_to_sync(heard)()
    assert [event[:4] + event[5:] for event in heard_message.pop("events")] == [e[:4] + e[5:] for e in stored]
    assert heard_message == {"type": "ledger.appended", "runId": "run_a", "sequence": 3, "status": "running"}


def test_run_ids_are_per_workspace(workspace, other_workspace) -> None:
    append(workspace=workspace, run_id="run_same", events=[started()])
    append(workspace=other_workspace, run_id="run_same", events=[started(), ev("StepScheduled", stepPath="s")])
    assert Run.objects.get(workspace=workspace, run_id="run_same").last_sequence == 1
    assert Run.objects.get(workspace=other_workspace, run_id="run_same").last_sequence == 2


def test_stored_payload_is_canonical_json(append) -> None:
    append("run_a", started(b=1, a={"z": 1.0, "y": "ü"}))
    raw = Event.objects.get(run__run_id="run_a").payload
    assert raw == canonical_json(json.loads(raw)) == '{"a":{"y":"ü","z":1},"b":1,"workflowVersionId":"wfver_test"}'
