"""The three ways a batch is written, named after what they send (the door in
ledger/log/__init__.py says which is taken when):

- `pipelined`: a long batch in parts, each part's statement on its way while the next is prepared,
  all in one transaction (PostgreSQL's pipeline mode);
- `one_statement`: the batch, its projections (and a caller's attached row changes) in one
  conditional statement on this process's guess of the run's head: outside a transaction one
  round trip and one commit; a miss writes nothing;
- `locked`: the run's head row locked, the rules checked on what the rows hold, then the batch
  written (one statement on PostgreSQL, the ORM's on SQLite). Refusals and replays are decided here.

Each numbers the batch with `_allocate` (the lifecycle rule, event ids, the fold advanced) and
ends with `_after_write` (the cached state kept and the batch announced once it commits, the
terminal hooks run).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import OuterRef, Subquery
from django.db.models.base import ModelState

from .. import clock
from ..canonical import EventIds, canonical_bytes
from ..errors import InvalidEvent, LedgerError, RunTooLarge
from ..fold import RunState, advance
from ..fold.pricing import LITTLE_WORKFLOW, NATIVE, PriceTable, prices_for, prices_of
from ..limits import max_bytes_per_run, max_events_per_run
from ..models import Event, Run, Workspace
from . import announce, hooks, prepare, repricing, rules, statements, states
from .artifacts import INLINE_LIMIT_BYTES, externalize
from .bulk import insert_rows
from .envelopes import event_envelope, format_recorded_at
from .prepare import Prepared
from .projection import Changes, Mark, batch_changes, batch_totals, reroot, write
from .states import STATES, Cached, cached_for_append, folded_for_append, restore_tool_calls


@dataclass(frozen=True)
class AppendResult:
    events: list[dict[str, Any]]  # envelopes, each with "replayed"
    last_sequence: int
    # Each envelope's payload as the log stores it (canonical JSON text), in `events` order: what
    # a writer of JSON sends as the payload, so that the append's answer writes it byte for byte
    # as every read of the log does (docs/api.md, numbers in ECMAScript form, keys sorted).
    stored: list[str] = field(default_factory=list)


# A run at its limit of events may still end.
RUN_ENDINGS = frozenset({"RunCompleted", "RunFailed"})


def now_ms() -> datetime:
    # Stored at millisecond precision so that the envelope returned now equals the one read later.
    now = clock.recorded_now().astimezone(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# The head columns an append reads; the projected ones (input, output, ...) are not loaded.
HEAD_FIELDS = (
    "id",
    "workspace_id",
    "run_id",
    "last_sequence",
    "status",
    "lease_owner",
    "lease_expires_at",
    "fencing_token",
    "imported_from",
    "payload_bytes",
)


def lock_head(*, workspace: Workspace, run_id: str, columns: tuple[str, ...] | None = HEAD_FIELDS) -> Run | None:
    """The run's head row (`columns` of it, None: all), locked until the caller's transaction
    ends; None if absent.

    Every writer of a run queues on this lock: it is what keeps sequences dense under concurrent
    writers and the cached fold state current.
    """
    prepare.validate_run_id(run_id)
    rows = Run.objects.select_for_update()
    if columns is not None:
        rows = rows.only(*columns)
    # The workspace's price overrides, redaction rules and size limits read with the head: the
    # writer's Workspace may be older than them (rules.take_stored_settings).
    run = rows.annotate(**_stored_settings()).filter(workspace=workspace, run_id=run_id).first()
    if run is not None:
        rules.take_stored_settings(workspace, [getattr(run, f"stored_{name}") for name in rules.PREPARED_WITH])
        run.workspace = workspace  # the same row; saves a query on every append and artifact read
    return run


@functools.cache
def _stored_settings() -> dict[str, Subquery]:
    """`lock_head`'s annotations, built once (a query resolves a copy): made on every call, the
    five subqueries cost the ORM more than the rest of the statement."""
    return {
        f"stored_{name}": Subquery(Workspace.objects.filter(pk=OuterRef("workspace_id")).values(name))
        for name in rules.PREPARED_WITH
    }


def lock_or_create_head(workspace: Workspace, run_id: str) -> Run:
    run = lock_head(workspace=workspace, run_id=run_id)
    if run is not None:
        return run
    # ON CONFLICT DO NOTHING: a concurrent writer may create it first; the lock below orders us
    # after it. A batch that does not start the run is refused below, which rolls this row back.
    Run.objects.bulk_create([Run(workspace=workspace, run_id=run_id)], ignore_conflicts=True)
    run = lock_head(workspace=workspace, run_id=run_id)
    assert run is not None
    return run


def one_statement(
    db: BaseDatabaseWrapper,
    workspace: Workspace,
    run_id: str,
    batch: list[Prepared],
    expected_sequence: int | None,
    fencing_token: Any,
    attached: tuple[statements.Attached, ...] = (),
    imported: bool = False,
    by: str = "",
    settings: str | None = None,
) -> AppendResult | None:
    """The append on a guess of the run's head, without its lock (PostgreSQL, `db` the default
    connection); None when there is no guess or the database did not confirm it: then nothing
    was written. `settings`: what the batch was prepared with (rules.prepared_with, read before
    it was), by default the Workspace's now."""
    if any(len(p.canonical) > INLINE_LIMIT_BYTES for p in batch):
        return None  # the artifact must be written in the same transaction as its event
    # An imported log's later batches, on the state its first (locked) batch cached: Little
    # Workflow's rules. A client's batch to an imported run misses that cache and is locked.
    prepared_with = rules.prepared_with(workspace) if settings is None else settings
    prices = prices_for(workspace, rules=LITTLE_WORKFLOW if imported else NATIVE)
    cached, new_calls = states.guess(workspace.pk, run_id, prices.version, [(p.type, p.payload) for p in batch])
    if cached is not None:
        run = _cached_head(cached.run_pk, workspace, run_id)
        state = cached.state
    elif (
        batch[0].type == "RunStarted"
        and fencing_token is None
        and not attached
        and not imported
        and not batch[0].payload.get("parentRunId")  # a sub-run may re-root runs below it: locked
    ):
        run, state = Run(workspace=workspace, run_id=run_id), RunState(run_id=run_id)
    else:
        return None
    if expected_sequence is not None and expected_sequence != state.last_sequence:
        if cached is not None:
            STATES.put(workspace.pk, run_id, cached)  # untouched; the locked path may use it
        return None
    now = now_ms()
    before = Mark.of(state)
    try:
        rows, written, out, stored = _allocate(run, state, batch, {}, now, prices, imported)
    except LedgerError:
        return None  # the guess may be stale: refusals are decided under the lock, on the log
    changes = batch_changes(workspace.pk, state, written, before)
    _record_starter(changes, before, by)
    finishing = state.status in rules.FINISHED
    in_caller_transaction = db.in_atomic_block
    # An attached change may fail the statement (a race on its rows): inside a caller's
    # transaction a savepoint keeps that failure from ending the caller's transaction.
    atomic = finishing or (bool(attached) and in_caller_transaction)
    try:
        with transaction.atomic() if atomic else nullcontext():  # the terminal hooks join it
            if run.pk is None:
                run.pk = statements.insert_head(
                    _new_head(run, changes), rows, now, changes, settings=prepared_with, db=db
                )
                if run.pk is None:
                    return None
            else:
                # Outside a caller's transaction the unique indexes hold the keys and new calls
                # (statements.Guard); inside one a failed statement would end the caller's too.
                guarded = in_caller_transaction
                guard = statements.Guard(
                    fencing_token=None if fencing_token is None else str(fencing_token),
                    now=now,
                    keys=tuple(p.idempotency_key for p in batch if p.idempotency_key is not None) if guarded else (),
                    workspace_pk=workspace.pk,
                    settings=prepared_with,
                    new_calls=new_calls if guarded else (),
                )
                if not statements.update_head(run.pk, before.last_sequence, rows, now, changes, guard, attached, db=db):
                    return None
            _after_write(run, state, prices, written, rows, db.in_atomic_block)
    except (statements.AttachedMissed, IntegrityError) as exc:
        if not attached and not (isinstance(exc, IntegrityError) and statements.held_by_constraint(exc)):
            raise
        # An attached row changed under the guess (a unique key taken, a row gone), or the log
        # holds a key or a call the guess took to be new: nothing written.
        return None
    return AppendResult(events=out, last_sequence=state.last_sequence, stored=stored)


# A batch this long is written in parts of PIPELINE_PART events, each part's statement on its
# way to the server while the next part is prepared (statements.pipeline), all in one transaction.
# bench/README.md § Floors: batches of 500 in parts of 100 took ~27 µs an event against ~37 in
# one statement (quiet machine, alternated); parts of 50 to 125 measured alike, of 250 slower,
# and shorter first and last parts no better.
PIPELINE_FROM = 200
PIPELINE_PART = 100


def pipelined(
    db: BaseDatabaseWrapper,
    workspace: Workspace,
    run_id: str,
    events: list[Any],
    expected_sequence: int | None,
    fencing_token: Any,
) -> AppendResult | None:
    """The optimistic append of a long batch (`_check_batch` passed), in parts: the server
    executes one part's statement while this thread validates and folds the next. All or nothing,
    in one transaction. None when it cannot be taken (no guess of the head, a part whose statement
    missed, a refusal that the log must decide): nothing was written and the caller takes the
    usual way. An invalid request item raises what `_prepare_batch` would, nothing written.

    Each part writes its events, tool calls and cost entries; the rows every part would rewrite
    (the run's projected columns, the steps, the daily usage cells and through them the month's)
    are written once, by the last part, as they stand after the whole batch."""
    for item in events:  # the run's own lifecycle (a new head, settling a re-execution) goes the usual way
        if item.__class__ is not dict or item.get("type") in rules.MOVES_STATUS:
            return None
    prepared_with = rules.prepared_with(workspace)
    prices = prices_for(workspace)
    cached = STATES.take(workspace.pk, run_id, prices.version)
    if cached is None:
        return None
    state = cached.state
    if expected_sequence is not None and expected_sequence != state.last_sequence:
        STATES.put(workspace.pk, run_id, cached)
        return None
    run = _cached_head(cached.run_pk, workspace, run_id)
    redact = prepare.redactor(workspace)
    now = now_ms()
    token = None if fencing_token is None else str(fencing_token)
    written: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    stored: list[str] = []
    invalid: InvalidEvent | None = None
    first = Mark.of(state)  # where the batch starts: its step, usage and run rows are written once
    entries: list[dict[str, Any]] = []  # the batch's cost entries so far (for its usage rows)
    try:
        with statements.pipeline(db) as pipe:
            for start in range(0, len(events), PIPELINE_PART):
                try:
                    part = [
                        prepare.item(i, events[i], redact)
                        for i in range(start, min(start + PIPELINE_PART, len(events)))
                    ]
                except InvalidEvent as exc:  # raised once the parts sent are rolled back
                    invalid = exc
                    raise statements.PipelineMissed from None
                if any(len(p.canonical) > INLINE_LIMIT_BYTES for p in part):
                    raise statements.PipelineMissed
                restore_tool_calls(run.pk, state, [(p.type, p.payload) for p in part], started_new=True)
                before = Mark.of(state)
                part_rows, part_written, part_out, part_stored = _allocate(run, state, part, {}, now, prices)
                # Not the last part: its events, tool calls and cost entries, and the head's
                # sequence. The rows that each part would rewrite (the run's projected columns,
                # the steps, the usage cells) are written once, by the last part, as they stand
                # after the whole batch: the same rows when the transaction commits, and four
                # fewer upserts of each (and of the month's trigger) per 500 events.
                last = start + PIPELINE_PART >= len(events)
                changes = batch_changes(workspace.pk, state, part_written, before, whole=last and not start)
                entries += changes.cost_entries
                if last and start:  # the last of several parts: what the whole batch changed
                    totals = batch_totals(workspace.pk, state, first, written + part_written, entries)
                    changes.run, changes.steps, changes.daily_usage = totals.run, totals.steps, totals.daily_usage
                # Its own transaction: the unique indexes hold the keys and new calls (statements.Guard).
                guard = statements.Guard(
                    fencing_token=token, now=now, keys=(), workspace_pk=workspace.pk, settings=prepared_with
                )
                pipe.update_head(run.pk, before.last_sequence, part_rows, now, changes, guard)
                rows += part_rows
                written += part_written
                out += part_out
                stored += part_stored
    except (statements.PipelineMissed, LedgerError):
        if invalid is not None:
            raise invalid from None
        return None  # the guess may be stale: refusals are decided under the lock, on the log
    _after_write(run, state, prices, written, rows, in_transaction=False)  # the pipeline's has committed
    return AppendResult(events=out, last_sequence=state.last_sequence, stored=stored)


def _cached_head(run_pk: int, workspace: Workspace, run_id: str) -> Run:
    """The head as the optimistic path uses it (pk, workspace, run_id; last_sequence and status
    are set after the write), every other column deferred: what `Run.from_db` with those three
    columns builds (and `Run()` with all 29 defaults cost 124-180 µs at load 17), without
    walking the model's 29 fields to find that 26 of them are deferred. Run has no init signals."""
    run = Run.__new__(Run)
    state = ModelState()
    state.adding, state.db = False, DEFAULT_DB_ALIAS
    run.__dict__.update(_state=state, id=run_pk, workspace_id=workspace.pk, run_id=run_id)
    run.workspace = workspace
    return run


def _record_starter(changes: Changes, before: Mark, by: str) -> None:
    """The batch that starts the run's log (its RunStarted, or an imported log's first events)
    records who appended it on the head, in the same statement: `Run.started_by`, read by the
    "not your own" rules. Server-side, not in the log: a replayed batch writes no rows and so
    changes nothing, and the envelopes (and their idempotent retries) stay the client's."""
    if before.last_sequence == 0 and by:
        changes.run["started_by"] = by[:160]


def _new_head(run: Run, changes: Changes) -> dict[str, Any]:
    """Every column of a new run's head row: the model's defaults, then the batch's projection."""
    for name, value in changes.run.items():
        setattr(run, name, value)
    return {f.attname: getattr(run, f.attname) for f in Run._meta.concrete_fields if not f.primary_key}


def locked(
    run: Run,
    batch: list[Prepared],
    expected_sequence: int | None,
    fencing_token: Any,
    imported: bool = False,
    by: str = "",
    late_calls: bool = False,
) -> AppendResult:
    now = now_ms()
    rules.check_fencing(run, fencing_token, now)
    logged = match_replays(run, batch)
    rules.check_expected_sequence(
        expected_sequence, run.last_sequence, writes=any(p.idempotency_key not in logged for p in batch)
    )
    starts_import = imported and run.last_sequence == 0 and not run.imported_from
    if starts_import:
        # The run's log is Little Workflow's from its first event on: read by its rules for good.
        run.imported_from = LITTLE_WORKFLOW
    prices = prices_of(run)
    state = cached_for_append(run, prices)
    if state is None:
        state = folded_for_append(run, prices)
        # Entries priced by another table (an override edited since): rewritten to this fold first.
        repricing.align(run, state, prices)
    restore_tool_calls(run.pk, state, [(p.type, p.payload) for p in batch])
    before = Mark.of(state)
    rows, written, out, stored = _allocate(run, state, batch, logged, now, prices, imported, late_calls)
    if rows:
        changes = batch_changes(run.workspace_id, state, written, before)
        _record_starter(changes, before, by)
        if starts_import:
            changes.run["imported_from"] = LITTLE_WORKFLOW
        if connection.vendor == "postgresql":
            if not statements.update_head(run.pk, before.last_sequence, rows, now, changes, guard=None):
                raise RuntimeError(f"the head of run {run.run_id} moved under its lock")
        else:
            insert_rows(Event, [{"run_id": run.pk, "recorded_at": now, **row} for row in rows])
            write(run.pk, changes)
        if root := changes.run.get("root_run_id"):
            reroot(run, root)
        _after_write(run, state, prices, written, rows, connection.in_atomic_block)
    return AppendResult(events=out, last_sequence=state.last_sequence, stored=stored)


def _after_write(
    run: Run,
    state: RunState,
    prices: PriceTable,
    written: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    in_transaction: bool,
) -> None:
    """What follows a written batch in its transaction (`in_transaction`: the batch's statement
    ran in an atomic block; else it has committed): the caller's head object kept current, the
    state cached and the batch announced once it commits, a re-execution settled."""
    run.last_sequence, run.status, run.payload_bytes = state.last_sequence, state.status, state.payload_bytes
    remember = functools.partial(STATES.put, run.workspace_id, run.run_id, Cached(run.pk, prices.version, state))
    send = announce.announcement(run, state.last_sequence, written, rows)
    if in_transaction:
        transaction.on_commit(lambda: (remember(), send()))
    else:
        # Autocommit: the batch's one statement has committed. What `on_commit` would do here,
        # without its two lookups of the connection (a fifth of this function's time).
        remember()
        send()
    if state.status in rules.FINISHED:
        hooks.run_ended(run, written)


def match_replays(run: Run, batch: list[Prepared]) -> dict[str, Event]:
    """The logged originals of the batch's idempotency keys; a key sent with another event is a conflict."""
    keys = [p.idempotency_key for p in batch if p.idempotency_key is not None]
    if not keys or not run.last_sequence:
        return {}
    found = Event.objects.filter(run=run, idempotency_key__in=keys)
    logged = {e.idempotency_key: e for e in found if e.idempotency_key is not None}
    for index, p in enumerate(batch):
        original = logged.get(p.idempotency_key) if p.idempotency_key else None
        if original is not None:
            rules.same_request(index, p, original.request_digest, "was used for a different event")
    return logged


def _allocate(
    run: Run,
    state: RunState,
    batch: list[Prepared],
    logged: Mapping[str, Event],
    now: datetime,
    prices: PriceTable,
    imported: bool = False,
    late_calls: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Number the batch's new events after the log's end, advancing `state` with them.

    Returns the rows to insert (statements.EVENT_FIELDS), their envelopes, and the answer: every
    item's envelope in batch order, each flagged `replayed`, and each one's stored payload text.
    """
    rows: list[dict[str, Any]] = []
    written: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    out_stored: list[str] = []
    in_batch: dict[str, tuple[str | None, dict[str, Any], str]] = {}
    unfolded = 0  # envelopes at the end of `written` that `state` has not seen yet
    run_id = run.run_id
    event_id = EventIds(run_id)
    recorded_at = format_recorded_at(now)
    # The limits as stored: the caller's row took them with the head (rules.take_stored_settings),
    # or the one statement holds them to it (rules.settings_in_force).
    cap = max_events_per_run(run.workspace)
    byte_cap = max_bytes_per_run(run.workspace)
    for index, p in enumerate(batch):
        key = p.idempotency_key
        if key is not None:
            if key in logged:
                out.append({**event_envelope(logged[key], run_id), "replayed": True})
                out_stored.append(logged[key].payload)
                continue
            if key in in_batch:
                original_digest, original_env, original_text = in_batch[key]
                rules.same_request(index, p, original_digest, "is used twice in the batch for different events")
                out.append({**original_env, "replayed": True})
                out_stored.append(original_text)
                continue
        sequence = state.last_sequence + unfolded + 1
        event_type, occurrence_id = p.type, p.occurrence_id
        if sequence > cap and event_type not in RUN_ENDINGS:
            raise RunTooLarge(
                f"run {run_id} holds its limit of {cap} events; only its ending (RunCompleted, RunFailed) is accepted",
                index=index,
                limit=cap,
                which="events",
            )
        rules.check_lifecycle(
            state, sequence - 1, event_type, index, imported, late_calls and p.payload.get("late") is True
        )
        payload, stored = p.payload, p.canonical
        if len(stored) > INLINE_LIMIT_BYTES:
            payload = externalize(run.workspace, event_type, payload, len(stored))
            stored = canonical_bytes(payload)
        held = state.payload_bytes + len(stored)
        if held > byte_cap and event_type not in RUN_ENDINGS:
            raise RunTooLarge(
                f"run {run_id} would hold more than its limit of {byte_cap} bytes of event payload; only its ending "
                "(RunCompleted, RunFailed) is accepted",
                index=index,
                limit=byte_cap,
                which="bytes",
            )
        state.payload_bytes = held
        eid = event_id(sequence, event_type, stored, occurrence_id)
        text = stored.decode()
        rows.append(
            {
                "sequence": sequence,
                "event_id": eid,
                "type": event_type,
                "occurrence_id": occurrence_id,
                "payload": text,
                "idempotency_key": key,
                "request_digest": p.request_digest,
            }
        )
        # The envelope (ledger.log.envelopes.envelope), its keys in that order.
        if occurrence_id is None:
            env = {
                "eventId": eid,
                "runId": run_id,
                "sequence": sequence,
                "type": event_type,
                "recordedAt": recorded_at,
                "payload": payload,
            }
        else:
            env = {
                "eventId": eid,
                "runId": run_id,
                "sequence": sequence,
                "type": event_type,
                "occurrenceId": occurrence_id,
                "recordedAt": recorded_at,
                "payload": payload,
            }
        if key is not None:
            in_batch[key] = (p.request_digest, env, text)
        written.append(env)
        out.append({**env, "replayed": False})
        out_stored.append(text)
        unfolded += 1
        if event_type in rules.MOVES_STATUS:  # the next event's lifecycle check reads the status it set
            advance(state, written[-unfolded:], prices=prices)
            unfolded = 0
    if unfolded:  # one call for the rest: a call per event costed as much as the handlers
        advance(state, written[-unfolded:], prices=prices)
    return rows, written, out, out_stored


# The run's own lifecycle events: the only ones whose fold moves the run's status.
