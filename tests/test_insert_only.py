"""The log is insert-only in code and in the database."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from ledger.models import Event

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
