"""The log is insert-only in code and in the database."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from ledger.log.statements import held_by_constraint
from ledger.models import Event, ToolCall, ToolGatewayClaim
from tests.conftest import started

pytestmark = pytest.mark.django_db


@pytest.fixture
def event(append) -> Event:
    append("run_a", started())
    return Event.objects.get(run__run_id="run_a")


def test_event_rows_refuse_save_and_delete_in_code(event) -> None:
    event.type = "Tampered"
    with pytest.raises(TypeError):
        event.save()
    with pytest.raises(TypeError):
        event.delete()


def test_event_querysets_refuse_update_and_delete(event) -> None:
    with pytest.raises(TypeError):
        Event.objects.filter(pk=event.pk).update(type="Tampered")
    with pytest.raises(TypeError):
        Event.objects.all().delete()


def test_database_refuses_update_of_an_event(event) -> None:
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE ledger_event SET type = 'Tampered' WHERE id = %s", [event.pk])
    assert Event.objects.get(pk=event.pk).type == "RunStarted"


def test_database_refuses_deleting_a_single_event(event) -> None:
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cur:
        cur.execute("DELETE FROM ledger_event WHERE id = %s", [event.pk])
    assert Event.objects.filter(pk=event.pk).exists()


def test_database_allows_deleting_events_of_a_run_marked_for_pruning(event) -> None:
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("UPDATE ledger_run SET pruning = %s WHERE id = %s", [True, event.run_id])
        cur.execute("DELETE FROM ledger_event WHERE run_id = %s", [event.run_id])
    assert not Event.objects.filter(run_id=event.run_id).exists()


def test_database_refuses_an_event_before_sequence_one(event) -> None:
    columns = "run_id, sequence, event_id, type, recorded_at, payload"
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO ledger_event ({columns}) SELECT run_id, 0, 'x', type, recorded_at, payload "
            "FROM ledger_event WHERE id = %s",
            [event.pk],
        )
    assert Event.objects.filter(run_id=event.run_id).count() == 1


# The projections' counters carry no CHECK of their own (ledger/models.py, UsageColumns): the fold
# keeps them and `ledger verify` proves it. What stays is the log's rule and the gateway's.
HOT_TABLES = (
    "ledger_run",
    "ledger_event",
    "ledger_step",
    "ledger_toolcall",
    "ledger_costentry",
    "ledger_dailyusage",
    "ledger_toolgatewayclaim",
)
KEPT_CHECKS = {
    "ledger_run_fencing_token_check",
    "event_sequence_positive",
    "event_idempotency_key_has_digest",
    "gateway_status_known",
    "gateway_effect_known",
    "gateway_attempt_positive",
    "gateway_finished_has_time",
    "gateway_in_doubt_went_out",
}


def test_the_tables_every_append_writes_check_only_what_the_log_and_gateway_need(db) -> None:
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(
                "SELECT conname FROM pg_constraint WHERE contype = 'c' AND conrelid::regclass::text = ANY(%s)",
                [list(HOT_TABLES)],
            )
            assert {name for (name,) in cur.fetchall()} == KEPT_CHECKS
        else:  # migration 0021 leaves SQLite's tables as they were (remaking them drops their triggers)
            cur.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'ledger_event'")
            (schema,) = cur.fetchone()
            assert 'CONSTRAINT "event_sequence_positive" CHECK ("sequence" >= 1)' in schema


# Each of the gateway's checks that PostgreSQL stores in a compact form (migration 0051), and a
# change of a claimed row that breaks it.
GATEWAY_BREACHES = {
    "gateway_status_known": {"status": "lost", "finished_at": "now"},
    "gateway_effect_known": {"effect": "delete"},
    "gateway_finished_has_time": {"status": "succeeded"},
}


@pytest.mark.parametrize("name", sorted(GATEWAY_BREACHES))
def test_the_database_refuses_a_gateway_row_that_breaks_each_check(event, name) -> None:
    now = timezone.now()
    claim = ToolGatewayClaim.objects.create(
        run_id=event.run_id,
        call_id="call_1",
        tool_name="search",
        args_digest="sha256:" + "0" * 64,
        effect="read",
        owner="worker",
        lease_token="token",
        lease_expires_at=now,
        claimed_at=now,
        created_at=now,
        updated_at=now,
    )
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        breach = {field: now if value == "now" else value for field, value in GATEWAY_BREACHES[name].items()}
        ToolGatewayClaim.objects.filter(pk=claim.pk).update(**breach)
    assert name in str(refused.value)
    ToolGatewayClaim.objects.filter(pk=claim.pk).update(status="succeeded", finished_at=now)  # the same, kept
    assert ToolGatewayClaim.objects.get(pk=claim.pk).status == "succeeded"
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s", [name])
            (definition,) = cur.fetchone()
        assert "ARRAY[" not in definition and "character varying" not in definition


def test_a_second_row_for_a_tool_call_is_refused_under_the_name_the_append_guards_on(event) -> None:
    """The append's optimistic way reads the unique constraint's name to fall back to the locked
    way: a second row for a call is refused under that name (on PostgreSQL, where it is read)."""
    ToolCall.objects.create(run_id=event.run_id, call_id="call_1", position=0, status="started")
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        ToolCall.objects.create(run_id=event.run_id, call_id="call_1", position=1, status="started")
    assert held_by_constraint(refused.value) == (connection.vendor == "postgresql")
    assert list(ToolCall.objects.filter(run_id=event.run_id).values_list("position", flat=True)) == [0]
