"""An append as one PostgreSQL statement: the run's head, its events and its projections.

Locking the head first costs a wait on the server per statement: BEGIN, SELECT … FOR UPDATE,
INSERT, UPDATE, the projection upserts, COMMIT. Here the head update is conditional and every
other write hangs off it in a data-modifying CTE, so outside a transaction an append is one
round trip and one commit, like a bare INSERT:

    WITH head AS (UPDATE ledger_run SET last_sequence = …, <changed projected columns>
                  WHERE id = … AND last_sequence = <the writer's guess> [AND <guard>]
                  RETURNING id),
         events AS (INSERT INTO ledger_event … SELECT head.id, r.* FROM head, json_to_recordset(…) r),
         steps AS (INSERT INTO ledger_step … ON CONFLICT … DO UPDATE …), the tool calls the batch
                  started (INSERT) and those it named that have a row (ON CONFLICT … DO UPDATE), cost entries,
         daily usage (ledger/log/rollup.py: added to, ON CONFLICT … DO UPDATE SET calls = calls + …)
    SELECT id FROM head

Every INSERT selects FROM head: when the condition misses (another writer moved the head, the
run is leased to someone else, an idempotency key is already in the log, the workspace's price
overrides are no longer those the writer priced the batch with), nothing is written and no row
comes back; the caller then takes the locked path, which answers with the refusal or the replay
(and prices with the overrides it reads). Under READ COMMITTED a concurrent writer's UPDATE waits
for the row and re-checks the condition on the committed version, so two writers can never pass
with the same guess: dense sequences hold without a lock held across round trips. A run's first
batch inserts the head instead (`INSERT … SELECT … WHERE <the prices in force> ON CONFLICT DO
NOTHING`): the loser of a creation race gets no row back.

A writer whose batch must commit with a change to a row of another table (the tool gateway's
control row: a claim, a completion) attaches that change (`Attached`): its condition joins the
head update's WHERE and its statement runs as one more CTE off the head, so the row change and the
events are one statement too, and outside a transaction one round trip and one commit. The final
SELECT fails the statement (nothing written) should the head move but an attached change find no
row, so the two are all or nothing even against a race the condition's snapshot did not see.

The statement's text depends only on which columns and tables a batch touches and on which of
them get exactly one row, not on the rows' values (more rows travel as one JSON array per table,
one row as scalar parameters, ledger/log/bulk.py), so each shape is prepared once per connection.

A long batch (ledger/log/strategies.py `pipelined`) goes as several such statements, one per part,
in one transaction and in psycopg's pipeline mode (`pipeline`): each is sent without waiting for
its answer, so the server executes a part while the caller validates and folds the next. BEGIN
goes out with the first part and COMMIT behind the last, and the answers are read once, at the
end: a part whose head moved fails its statement (and so the transaction, COMMIT included)
instead of answering no row.

A batch's cost entries are recorded when its events are: they take the statement's one
`recorded_at` parameter, as the events do, instead of a timestamp in every row (`_shape`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from django.db import DEFAULT_DB_ALIAS, DataError, IntegrityError, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.types.json import Jsonb

from ..models import CostEntry, DailyUsage, Event, Run, Step, ToolCall
from . import rollup, rules
from .bulk import column as col
from .bulk import conflict_update, json_fields, json_rows, json_text, recordset, row_params, table, values_row
from .projection import POSITIONED, Changes

# The event columns an append sends per row; run_id comes from the head, recorded_at is one value.
EVENT_FIELDS = ("sequence", "event_id", "type", "occurrence_id", "payload", "idempotency_key", "request_digest")


@dataclass(frozen=True)
class Guard:
    """What an optimistic writer claims, checked by the head update together with its guess.

    `keys` and `new_calls` are needed only inside a caller's transaction, which sends them.
    Elsewhere the statement is its own transaction and the unique indexes hold them: a logged key
    is a second row for the event's partial unique index, a call's row a second one for the tool
    call's (the calls a batch starts are inserted, not upserted), so the statement fails and
    nothing is written (`held_by_constraint`). In the head's WHERE they were index probes whose generic
    plan turned into a sequential scan of the whole table when the statistics called it small (a
    table analyzed nearly empty, then grown on a server without autovacuum: quadratic)."""

    fencing_token: str | None  # None: the run must not be leased (to anyone, now)
    now: datetime
    keys: tuple[str, ...]  # idempotency keys that the log must not hold yet
    # The run's workspace and the settings the batch was prepared with (rules.prepared_with: its
    # price overrides, redaction rules and size limits): still the stored ones (rules.settings_in_force).
    workspace_pk: int
    settings: str
    # Tool calls the batch starts and takes to be new without having read their rows
    # (projection.restore_tool_calls): the projection must not hold them yet.
    new_calls: tuple[str, ...] = ()


def held_by_constraint(exc: BaseException) -> bool:
    """Whether `exc` (Django's IntegrityError) is a key the log already holds or a call that
    already has a row: the guess was wrong, nothing was written, the locked way decides."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    return (
        getattr(cause, "sqlstate", None) == "23505"
        and getattr(diag, "constraint_name", None) in rules.GUARDING_CONSTRAINTS
    )


@dataclass(frozen=True)
class Attached:
    """A change to a row of another table that commits with the batch or not at all.

    `condition` joins the head update's WHERE: it holds when the change can be made (it may name
    `%(run_pk)s`). `sql` is a data-modifying statement run as the CTE `name`, after the head,
    that reads the run's pk from `head` and RETURNs one row when it made its change. `params`
    are its parameters and the condition's, each key starting with `name` and an underscore.
    The text of `condition` and `sql` must not depend on the row (it is part of the prepared
    statement's shape).
    """

    name: str
    condition: str
    sql: str
    params: Mapping[str, Any]


class AttachedMissed(Exception):
    """The head moved but an attached change found no row: the statement failed, nothing was written."""


# The SQLSTATE the final SELECT raises with (invalid_text_representation) when an attached change missed.
_MISSED = "22P02"
_MISSED_TEXT = "runledger: attached row change missed "
# What a part of a long batch fails with (the same SQLSTATE) when its head moved (`pipeline`).
_HEAD_MOVED_TEXT = "runledger: the head moved "


def update_head(
    run_pk: int,
    before: int,
    events: Sequence[Mapping[str, Any]],
    recorded_at: datetime,
    changes: Changes,
    guard: Guard | None,
    attached: Sequence[Attached] = (),
    *,
    db: BaseDatabaseWrapper | None = None,
) -> bool:
    """Write the batch (and the `attached` row changes) if the run still ends at `before` (and
    `guard` and every attached condition hold); False if nothing was written. Without a guard the
    caller holds the row lock, so it cannot miss. Raises AttachedMissed (nothing written) when
    the head held but an attached change did not. `db`: the default connection, if the caller
    has it at hand (else it is looked up)."""
    statement, params = _update_statement(run_pk, before, len(events), recorded_at, changes, guard, attached)
    try:
        return _execute(statement, params, events, recorded_at, changes, db) is not None
    except DataError as exc:
        cause = exc.__cause__
        if attached and getattr(cause, "sqlstate", None) == _MISSED and _MISSED_TEXT in str(cause):
            raise AttachedMissed(str(cause)) from exc
        raise


def _update_statement(
    run_pk: int,
    before: int,
    events: int,
    recorded_at: datetime,
    changes: Changes,
    guard: Guard | None,
    attached: Sequence[Attached],
    must_hold: bool = False,
) -> tuple[_Statement, dict[str, Any]]:
    params: dict[str, Any] = {"run_pk": run_pk, "before": before}
    if guard is not None:
        # The lists as JSON text: psycopg's array dumper quotes each element in Python (a regular
        # expression per string: 250 calls per batch of 500 cost ~1 µs an event).
        params.update(
            now=guard.now,
            token=guard.fencing_token,
            keys=_json_texts(guard.keys),
            new_calls=_json_texts(guard.new_calls),
            workspace_pk=guard.workspace_pk,
            settings=guard.settings,
        )
    for change in attached:
        params.update(change.params)
    guard_shape = None if guard is None else (guard.fencing_token is not None, bool(guard.keys), bool(guard.new_calls))
    statement = _update_sql(
        tuple(changes.run),
        guard_shape,
        tuple((a.name, a.condition, a.sql) for a in attached),
        must_hold,
        *_shape(events, changes, recorded_at),
    )
    return statement, params


def _json_texts(values: Sequence[str]) -> str:
    try:
        return orjson.dumps(values).decode()
    except orjson.JSONEncodeError:  # a lone surrogate: the database refuses it as it did in an array
        return json.dumps(list(values), ensure_ascii=False)


def insert_head(
    run_row: Mapping[str, Any],
    events: Sequence[Mapping[str, Any]],
    recorded_at: datetime,
    changes: Changes,
    *,
    settings: str,
    db: BaseDatabaseWrapper | None = None,
) -> int | None:
    """Create the run's head row (`run_row`: every column) with its first batch, prepared with
    the workspace's `settings` (rules.prepared_with); its pk, or None if the row already exists
    or those are no longer the stored ones (nothing was written)."""
    return _execute(
        _insert_sql(tuple(run_row), *_shape(len(events), changes, recorded_at)),
        {"workspace_pk": run_row["workspace_id"], "settings": settings},
        events,
        recorded_at,
        Changes(
            run=dict(run_row),
            steps=changes.steps,
            tool_calls=changes.tool_calls,
            cost_entries=changes.cost_entries,
            daily_usage=changes.daily_usage,
            new_tool_calls=changes.new_tool_calls,
        ),
        db,
    )


# --- the statement ---------------------------------------------------------------------------


# A table's rows in the statement: their fields, and whether there is exactly one; None: no rows.
# One row goes as scalar parameters (bulk.values_row), more as one JSON array (bulk.recordset): a
# single append's statement then parses no JSON and runs no function scan, ~20 µs of the server's
# time in a micro-benchmark of two of its CTEs (bench/README.md § Floors, session 10).
RowShape = tuple[tuple[str, ...], bool] | None

_ROW_TABLES = ("steps", "tool_calls", "cost_entries", "daily_usage", "new_tool_calls")
_ROW_MODELS = tuple(zip(_ROW_TABLES, (Step, ToolCall, CostEntry, DailyUsage, ToolCall)))


def _shape(events: int, changes: Changes, recorded_at: datetime) -> tuple[RowShape, ...]:
    shapes = [
        (tuple(rows[0]), len(rows) == 1) if rows else None for rows in (getattr(changes, name) for name in _ROW_TABLES)
    ]
    costs = changes.cost_entries
    if costs and all(row.get("recorded_at") == recorded_at for row in costs):
        # The batch's cost entries are recorded when its events are (always, for an append's):
        # the one `recorded_at` parameter, as for the events, instead of a timestamp in every
        # row's JSON for the server to parse (the key stays in the JSON: the recordset's column
        # list, which no longer names it, is what is read).
        names = tuple(name for name in costs[0] if name != "recorded_at")
        shapes[_ROW_TABLES.index("cost_entries")] = (names, len(costs) == 1)
    return ((EVENT_FIELDS, events == 1), *shapes)


@dataclass(frozen=True)
class _Statement:
    """A statement's text with PostgreSQL's own placeholders ($1, $2, …) and the parameter
    each stands for. psycopg turns `%(name)s` into those itself, but caches the conversion only
    for statements under 4 KB: these are longer, and converting one cost more than the rest of
    the Python of its append (a regular-expression pass over the whole text on every call). So
    each shape is converted once, here, and sent through a RawCursor, which takes it as it is."""

    text: bytes
    names: tuple[str, ...]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def _numbered(sql: str) -> _Statement:
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match[0] == "%%":
            return "%"
        return f"${numbers.setdefault(match[1], len(numbers) + 1)}"

    text = _PLACEHOLDER.sub(number, sql)
    return _Statement(text.encode(), tuple(numbers))


def _values(
    statement: _Statement,
    params: dict[str, Any],
    events: Sequence[Mapping[str, Any]],
    recorded_at: datetime,
    changes: Changes,
) -> list[Any]:
    params["recorded_at"] = recorded_at
    if len(events) == 1:
        params.update(row_params(Event, "events", events[0]))
    else:
        params["events"] = json_rows(events)
    for name, value in changes.run.items():
        params[f"run_{name}"] = _adapt(name, value)
    for key, model in _ROW_MODELS:
        rows = getattr(changes, key)
        if len(rows) == 1:
            params.update(row_params(model, key, rows[0]))
        elif rows:
            params[key] = json_rows(rows)
    return [params[name] for name in statement.names]


def _execute(
    statement: _Statement,
    params: dict[str, Any],
    events: Sequence[Mapping[str, Any]],
    recorded_at: datetime,
    changes: Changes,
    db: BaseDatabaseWrapper | None,
) -> int | None:
    values = _values(statement, params, events, recorded_at, changes)
    db = _ready(db)
    with db.wrap_database_errors:
        raw = _raw_cursor(db)
        raw.execute(statement.text, values, prepare=True)
        row = raw.fetchone()
    return None if row is None else int(row[0])


def fetch_one(statement: bytes, params: Sequence[Any]) -> tuple[Any, ...] | None:
    """The first row of `statement` (PostgreSQL's $1, $2, … placeholders) on the default
    connection, prepared once per connection like the append's statements: for a hot read whose
    planning costs more than its execution (ledger.tenancy.services's key lookup)."""
    db = _ready()
    with db.wrap_database_errors:
        raw = _raw_cursor(db)
        raw.execute(statement, params, prepare=True)
        row: tuple[Any, ...] | None = raw.fetchone()
    return row


def _ready(db: BaseDatabaseWrapper | None = None) -> Any:
    """The default database's wrapper (`db`, or looked up), connected: what
    `connection.cursor()` checks before it hands out a cursor, without the two cursors it builds
    (Django's wrapper, psycopg's) per statement."""
    if db is None:
        db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    return db


def _raw_cursor(db: Any) -> psycopg.RawCursor[Any]:
    """The RawCursor of `db`'s current connection (one is reused: a new one after a reconnection)."""
    conn = db.connection
    kept = db.__dict__.get("_ledger_raw_cursor")
    if kept is not None and kept.connection is conn and not kept.closed:
        return kept
    _allow_preparing(conn)
    raw = db.__dict__["_ledger_raw_cursor"] = psycopg.RawCursor(conn)
    return raw


def _allow_preparing(conn: psycopg.Connection[Any]) -> None:
    # Django turns psycopg's statement preparing off (threshold None, for poolers that cannot
    # keep prepared statements); a threshold no statement reaches keeps it off for every other
    # query while these, which ask for it, are prepared once per connection.
    if conn.prepare_threshold is None:
        conn.prepare_threshold = 2**31


def _adapt(name: str, value: Any) -> Any:
    if value is not None and name in json_fields(Run):
        return Jsonb(value, dumps=json_text)  # a U+0000 as U+FFFD (bulk.json_text)
    return value


@functools.lru_cache(maxsize=256)
def _update_sql(
    run_columns: tuple[str, ...],
    guard: tuple[bool, bool, bool] | None,
    attached: tuple[tuple[str, str, str], ...],
    must_hold: bool,
    *rows: RowShape,
) -> _Statement:
    sets = ", ".join(f"{col(Run, n)} = %(run_{n})s" for n in run_columns)
    terms = [rules.HEAD_GUESS]
    if guard is not None:
        token, keys, new_calls = guard
        terms.append(rules.FENCING_TOKEN if token else rules.NOT_LEASED)
        terms.append(rules.settings_in_force())
        if keys:
            terms.append(rules.keys_not_logged())
        if new_calls:
            terms.append(rules.calls_not_known())
    where = " AND ".join(terms)
    where += "".join(f" AND ({condition})" for _, condition, _ in attached)
    return _numbered(
        _with_head(f"UPDATE {table(Run)} SET {sets} WHERE {where} RETURNING id", rows, attached, must_hold)
    )


@functools.lru_cache(maxsize=16)
def _insert_sql(run_columns: tuple[str, ...], *rows: RowShape) -> _Statement:
    # A SELECT, for its WHERE: its parameters are cast to their columns' types (bulk.values_row),
    # which INSERT … VALUES took from the columns.
    return _numbered(
        _with_head(
            f"INSERT INTO {table(Run)} ({', '.join(col(Run, n) for n in run_columns)}) "
            f"SELECT r.* FROM {values_row(Run, run_columns, 'run')} WHERE {rules.settings_in_force()} "
            f"ON CONFLICT ({col(Run, 'workspace')}, {col(Run, 'run_id')}) DO NOTHING RETURNING id",
            rows,
        )
    )


def _with_head(
    head: str, rows: tuple[RowShape, ...], attached: tuple[tuple[str, str, str], ...] = (), must_hold: bool = False
) -> str:
    events, steps, calls, costs, usage, new_calls = rows
    assert events is not None
    parts = [
        f"head AS ({head})",
        *(f"{name} AS ({sql})" for name, _, sql in attached),
        "events AS ("
        + _insert_from_head(Event, events, "events", extra=("recorded_at", "%(recorded_at)s::timestamptz"))
        + ")",
    ]
    if steps:
        parts.append(f"steps AS ({_insert_from_head(Step, steps, 'steps', key=('run_id', 'step_path'))})")
    if new_calls:
        parts.append(f"new_tool_calls AS ({_insert_from_head(ToolCall, new_calls, 'new_tool_calls')})")
    if calls:
        parts.append(f"tool_calls AS ({_insert_from_head(ToolCall, calls, 'tool_calls', key=('run_id', 'call_id'))})")
    if costs:
        # Without recorded_at in its rows, the entries take the statement's (`_shape`).
        at = None if "recorded_at" in costs[0] else ("recorded_at", "%(recorded_at)s::timestamptz")
        parts.append(f"cost_entries AS ({_insert_from_head(CostEntry, costs, 'cost_entries', extra=at)})")
    if usage:
        upsert = rollup.upsert_sql("head, " + _rows_from(DailyUsage, usage, "daily_usage"), one_row=usage[1])
        parts.append(f"daily_usage AS ({upsert})")
    if must_hold:
        # A part of a long batch (`pipeline`): a head that moved fails the statement, and with it
        # the batch's transaction, instead of answering no row. The cast of the text (a subquery,
        # so never folded at planning) is reached only when the head returned none.
        assert not attached
        return (
            "WITH " + ", ".join(parts) + f" SELECT coalesce((SELECT id FROM head), "
            f"('{_HEAD_MOVED_TEXT}' || (SELECT count(*) FROM head))::bigint)"
        )
    if not attached:
        return "WITH " + ", ".join(parts) + " SELECT id FROM head"
    # Every attached change must have written its row when the head did; the ELSE branch (a
    # subquery, so never folded at planning) fails the statement with _MISSED, rolling it all back.
    written = " AND ".join(f"(SELECT count(*) FROM {name}) = 1" for name, _, _ in attached)
    missed = " || ".join(f"'{name}=' || (SELECT count(*) FROM {name})" for name, _, _ in attached)
    return (
        "WITH " + ", ".join(parts) + f" SELECT CASE WHEN {written} THEN id "
        f"ELSE ('{_MISSED_TEXT}' || {missed})::bigint END FROM head"
    )


def _rows_from(model: type[models.Model], shape: tuple[tuple[str, ...], bool], param: str) -> str:
    names, single = shape
    return values_row(model, names, param) if single else recordset(model, names, param)


def _insert_from_head(
    model: type[models.Model],
    shape: tuple[tuple[str, ...], bool],
    param: str,
    *,
    extra: tuple[str, str] | None = None,
    key: Sequence[str] = (),
) -> str:
    """INSERT of the rows in `param` for the run the head CTE returned (none if it returned none)."""
    names = shape[0]
    columns = ["run_id", *([extra[0]] if extra else []), *names]
    values = ["head.id", *([extra[1]] if extra else []), "r.*"]
    sql = (
        f"INSERT INTO {table(model)} ({', '.join(col(model, n) for n in columns)}) "
        f"SELECT {', '.join(values)} FROM head, {_rows_from(model, shape, param)}"
    )
    return f"{sql} {conflict_update(model, key, names, POSITIONED)}" if key else sql


# --- a long batch in parts, overlapped ----------------------------------------------------------


# psycopg's libpq has pipeline mode (libpq 14 and later); without it every batch is one statement.
PIPELINES = psycopg.Pipeline.is_supported()


class PipelineMissed(Exception):
    """A part's head update found no head (or the caller gave up): everything was rolled back."""


class Pipeline:
    """Head updates of one run sent back to back in one transaction without waiting for their
    answers (psycopg's pipeline mode): the server executes a part of a batch while the caller
    prepares the next. Each is `update_head`'s statement with its part's guard, in the form that
    fails when its head moved (`_with_head`'s `must_hold`): a part that misses aborts the
    transaction, so the COMMIT sent behind the last part cannot keep any of it. After the first
    part, the run row is this transaction's, so a later part misses only on its own guard (a key
    or a call that an earlier part of the batch wrote)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._raw = psycopg.RawCursor(conn)

    def update_head(
        self,
        run_pk: int,
        before: int,
        events: Sequence[Mapping[str, Any]],
        recorded_at: datetime,
        changes: Changes,
        guard: Guard,
    ) -> None:
        statement, params = _update_statement(
            run_pk, before, len(events), recorded_at, changes, guard, (), must_hold=True
        )
        self._raw.execute(statement.text, _values(statement, params, events, recorded_at, changes), prepare=True)

    def send(self, command: bytes) -> None:
        self._raw.execute(command)


_OPEN = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


@contextmanager
def pipeline(db: BaseDatabaseWrapper | None = None) -> Iterator[Pipeline]:
    """A transaction for `Pipeline.update_head`s: it commits when the body returns and every
    statement wrote; otherwise it rolls back and raises PipelineMissed. An exception of the body
    rolls it back too. Outside a transaction only (Django's autocommit): it is its own.

    One wait for the server in all: BEGIN goes out with the first part and COMMIT behind the last,
    and the answers are read once, at the pipeline's end (psycopg's `transaction()` would wait for
    its BEGIN, then for the parts, then for the COMMIT). A part that missed has failed the
    transaction by then (the server skips what follows it, the COMMIT too); a body that raised
    sent no COMMIT. Either way the transaction is still open after the pipeline's end and is
    rolled back there."""
    db = _ready(db)
    conn = db.connection
    _allow_preparing(conn)
    mode = conn.pipeline()
    try:
        with db.wrap_database_errors:
            try:
                mode.__enter__()
                failed: BaseException | None = None
                try:
                    sent = Pipeline(conn)
                    sent.send(b"BEGIN")
                    yield sent
                    sent.send(b"COMMIT")
                except BaseException as exc:  # re-raised below, once the pipeline has ended
                    failed = exc
                try:
                    # Ended as if the body had returned: psycopg would log the answers of a failed
                    # pipeline as a warning beside an exception of the body (a missed part raises
                    # as soon as its answer is read, often while the next part is sent).
                    mode.__exit__(None, None, None)
                except psycopg.Error:
                    if failed is None:
                        raise
                if failed is not None:
                    raise failed
            finally:
                if conn.pgconn.transaction_status in _OPEN:
                    # Not `conn.rollback()`, which also forgets every statement prepared on the
                    # connection; a part's statement that a failed pipeline skipped is marked
                    # unprepared by psycopg itself.
                    psycopg.RawCursor(conn).execute(b"ROLLBACK")
    except IntegrityError as exc:  # a part's key or new call the unique indexes refused (Guard)
        if held_by_constraint(exc):
            raise PipelineMissed from exc
        raise
    except DataError as exc:  # a part whose head moved (`_with_head`'s `must_hold`)
        if getattr(exc.__cause__, "sqlstate", None) == _MISSED and _HEAD_MOVED_TEXT in str(exc.__cause__):
            raise PipelineMissed from exc
        raise
