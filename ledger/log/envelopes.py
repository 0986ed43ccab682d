"""The event envelope as clients see it: {eventId, runId, sequence, type, occurrenceId?, recordedAt, payload}.

Reading a run's log is the hot read of the product (`ledger rebuild` and `ledger verify`, the
replay plan, re-execution, catch-up), so `read_envelopes` takes rows from a plain cursor, with
`recordedAt` already formatted by PostgreSQL, and decodes payloads with orjson: no ORM row, no
datetime and no stdlib JSON decoder per event.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import CharField, F, Func
from django.utils import timezone as django_timezone

from ..fold import paused_gc
from ..models import Event, Run

# A stored event as `log_rows` returns it: sequence, event id, type, occurrence id, `recordedAt`
# (the envelope's text) and the payload's canonical JSON text.
Row = tuple[int, str, str, str | None, str, str]
_UTC_OFFSET = timedelta(0)
# format_recorded_at in PostgreSQL: to_char's MS truncates to the millisecond, as `isoformat` does.
_RECORDED_AT_SQL = "to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"


def formatted_in_sql(column: str) -> Func:
    """`format_recorded_at` of a timestamp column, done by PostgreSQL (its text, or NULL): parsing
    a timestamptz into a datetime and formatting it again costs more than the rest of reading it."""
    return Func(F(column), template=_RECORDED_AT_SQL, output_field=CharField())


def format_recorded_at(moment: datetime) -> str:
    """ISO 8601, UTC, milliseconds (truncated), `Z` (Little Workflow's form).

    `isoformat` rather than `strftime`: the same text for every year a clock gives (1000–9999),
    in a third of the time.
    """
    if moment.utcoffset() != _UTC_OFFSET:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds")[:-6] + "Z"


def envelope(
    *,
    event_id: str,
    run_id: str,
    sequence: int,
    type: str,
    occurrence_id: str | None,
    recorded_at: datetime,
    payload: Any,
) -> dict[str, Any]:
    return _envelope(event_id, run_id, sequence, type, occurrence_id, format_recorded_at(recorded_at), payload)


def _envelope(
    event_id: str, run_id: str, sequence: int, type_: str, occurrence_id: str | None, recorded_at: str, payload: Any
) -> dict[str, Any]:
    env: dict[str, Any] = {"eventId": event_id, "runId": run_id, "sequence": sequence, "type": type_}
    if occurrence_id is not None:
        env["occurrenceId"] = occurrence_id
    env["recordedAt"] = recorded_at
    env["payload"] = payload
    return env


def event_envelope(event: Event, run_id: str) -> dict[str, Any]:
    return envelope(
        event_id=event.event_id,
        run_id=run_id,
        sequence=event.sequence,
        type=event.type,
        occurrence_id=event.occurrence_id,
        recorded_at=event.recorded_at,
        payload=json.loads(event.payload),
    )


def row_envelope(row: Row, run_id: str, payload: Any) -> dict[str, Any]:
    """The envelope of a `log_rows` row whose payload text decoded to `payload`."""
    sequence, event_id, type_, occurrence_id, recorded_at, _ = row
    return _envelope(event_id, run_id, sequence, type_, occurrence_id, recorded_at, payload)


def decode_payload(text: str) -> Any:
    """A stored payload, decoded.

    Stored payloads are RFC 8785 text (integers within ±2**53, no NaN, no lone surrogates), on
    which orjson and the stdlib decoder agree value for value and key order for key order;
    orjson is several times faster. Anything it refuses goes to the stdlib decoder, as before.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def log_rows(
    run: Run,
    *,
    after: int = 0,
    limit: int | None = None,
    type_prefix: str | None = None,
    sequences: Collection[int] | None = None,
) -> list[Row]:
    """The run's stored events after sequence `after`, in order, as `Row`s, through a plain cursor.

    The ORM compiles the query, so its filters mean what they mean to the ORM on every backend;
    the rows come straight from the driver. PostgreSQL formats `recordedAt` itself (Django's
    timestamptz loader is Python code, and was half the time of a read); SQLite hands back naive
    datetimes, made aware and formatted here as the ORM would.
    """
    qs = Event.objects.filter(run=run, sequence__gt=after).order_by("sequence")
    if type_prefix:
        qs = qs.filter(type__startswith=type_prefix)
    if sequences is not None:
        qs = qs.filter(sequence__in=sorted(sequences))
    if limit is not None:
        qs = qs[:limit]
    connection = connections[qs.db]
    server_formats = connection.vendor == "postgresql"
    recorded_at = formatted_in_sql("recorded_at") if server_formats else F("recorded_at")
    columns = qs.values_list("sequence", "event_id", "type", "occurrence_id", recorded_at, "payload")
    try:
        sql, params = columns.query.get_compiler(using=qs.db).as_sql()
    except EmptyResultSet:  # the ORM knows no row can match (`sequences` empty): it compiles no SQL
        return []
    with paused_gc(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[Any] = cursor.fetchall()
    if server_formats:
        return rows
    zone = connection.timezone
    return [
        (s, e, t, o, format_recorded_at(django_timezone.make_aware(at, zone) if at.tzinfo is None else at), p)
        for s, e, t, o, at, p in rows
    ]


def read_envelopes(
    run: Run,
    *,
    after: int = 0,
    limit: int | None = None,
    type_prefix: str | None = None,
    sequences: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """The run's envelopes after sequence `after`, in order (see the module docstring); with
    `sequences`, only those."""
    run_id = run.run_id
    rows = log_rows(run, after=after, limit=limit, type_prefix=type_prefix, sequences=sequences)
    with paused_gc():
        return [row_envelope(row, run_id, decode_payload(row[5])) for row in rows]


def as_stored(envelope: dict[str, Any], text: str) -> dict[str, Any]:
    """`envelope` with its payload as the log stores it, the canonical JSON `text` (RFC 8785:
    numbers in ECMAScript form, keys sorted), for orjson to write as it is: a read of the log, the
    append's answer, an export and a stream then write one event's payload byte for byte alike."""
    return {**envelope, "payload": orjson.Fragment(text)}


def read_stored_envelopes(run: Run, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
    """`read_envelopes` for a writer of JSON: each payload its stored text (`as_stored`), never
    decoded."""
    run_id = run.run_id
    return [row_envelope(row, run_id, orjson.Fragment(row[5])) for row in log_rows(run, after=after, limit=limit)]


def log_of(run: Run, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The run's envelopes, in order, straight from the log (up to sequence `upto`: a prefix;
    sequences are dense from 1, so that is the first `upto` rows)."""
    return read_envelopes(run, limit=upto)
