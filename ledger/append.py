"""The one write path of the event log.

Every event, from the API, the runtime, the tool gateway or the CLI, enters the log through
`append_events`. It reads like healthchecks' Check.ping(): the batch prepared outside any lock,
then one transaction: the run's head row locked, the fence checked, idempotent replays matched,
a range of sequences allocated and inserted, the projections written, and the announcement
sent only after commit.

On PostgreSQL `append_events` first tries without the lock: it guesses the run's head from the
process's cache of folded states (projection.STATES), numbers and folds the batch on that guess,
and sends one statement whose head update holds only if the guess (and the fence, and the
freshness of the idempotency keys) still holds (ledger/pgappend.py). Outside a transaction that
is one round trip. A miss writes nothing and falls back to the locked path, as does every batch
the cache cannot guess for (a run this process has not appended to lately, a payload to
externalize) and every refusal, so refusals and replays are always decided under the lock.

A service that must change other rows of the run in the same transaction (the tool gateway)
either attaches those changes to the one statement (`append_attached`, its common case: one
round trip, one commit) or locks the head itself (`lock_head`) and calls `append_locked`, which
costs the lock's round trip, BEGIN and COMMIT on top of the one statement. Called inside a
caller's transaction, `append_events` stays optimistic (its statement joins that transaction)
and needs no lock when the guess holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.base import ModelState

from . import announce, clock, pgappend
from .artifacts import INLINE_LIMIT_BYTES, externalize
from .bulk import insert_rows
from .canonical import (
    EventIds,
    NotCanonicalizable,
    canonical_bytes,
    canonical_bytes_plain,
    request_digest_for_canonical,
)
from .envelopes import event_envelope, format_recorded_at
from .errors import (
    Fenced,
    IdempotencyConflict,
    InvalidEvent,
    LedgerError,
    InvalidRunId,
    RunAlreadyStarted,
    RunFinished,
    RunNotStarted,
    SequenceConflict,
)
from .fold import RunState, advance
from .limits import NUL, nul_path
from .models import Event, Run, RunStatus, Workspace
from .projection import (
    STATES,
    Changes,
    Mark,
    batch_changes,
    prices_for,
    remembering,
    restore_tool_calls,
    state_for_append,
    write,
)
from .pricing import PriceTable
from .redaction import NotPlain, Redactor, policy
from .vocabulary import is_custom, reject_recorded_cost, validate_fields

# Published as is (docs/api.md, the OpenAPI schema), so written for ECMAScript too; matched with
# fullmatch, since `$` alone also matches before a trailing newline ("run_a\n" would pass).
RUN_ID_RE = re.compile(r"^run_[A-Za-z0-9_-]{1,80}$")
MAX_BATCH = 5000
MAX_KEY_LENGTH = 200


@dataclass(frozen=True)
class AppendResult:
    events: list[dict[str, Any]]  # envelopes, each with "replayed"
    last_sequence: int


@dataclass
class _Prepared:
    type: str
    payload: dict[str, Any]  # redacted, as sent
    canonical: bytes  # canonical JSON of `payload`
    occurrence_id: str | None
    idempotency_key: str | None
    request_digest: str | None


def validate_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise InvalidRunId(
            f"run id must match {RUN_ID_RE.pattern}", runId=run_id if isinstance(run_id, str) else None
        )
    return run_id


def _is_text(value: str) -> bool:
    """Whether `value` is Unicode text a column can hold: no NUL, no lone surrogate (a JSON body may
    carry `\\ud800`, which UTF-8 cannot)."""
    if NUL in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _optional_str(index: int, item: Mapping[str, Any], field: str) -> str | None:
    value = item.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH or not _is_text(value):
        raise InvalidEvent(
            f"event {index}: {field} must be a non-empty string of at most {MAX_KEY_LENGTH} characters",
            index=index, field=field,
        )
    return value


def _prepare(index: int, item: Any, redact: Redactor) -> _Prepared:
    if item.__class__ is not dict and not isinstance(item, Mapping):
        raise InvalidEvent(f"event {index} must be an object", index=index, field="")
    event_type = item.get("type")
    if not isinstance(event_type, str) or not event_type or len(event_type) > 200 or not _is_text(event_type):
        raise InvalidEvent(f"event {index}: type must be a non-empty string", index=index, field="type")
    occurrence_id = _optional_str(index, item, "occurrenceId")
    key = _optional_str(index, item, "idempotencyKey")
    payload = item.get("payload", {})
    to_canonical = canonical_bytes
    try:
        validate_fields(index, event_type, payload)
        try:
            # One walk redacts, and shows that the recorded-cost rule has nothing to find and that
            # orjson writes the canonical form; any other payload takes the three walks.
            payload, to_canonical = redact.plain(payload), canonical_bytes_plain
        except (NotPlain, RecursionError):
            reject_recorded_cost(index, payload)
            payload = redact(payload)
    except RecursionError:
        # A body the JSON parser accepted can still be deeper than these recursive walks go.
        raise InvalidEvent(f"event {index}: payload is nested too deeply", index=index, field="payload") from None
    try:
        canonical = to_canonical(payload)
    except NotCanonicalizable as exc:
        raise InvalidEvent(f"event {index}: payload has no canonical JSON form: {exc}",
                           index=index, field="payload") from exc
    # PostgreSQL's jsonb cannot hold U+0000 (SQLite could): refused on both. Canonical JSON writes
    # it as \u0000, so only a payload whose canonical form holds that is walked.
    if b"\\u0000" in canonical and (where := nul_path(payload)) is not None:
        raise InvalidEvent(f"event {index}: strings may not contain the NUL character (U+0000)",
                           index=index, field=".".join(["payload", *map(str, where)]))
    request_digest = None
    if key is not None:
        request_digest = request_digest_for_canonical(type=event_type, payload_canonical=canonical,
                                                      occurrence_id=occurrence_id)
    return _Prepared(event_type, payload, canonical, occurrence_id, key, request_digest)


def _now_ms() -> datetime:
    # Stored at millisecond precision so that the envelope returned now equals the one read later.
    now = clock.recorded_now().astimezone(timezone.utc)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# The head columns an append reads; the projected ones (input, output, ...) are not loaded.
HEAD_FIELDS = ("id", "workspace_id", "run_id", "last_sequence", "status",
               "lease_owner", "lease_expires_at", "fencing_token")


def append_events(
    *,
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None = None,
    fencing_token: Any = None,
    imported: bool = False,
) -> AppendResult:
    """Append a batch to a run's log, all or nothing.

    `events` are request items `{type, payload, idempotencyKey?, occurrenceId?}`, checked here as
    they came in (hence `object`). Rejections raise a
    LedgerError carrying the docs/api.md code; nothing is written and no sequence number is consumed.

    `imported`: the batch is a log Little Workflow wrote (`ledger import-little`), whose runtime
    records a cycle's compile events before `RunStarted` and its outer loop's
    `OuterLoopCycleCompleted` after the run ended (IMPORTED_BEFORE_START, IMPORTED_AFTER_END);
    those are accepted there. Never set for what a client sends (docs/api.md's lifecycle holds).
    """
    validate_run_id(run_id)
    # The connection looked up once for the append: each attribute read through the `connection`
    # proxy is a context-local lookup (~1.5 µs), and an append asked for one five times.
    db = connections[DEFAULT_DB_ALIAS]
    if (db.vendor == "postgresql" and isinstance(events, list) and len(events) >= PIPELINE_FROM
            and not imported and not db.in_atomic_block and pgappend.PIPELINES):
        _check_batch(events, expected_sequence)
        result = _append_pipelined(db, workspace, run_id, events, expected_sequence, fencing_token)
        if result is not None:
            return result
    batch = _prepare_batch(workspace, events, expected_sequence)
    if db.vendor == "postgresql":
        result = _append_optimistic(db, workspace, run_id, batch, expected_sequence, fencing_token, imported=imported)
        if result is not None:
            return result
    with transaction.atomic():
        run = _lock_or_create_head(workspace, run_id)
        return _append_under_lock(run, batch, expected_sequence, fencing_token, imported=imported)


def append_attached(*, workspace: Workspace, run_id: str, events: Sequence[Mapping[str, Any]],
                    attached: Sequence[pgappend.Attached], fencing_token: Any = None) -> AppendResult | None:
    """PostgreSQL: `events` and the row changes `attached` (pgappend.Attached) in one statement,
    on this process's guess of the run's head: outside a transaction one round trip and one
    commit. None when that cannot be done (no guess, a payload to externalize) or the database
    did not confirm it (the head moved, the fence or an attached condition failed, a race on the
    attached rows): then nothing was written, and the caller takes its locked way, which decides
    refusals and replays on what the rows hold.

    For a service that changes another table with the events it appends (the tool gateway)
    without taking the head lock first (`lock_head`): both wait on the head row in one statement.
    """
    validate_run_id(run_id)
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql":
        return None  # the statement is PostgreSQL's; elsewhere the caller's locked way does it all
    batch = _prepare_batch(workspace, events, None)
    return _append_optimistic(db, workspace, run_id, batch, None, fencing_token, tuple(attached))


def lock_head(*, workspace: Workspace, run_id: str) -> Run | None:
    """The run's head row (HEAD_FIELDS), locked until the caller's transaction ends; None if absent.

    Every writer of a run queues on this lock: it is what keeps sequences dense under concurrent
    writers and the cached fold state current, so a service that changes other rows of the run in
    the same transaction (the tool gateway) takes it first and then calls `append_locked`.
    """
    validate_run_id(run_id)
    run = Run.objects.select_for_update().only(*HEAD_FIELDS).filter(workspace=workspace, run_id=run_id).first()
    if run is not None:
        run.workspace = workspace  # the same row; saves a query on every append and artifact read
    return run


def append_locked(
    *,
    run: Run,
    events: Sequence[Mapping[str, Any]],
    expected_sequence: int | None = None,
    fencing_token: Any = None,
) -> AppendResult:
    """`append_events` under the head row lock the caller already holds (`lock_head`, or a
    `select_for_update` of the row) in the transaction it is in.

    No savepoint: a rejection raised here must end the caller's transaction. An empty batch writes
    nothing and only answers to the fence, for a caller whose row changes need no event.
    """
    if not events:
        _check_fencing(run, fencing_token, _now_ms())
        return AppendResult(events=[], last_sequence=run.last_sequence)
    batch = _prepare_batch(run.workspace, events, expected_sequence)
    return _append_under_lock(run, batch, expected_sequence, fencing_token)


def stored_payload(workspace: Workspace, index: int, item: Mapping[str, Any]) -> bytes:
    """The canonical payload `append_events` would store for request item `item` (validated,
    redacted), or the LedgerError it would raise: for a caller that checks a whole log before
    writing any of it (`ledger import-little`)."""
    return _prepare(index, item, policy(workspace.redact_keys, workspace.redact_value_patterns)).canonical


def lifecycle_refusal(run_id: str, types: Sequence[str], *, imported: bool = False) -> tuple[int, LedgerError] | None:
    """The first of a whole log's events (their types, from sequence 1) that `append_events`
    would refuse for the run's lifecycle, with the error; None when it would take them all."""
    state = RunState(run_id=run_id)
    for index, event_type in enumerate(types):
        try:
            _check_lifecycle(state, index, event_type, index, imported)
        except LedgerError as exc:
            return index, exc
        # What the fold's run handlers do to the status, the one thing the rules read.
        state.status = {"RunStarted": "running", "RunCompleted": "completed", "RunFailed": "failed"}.get(
            event_type, state.status)
    return None


# --- the steps, in the order an append takes them -----------------------------------------


def _prepare_batch(workspace: Workspace, events: Any, expected_sequence: Any) -> list[_Prepared]:
    """Validate, redact and canonicalize the batch before any lock is taken."""
    _check_batch(events, expected_sequence)
    redact = policy(workspace.redact_keys, workspace.redact_value_patterns)
    return [_prepare(i, item, redact) for i, item in enumerate(events)]


def _check_batch(events: Any, expected_sequence: Any) -> None:
    """The request's shape, before its items are looked at."""
    if not isinstance(events, Sequence) or isinstance(events, (str, bytes)) or not events:
        raise InvalidEvent("events must be a non-empty list", field="events")
    if len(events) > MAX_BATCH:
        raise InvalidEvent(f"a batch holds at most {MAX_BATCH} events", field="events")
    if expected_sequence is not None and (
        isinstance(expected_sequence, bool) or not isinstance(expected_sequence, int) or expected_sequence < 0
    ):
        raise InvalidEvent("expectedSequence must be a non-negative integer", field="expectedSequence")


def _lock_or_create_head(workspace: Workspace, run_id: str) -> Run:
    run = lock_head(workspace=workspace, run_id=run_id)
    if run is not None:
        return run
    # ON CONFLICT DO NOTHING: a concurrent writer may create it first; the lock below orders us
    # after it. A batch that does not start the run is refused below, which rolls this row back.
    Run.objects.bulk_create([Run(workspace=workspace, run_id=run_id)], ignore_conflicts=True)
    run = lock_head(workspace=workspace, run_id=run_id)
    assert run is not None
    return run


def _append_optimistic(db: BaseDatabaseWrapper, workspace: Workspace, run_id: str, batch: list[_Prepared],
                       expected_sequence: int | None, fencing_token: Any,
                       attached: tuple[pgappend.Attached, ...] = (), imported: bool = False) -> AppendResult | None:
    """The append on a guess of the run's head, without its lock (PostgreSQL, `db` the default
    connection); None when there is no guess or the database did not confirm it: then nothing
    was written."""
    if any(len(p.canonical) > INLINE_LIMIT_BYTES for p in batch):
        return None  # the artifact must be written in the same transaction as its event
    prices = prices_for(workspace)
    cached = STATES.take(workspace.pk, run_id, prices.version)
    if cached is not None:
        run = _cached_head(cached.run_pk, workspace, run_id)
        state = cached.state
    elif batch[0].type == "RunStarted" and fencing_token is None and not attached and not imported:
        run, state = Run(workspace=workspace, run_id=run_id), RunState(run_id=run_id)
    else:
        return None
    if expected_sequence is not None and expected_sequence != state.last_sequence:
        if cached is not None:
            STATES.put(workspace.pk, run_id, cached)  # untouched; the locked path may use it
        return None
    now = _now_ms()
    new_calls: tuple[str, ...] = ()
    if run.pk is not None:
        new_calls = restore_tool_calls(run.pk, state, [(p.type, p.payload) for p in batch], started_new=True)
    before = Mark.of(state)
    try:
        rows, written, out = _allocate(run, state, batch, {}, now, prices, imported)
    except LedgerError:
        return None  # the guess may be stale: refusals are decided under the lock, on the log
    changes = batch_changes(workspace.pk, state, written, before)
    finishing = state.status in RunStatus.finished()
    in_caller_transaction = db.in_atomic_block
    # An attached change may fail the statement (a race on its rows): inside a caller's
    # transaction a savepoint keeps that failure from ending the caller's transaction.
    atomic = finishing or (bool(attached) and in_caller_transaction)
    try:
        with transaction.atomic() if atomic else nullcontext():  # settle_on_terminal joins it
            if run.pk is None:
                run.pk = pgappend.insert_head(_new_head(run, changes), rows, now, changes, db=db)
                if run.pk is None:
                    return None
            else:
                # Outside a caller's transaction the unique indexes hold the keys and new calls
                # (pgappend.Guard); inside one a failed statement would end the caller's too.
                guarded = in_caller_transaction
                guard = pgappend.Guard(fencing_token=None if fencing_token is None else str(fencing_token), now=now,
                                       keys=tuple(p.idempotency_key for p in batch
                                                  if p.idempotency_key is not None) if guarded else (),
                                       new_calls=new_calls if guarded else ())
                if not pgappend.update_head(run.pk, before.last_sequence, rows, now, changes, guard, attached, db=db):
                    return None
            _after_write(run, state, prices, written, rows, db.in_atomic_block)
    except (pgappend.AttachedMissed, IntegrityError) as exc:
        if not attached and not (isinstance(exc, IntegrityError) and pgappend.held_by_constraint(exc)):
            raise
        # An attached row changed under the guess (a unique key taken, a row gone), or the log
        # holds a key or a call the guess took to be new: nothing written.
        return None
    return AppendResult(events=out, last_sequence=state.last_sequence)


# A batch this long is written in parts of PIPELINE_PART events, each part's statement on its
# way to the server while the next part is prepared (pgappend.pipeline), all in one transaction.
# bench/README.md § Floors: batches of 500 in parts of 100 took ~27 µs an event against ~37 in
# one statement (quiet machine, alternated); parts of 50 to 125 measured alike, of 250 slower,
# and shorter first and last parts no better.
PIPELINE_FROM = 200
PIPELINE_PART = 100


def _append_pipelined(db: BaseDatabaseWrapper, workspace: Workspace, run_id: str, events: list[Any],
                      expected_sequence: int | None, fencing_token: Any) -> AppendResult | None:
    """The optimistic append of a long batch (`_check_batch` passed), in parts: the server
    executes one part's statement while this thread validates and folds the next. All or nothing,
    in one transaction. None when it cannot be taken (no guess of the head, a part whose statement
    missed, a refusal that the log must decide): nothing was written and the caller takes the
    usual way. An invalid request item raises what `_prepare_batch` would, nothing written."""
    for item in events:  # the run's own lifecycle (a new head, settling a re-execution) goes the usual way
        if item.__class__ is not dict or item.get("type") in _MOVES_STATUS:
            return None
    prices = prices_for(workspace)
    cached = STATES.take(workspace.pk, run_id, prices.version)
    if cached is None:
        return None
    state = cached.state
    if expected_sequence is not None and expected_sequence != state.last_sequence:
        STATES.put(workspace.pk, run_id, cached)
        return None
    run = _cached_head(cached.run_pk, workspace, run_id)
    redact = policy(workspace.redact_keys, workspace.redact_value_patterns)
    now = _now_ms()
    token = None if fencing_token is None else str(fencing_token)
    written: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    invalid: InvalidEvent | None = None
    try:
        with pgappend.pipeline(db) as pipe:
            for start in range(0, len(events), PIPELINE_PART):
                try:
                    part = [_prepare(i, events[i], redact) for i in range(start, min(start + PIPELINE_PART, len(events)))]
                except InvalidEvent as exc:  # raised once the parts sent are rolled back
                    invalid = exc
                    raise pgappend.PipelineMissed from None
                if any(len(p.canonical) > INLINE_LIMIT_BYTES for p in part):
                    raise pgappend.PipelineMissed
                restore_tool_calls(run.pk, state, [(p.type, p.payload) for p in part], started_new=True)
                before = Mark.of(state)
                part_rows, part_written, part_out = _allocate(run, state, part, {}, now, prices)
                changes = batch_changes(workspace.pk, state, part_written, before)
                # Its own transaction: the unique indexes hold the keys and new calls (pgappend.Guard).
                guard = pgappend.Guard(fencing_token=token, now=now, keys=())
                pipe.update_head(run.pk, before.last_sequence, part_rows, now, changes, guard)
                rows += part_rows
                written += part_written
                out += part_out
    except (pgappend.PipelineMissed, LedgerError):
        if invalid is not None:
            raise invalid from None
        return None  # the guess may be stale: refusals are decided under the lock, on the log
    _after_write(run, state, prices, written, rows, in_transaction=False)  # the pipeline's has committed
    return AppendResult(events=out, last_sequence=state.last_sequence)


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


def _new_head(run: Run, changes: Changes) -> dict[str, Any]:
    """Every column of a new run's head row: the model's defaults, then the batch's projection."""
    for name, value in changes.run.items():
        setattr(run, name, value)
    return {f.attname: getattr(run, f.attname) for f in Run._meta.concrete_fields if not f.primary_key}


def _append_under_lock(run: Run, batch: list[_Prepared], expected_sequence: int | None,
                       fencing_token: Any, imported: bool = False) -> AppendResult:
    now = _now_ms()
    _check_fencing(run, fencing_token, now)
    logged = _match_replays(run, batch)
    # A retry of a batch that already landed answers with the originals even though the log
    # has moved on since; expectedSequence guards only batches that write something.
    writes = any(p.idempotency_key not in logged for p in batch)
    if expected_sequence is not None and writes and expected_sequence != run.last_sequence:
        raise SequenceConflict(
            f"expected the run to end at sequence {expected_sequence}, it ends at {run.last_sequence}",
            expected=expected_sequence, actual=run.last_sequence,
        )
    prices = prices_for(run.workspace)
    state = state_for_append(run, prices)
    restore_tool_calls(run.pk, state, [(p.type, p.payload) for p in batch])
    before = Mark.of(state)
    rows, written, out = _allocate(run, state, batch, logged, now, prices, imported)
    if rows:
        changes = batch_changes(run.workspace_id, state, written, before)
        if connection.vendor == "postgresql":
            if not pgappend.update_head(run.pk, before.last_sequence, rows, now, changes, guard=None):
                raise RuntimeError(f"the head of run {run.run_id} moved under its lock")
        else:
            insert_rows(Event, [{"run_id": run.pk, "recorded_at": now, **row} for row in rows])
            write(run.pk, changes)
        _after_write(run, state, prices, written, rows, connection.in_atomic_block)
    return AppendResult(events=out, last_sequence=state.last_sequence)


def _after_write(run: Run, state: RunState, prices: PriceTable, written: list[dict[str, Any]],
                 rows: list[dict[str, Any]], in_transaction: bool) -> None:
    """What follows a written batch in its transaction (`in_transaction`: the batch's statement
    ran in an atomic block; else it has committed): the caller's head object kept current, the
    state cached and the batch announced once it commits, a re-execution settled."""
    run.last_sequence, run.status = state.last_sequence, state.status
    remember, send = remembering(run, prices, state), announce.announcement(run, state.last_sequence, written, rows)
    if in_transaction:
        transaction.on_commit(lambda: (remember(), send()))
    else:
        # Autocommit: the batch's one statement has committed. What `on_commit` would do here,
        # without its two lookups of the connection (a fifth of this function's time).
        remember()
        send()
    if state.status in RunStatus.finished():
        # A re-execution request whose new run this is ends with it, in this transaction.
        from .reexecution.services import settle_on_terminal

        settle_on_terminal(run=run, written=written)


def _check_fencing(run: Run, fencing_token: Any, now: datetime) -> None:
    if fencing_token is None:
        if run.lease_expires_at is not None and run.lease_expires_at > now:
            raise Fenced(f"run {run.run_id} is leased to {run.lease_owner}; send its fencingToken",
                         runId=run.run_id)
        return
    if str(fencing_token) != str(run.fencing_token) or run.fencing_token == 0:
        raise Fenced(
            f"fencing token {fencing_token} is stale for run {run.run_id}; another executor holds it",
            runId=run.run_id,
        )


def _match_replays(run: Run, batch: list[_Prepared]) -> dict[str, Event]:
    """The logged originals of the batch's idempotency keys; a key sent with another event is a conflict."""
    keys = [p.idempotency_key for p in batch if p.idempotency_key is not None]
    if not keys or not run.last_sequence:
        return {}
    found = Event.objects.filter(run=run, idempotency_key__in=keys)
    logged = {e.idempotency_key: e for e in found if e.idempotency_key is not None}
    for index, p in enumerate(batch):
        original = logged.get(p.idempotency_key) if p.idempotency_key else None
        if original is not None:
            _same_request(index, p, original.request_digest, "was used for a different event")
    return logged


def _same_request(index: int, p: _Prepared, original_digest: str | None, conflict: str) -> None:
    if original_digest != p.request_digest:
        raise IdempotencyConflict(f"event {index}: idempotency key {p.idempotency_key!r} {conflict}",
                                  index=index, idempotencyKey=p.idempotency_key)


def _allocate(run: Run, state: RunState, batch: list[_Prepared], logged: Mapping[str, Event], now: datetime,
              prices: PriceTable, imported: bool = False,
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Number the batch's new events after the log's end, advancing `state` with them.

    Returns the rows to insert (pgappend.EVENT_FIELDS), their envelopes, and the answer: every
    item's envelope in batch order, each flagged `replayed`.
    """
    rows: list[dict[str, Any]] = []
    written: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    in_batch: dict[str, tuple[str | None, dict[str, Any]]] = {}
    unfolded = 0  # envelopes at the end of `written` that `state` has not seen yet
    run_id = run.run_id
    event_id = EventIds(run_id)
    recorded_at = format_recorded_at(now)
    for index, p in enumerate(batch):
        key = p.idempotency_key
        if key is not None:
            if key in logged:
                out.append({**event_envelope(logged[key], run_id), "replayed": True})
                continue
            if key in in_batch:
                original_digest, original_env = in_batch[key]
                _same_request(index, p, original_digest, "is used twice in the batch for different events")
                out.append({**original_env, "replayed": True})
                continue
        sequence = state.last_sequence + unfolded + 1
        event_type, occurrence_id = p.type, p.occurrence_id
        _check_lifecycle(state, sequence - 1, event_type, index, imported)
        payload, stored = p.payload, p.canonical
        if len(stored) > INLINE_LIMIT_BYTES:
            payload = externalize(run.workspace, payload, len(stored))
            stored = canonical_bytes(payload)
        eid = event_id(sequence, event_type, stored, occurrence_id)
        rows.append({"sequence": sequence, "event_id": eid, "type": event_type, "occurrence_id": occurrence_id,
                     "payload": stored.decode(), "idempotency_key": key, "request_digest": p.request_digest})
        # The envelope (ledger.envelopes.envelope), its keys in that order.
        if occurrence_id is None:
            env = {"eventId": eid, "runId": run_id, "sequence": sequence, "type": event_type,
                   "recordedAt": recorded_at, "payload": payload}
        else:
            env = {"eventId": eid, "runId": run_id, "sequence": sequence, "type": event_type,
                   "occurrenceId": occurrence_id, "recordedAt": recorded_at, "payload": payload}
        if key is not None:
            in_batch[key] = (p.request_digest, env)
        written.append(env)
        out.append({**env, "replayed": False})
        unfolded += 1
        if event_type in _MOVES_STATUS:  # the next event's lifecycle check reads the status it set
            advance(state, written[-unfolded:], prices=prices)
            unfolded = 0
    if unfolded:  # one call for the rest: a call per event costed as much as the handlers
        advance(state, written[-unfolded:], prices=prices)
    return rows, written, out


# The run's own lifecycle events: the only ones whose fold moves the run's status.
_MOVES_STATUS = frozenset({"RunStarted", "RunCompleted", "RunFailed"})
# Little Workflow's runtime writes a cycle's compile and planning events into the run's log before
# RunStarted, and the outer loop's supervise decision after the cycle's run ended (its
# outer-loop.ts); an imported log keeps them where they are, or its event ids would change.
IMPORTED_BEFORE_START = frozenset({
    "OrchestrationRequested", "PlannerStarted", "PlannerDraftedWorkflow", "WorkflowValidationFailed",
    "WorkflowValidationSucceeded", "PlannerReuseDecisionRecorded", "WorkflowVersionRegistered",
})
IMPORTED_AFTER_END = frozenset({"OuterLoopCycleCompleted"})


def _check_lifecycle(state: RunState, last_sequence: int, event_type: str, index: int,
                     imported: bool = False) -> None:
    """The run's lifecycle rules for an event after `last_sequence`, read from the fold's status
    (`state` may lag behind `last_sequence` by events that do not move the status)."""
    run_id = state.run_id
    if imported and state.status == "pending" and event_type in IMPORTED_BEFORE_START:
        return
    if imported and state.status in RunStatus.finished() and event_type in IMPORTED_AFTER_END:
        return
    if imported and state.status == "pending" and event_type == "RunStarted":
        return  # after the compile events above
    if last_sequence == 0 and event_type != "RunStarted":
        raise RunNotStarted(f"run {run_id} has no events; its first event must be RunStarted",
                            index=index, runId=run_id)
    if last_sequence > 0 and event_type == "RunStarted":
        raise RunAlreadyStarted(f"run {run_id} has already started", index=index, runId=run_id)
    if state.status in RunStatus.finished() and not is_custom(event_type):
        raise RunFinished(f"run {run_id} is {state.status}; only custom.* events may follow",
                          index=index, runId=run_id)
