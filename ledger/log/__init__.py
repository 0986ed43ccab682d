"""The event log's one door. Every event gets into the log through one of these three:

    append(workspace=W, run_id=R, events=[...], expected_sequence=N?, fencing_token=T?, by=WHO)
        The API's POST .../events, OTLP ingest, the runtime's writes outside the tool gateway,
        the command line and the demo; `ledger import-little` with `imported=True` (Little
        Workflow's own lifecycle: compile events before RunStarted, a verdict after the end).

    append(..., attached=[Attached(...), ...])
        The tool gateway's common case (`gateway.runtime_batch`): the batch and a change to the
        call's control row in one statement, or None when the database did not confirm it
        (nothing written); the gateway then does the same under `holding`.

    head = holding(workspace=W, run_id=R); head.append([...])
        In the caller's transaction, under the run's head lock: a service that reads and changes
        other rows of the run with its events (the tool gateway's services, tool approval,
        cancellation). The head row stays locked until the caller's transaction ends.

Beside them, `replayed(workspace=W, run_id=R, events=[...], expected_sequence=N?,
fencing_token=T?)` writes nothing: it is the answer `append` would give a batch that is a pure
replay (every item's idempotency key logged with the same event), or None; for a caller that
must not write now (the API past a key's rate limit) but owes a retry its 200.

Which strategy (ledger/log/strategies.py) writes a batch is decided here, and only here:

| the append | strategy | costs | why |
|---|---|---|---|
| PostgreSQL, >= PIPELINE_FROM events, no transaction open, this process folded the run last, no RunStarted/RunCompleted/RunFailed | `pipelined` | one transaction, a statement per part of PIPELINE_PART | the server writes a part while the next is prepared |
| PostgreSQL, this process folded the run last (or a new run's RunStarted without a parentRunId), every payload inline | `one_statement` | 1 round trip, 1 commit (outside a transaction) | the head update holds only on the guessed head and the prices in force: a stale guess writes nothing |
| `attached` (PostgreSQL) | `one_statement` with the row changes | 1 round trip | the control row and its events commit together or not at all |
| everything else: SQLite, no guess, a payload to externalize, a guess that missed, a refusal or replay to decide, an imported log, a sub-run's start (it re-roots runs below it, projection.reroot) | `locked` | the lock, a statement, the commit | refusals and replays are decided on what the rows hold, prices by the overrides read with the lock |
| `holding(...)` | `locked`, in the caller's transaction | the lock, then a statement per `head.append` | the caller's row changes and the events share the lock |

Every strategy obeys the same rules (ledger/log/rules.py: expected sequence, fencing, lifecycle,
idempotent replay, a tool call still held), numbers the batch densely after the log's end,
writes the projections of the fold in the same transaction (ledger/log/projection.py), runs the
terminal hooks (ledger/log/hooks.py) and announces the batch after commit (ledger/log/announce.py).
A refused batch writes nothing and consumes no sequence number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from django.db import DEFAULT_DB_ALIAS, DataError, IntegrityError, connections, transaction

from ..errors import NotFound, UsageTooLarge
from ..models import Run, Workspace
from . import prepare, rules, statements, strategies
from .envelopes import event_envelope
from .statements import Attached
from .strategies import HEAD_FIELDS, PIPELINE_FROM, AppendResult

__all__ = ["AppendResult", "Attached", "Head", "append", "holding", "replayed"]


@overload
def append(
    *,
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None = None,
    fencing_token: Any = None,
    imported: bool = False,
    attached: None = None,
    by: str = "",
) -> AppendResult: ...


@overload
def append(
    *,
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None = None,
    fencing_token: Any = None,
    imported: bool = False,
    attached: Sequence[Attached],
    by: str = "",
) -> AppendResult | None: ...


def append(
    *,
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None = None,
    fencing_token: Any = None,
    imported: bool = False,
    attached: Sequence[Attached] | None = None,
    by: str = "",
) -> AppendResult | None:
    """Append a batch to a run's log, all or nothing.

    `by` names the caller as the transport authenticated it (a username, `key:<prefix>`,
    `system:<what>`): the batch that starts the run's log records it on the head
    (`Run.started_by`, in the same statement), for the "not your own" rules; a later batch, or a
    replayed one, leaves it as it is. Never taken from the payload.

    `events` are request items `{type, payload, idempotencyKey?, occurrenceId?}`, checked here as
    they came in (hence `object`). A refusal raises a LedgerError carrying the docs/api.md code; nothing
    is written and no sequence number is consumed. With `attached`, None when the one statement
    could not be taken or confirmed (see the module docstring).
    """
    prepare.validate_run_id(run_id)
    try:
        return _append(workspace, run_id, events, expected_sequence, fencing_token, imported, attached, by)
    except (UsageTooLarge, DataError, IntegrityError) as exc:
        refusal = usage_too_large(exc, events)
        if refusal is exc:
            raise
        raise refusal from None


def _append(
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None,
    fencing_token: Any,
    imported: bool,
    attached: Sequence[Attached] | None,
    by: str,
) -> AppendResult | None:
    # The connection looked up once for the append: each attribute read through the `connection`
    # proxy is a context-local lookup (~1.5 µs), and an append asked for one five times.
    db = connections[DEFAULT_DB_ALIAS]
    if attached is not None:
        if db.vendor != "postgresql":
            return None  # the statement is PostgreSQL's; elsewhere the caller's locked way does it all
        attached_settings = rules.prepared_with(workspace)
        batch = prepare.batch(workspace, events, expected_sequence)
        return strategies.one_statement(
            db, workspace, run_id, batch, expected_sequence, fencing_token, tuple(attached), settings=attached_settings
        )
    if (
        db.vendor == "postgresql"
        and isinstance(events, list)
        and len(events) >= PIPELINE_FROM
        and not imported
        and not db.in_atomic_block
        and statements.PIPELINES
    ):
        prepare.check_batch(events, expected_sequence)
        result = strategies.pipelined(db, workspace, run_id, events, expected_sequence, fencing_token)
        if result is not None:
            return result
    # What the batch is redacted with, read before it is: the head's lock may bring newer rules.
    redaction = rules.redaction_of(workspace)
    settings = rules.prepared_with(workspace) if db.vendor == "postgresql" else None
    batch = prepare.batch(workspace, events, expected_sequence, imported=imported)
    if db.vendor == "postgresql":
        result = strategies.one_statement(
            db, workspace, run_id, batch, expected_sequence, fencing_token, imported=imported, by=by, settings=settings
        )
        if result is not None:
            return result
    with transaction.atomic():
        run = strategies.lock_or_create_head(workspace, run_id)
        if rules.redaction_of(workspace) != redaction:
            # The workspace's rules changed since this process loaded them (rules.take_stored_settings):
            # the batch is redacted again with the stored ones before anything is written.
            batch = prepare.batch(workspace, events, expected_sequence, imported=imported)
        return strategies.locked(run, batch, expected_sequence, fencing_token, imported=imported, by=by)


def replayed(
    *,
    workspace: Workspace,
    run_id: str,
    events: object,
    expected_sequence: int | None = None,
    fencing_token: Any = None,
) -> AppendResult | None:
    """What `append` would answer to `events` when every item is a replay: its idempotency key is
    in the run's log with the same event (type, occurrence, payload, as redacted now), so that the
    append would write nothing. None when any item would be written (no key, a key not logged) or
    the run has no log. Writes nothing and takes no lock: logged events never change.

    The refusals are the append's, in its order: an invalid batch, a fenced writer, a key logged
    for another event (409 idempotency_conflict); a stale expectedSequence does not refuse a
    replay, and neither does a finished run."""
    prepare.validate_run_id(run_id)
    if not isinstance(events, list) or not all(isinstance(e, Mapping) and e.get("idempotencyKey") for e in events):
        return None
    run = Run.objects.filter(workspace=workspace, run_id=run_id).only(*HEAD_FIELDS).first()
    if run is None or not run.last_sequence:
        return None
    batch = prepare.batch(workspace, events, expected_sequence)
    rules.check_fencing(run, fencing_token, strategies.now_ms())
    logged = strategies.match_replays(run, batch)
    originals = [logged.get(p.idempotency_key or "") for p in batch]
    if any(original is None for original in originals):
        return None
    return AppendResult(
        events=[{**event_envelope(e, run_id), "replayed": True} for e in originals if e is not None],
        last_sequence=run.last_sequence,
        stored=[e.payload for e in originals if e is not None],
    )


# numeric_value_out_of_range: a bigint or numeric column (or sum) past its range.
_OUT_OF_RANGE = "22003"
# What SQLite's triggers abort a usage cell's write with (migration 0047): PostgreSQL's condition.
_OUT_OF_RANGE_NAME = "numeric_value_out_of_range"


def usage_too_large(exc: Exception, events: object) -> Exception:
    """`exc` as the refusal of the batch `events`: a sum of the model calls' usage past what its
    columns hold, found by the projection (UsageTooLarge) or by the database in a usage rollup cell,
    which adds up every run's calls of a day and a month (PostgreSQL's columns: DataError 22003;
    SQLite's triggers, which keep its cells to the same range: an IntegrityError naming that
    condition), named at the batch's first model call. Any other error as it is. The transaction
    is gone: nothing was written."""
    if isinstance(exc, DataError) and getattr(exc.__cause__, "sqlstate", None) != _OUT_OF_RANGE:
        return exc
    if isinstance(exc, IntegrityError) and not str(exc).startswith(_OUT_OF_RANGE_NAME):
        return exc
    index = next(
        (
            i
            for i, item in enumerate(events if isinstance(events, list) else [])
            if isinstance(item, Mapping) and item.get("type") in ("harness.model.responded", "ModelCallCompleted")
        ),
        0,
    )
    if isinstance(exc, UsageTooLarge):
        return UsageTooLarge(f"event {index}: {exc.message}", **{**exc.details, "index": index})
    return UsageTooLarge(
        f"event {index}: the workspace's usage totals of the day or the month would pass what the ledger "
        "holds (a bigint of tokens, 12 digits of dollars)",
        index=index,
        field="payload.response.usage",
    )


def holding(*, workspace: Workspace, run_id: str, columns: tuple[str, ...] | None = HEAD_FIELDS) -> Head:
    """The run's head row locked until the caller's transaction ends (one must be open); NotFound
    when the run does not exist. `columns`: what of the row to read (None: all of it)."""
    run = strategies.lock_head(workspace=workspace, run_id=run_id, columns=columns)
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    return Head(run)


class Head:
    """A run's head row, locked by `holding`: appends under that lock, and the lease it shows."""

    __slots__ = ("run",)

    def __init__(self, run: Run) -> None:
        self.run = run

    def append(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        expected_sequence: int | None = None,
        fencing_token: Any = None,
        late_calls: bool = False,
    ) -> AppendResult:
        """Append under the lock, in the caller's transaction. No savepoint: a refusal raised here
        must end the caller's transaction. An empty batch writes nothing and only answers to the
        fence, for a caller whose row changes need no event. `late_calls`: the OTLP receiver's
        model calls reported after the run ended (`late: true`, rules.LATE_CALL_TYPES) are taken;
        for every other writer they are `run_finished`, as docs/api.md says."""
        if not events:
            rules.check_fencing(self.run, fencing_token, strategies.now_ms())
            return AppendResult(events=[], last_sequence=self.run.last_sequence)
        batch = prepare.batch(self.run.workspace, events, expected_sequence)
        try:
            return strategies.locked(self.run, batch, expected_sequence, fencing_token, late_calls=late_calls)
        except (UsageTooLarge, DataError, IntegrityError) as exc:
            refusal = usage_too_large(exc, list(events))
            if refusal is exc:
                raise
            raise refusal from None

    def leased(self, now: datetime) -> bool:
        """Whether an executor holds the run's lease now."""
        return rules.lease_live(self.run.lease_expires_at, now)

    def holder_token(self, now: datetime) -> int | None:
        """The token to write with beside the holder (rules.holder_token)."""
        return rules.holder_token(self.run, now)
