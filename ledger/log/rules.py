"""The rule book of the log: every rule an append (or a service writing beside it) obeys, written
once, with the SQL that enforces it on PostgreSQL beside its Python form.

The locked strategy checks the Python forms on the rows it holds under the run's head lock. The
one-statement strategies cannot read before they write, so they put the SQL forms into the
conditional head update (ledger/log/statements.py) or into the condition of a row change attached
to it (the tool gateway's claim and completion): when one does not hold, nothing is written and
the locked strategy decides, on the rows, with the Python form. So the two forms must say the
same thing; that is why they sit side by side here.

| rule | Python (locked) | SQL (one statement) |
|---|---|---|
| expected sequence | `check_expected_sequence` | `HEAD_GUESS` (the guessed end is the expected one) |
| fencing | `check_fencing`, `lease_live` | `FENCING_TOKEN` / `NOT_LEASED` |
| lifecycle order | `check_lifecycle` | none: the guess (`HEAD_GUESS`) makes the cached status the log's |
| idempotent replay | `same_request` on the logged originals | `keys_not_logged`, or the unique index (`GUARDING_CONSTRAINTS`) |
| a tool call is new | the gateway reads its row | `calls_not_known`, `CLAIM_IS_NEW` |
| the caller still holds a tool call | `holds` | `held_condition` |
| the prices and redaction in force | `take_stored_settings` on the settings read with the head | `settings_in_force` |
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..errors import (
    Fenced,
    IdempotencyConflict,
    LedgerError,
    RunAlreadyStarted,
    RunFinished,
    RunNotStarted,
    SequenceConflict,
)
from ..fold import RunState
from ..models import Event, Run, RunStatus, ToolCall, ToolGatewayClaim, Workspace
from .bulk import column, json_text, table
from .prepare import Prepared
from .vocabulary import is_custom

# --- expected sequence ------------------------------------------------------------------------

# The head update of a one-statement append holds only if the run still ends where the writer
# guessed (its cached fold, or the writer's expectedSequence): the guess is the expected sequence.
HEAD_GUESS = "id = %(run_pk)s AND last_sequence = %(before)s"


def check_expected_sequence(expected: int | None, last_sequence: int, *, writes: bool) -> None:
    """A retry of a batch that already landed answers with the originals even though the log has
    moved on since; expectedSequence guards only batches that write something."""
    if expected is not None and writes and expected != last_sequence:
        raise SequenceConflict(
            f"expected the run to end at sequence {expected}, it ends at {last_sequence}",
            expected=expected,
            actual=last_sequence,
        )


# --- the settings in force ----------------------------------------------------------------------

# A batch is redacted with the workspace's redaction rules, priced with its overrides and held
# to its size limits as the writer's Workspace holds them, which a long-lived process (a runtime
# executor, a worker) loaded perhaps long before an admin or the operator changed them elsewhere.
# They must be the stored ones: else a secret pattern added mid-run would not be applied by that
# process, the batch, and the state it caches, would keep the old prices until a reprice, and a
# run would grow past a limit lowered since (or be refused under one raised since).

# The Workspace columns a batch is prepared with and checked against, in the order
# `prepared_with` sends them: last, the size limits `strategies._allocate` holds a run to (the
# per-key rate is the API's, read with the key on every request).
PREPARED_WITH = ("price_overrides", "redact_keys", "redact_value_patterns", "max_events_per_run", "max_bytes_per_run")
# Of them, those `prepare.batch` reads (the rest price the fold).
REDACTION = ("redact_keys", "redact_value_patterns")


@functools.cache
def settings_in_force() -> str:
    """The workspace's stored price overrides, redaction rules and size limits equal the ones the
    batch was prepared with (sent as JSON text, `prepared_with`)."""
    columns = ", ".join(column(Workspace, name) for name in PREPARED_WITH)
    return (
        f"(SELECT jsonb_build_array({columns}) FROM {table(Workspace)}"
        f" WHERE {column(Workspace, 'id')} = %(workspace_pk)s) = %(settings)s::jsonb"
    )


def prepared_with(workspace: Workspace) -> str:
    """The settings a batch of `workspace` is prepared with, as `settings_in_force` compares
    them. Read before the batch is redacted and the table built (`prices_for`): should another
    thread give the Workspace the stored ones in between, the check then misses instead of
    passing on settings the batch was not prepared with."""
    return json_text([getattr(workspace, name) for name in PREPARED_WITH])


def redaction_of(workspace: Workspace) -> tuple[Any, ...]:
    """The redaction rules `workspace` holds: what `prepare.batch` redacts with."""
    return tuple(getattr(workspace, name) for name in REDACTION)


def take_stored_settings(workspace: Workspace, stored: Sequence[Any]) -> None:
    """The settings `workspace`'s row holds (`PREPARED_WITH`, read with the run's head, under its
    lock) become the writer's: this batch is prepared with them (the caller prepares it again if
    `redaction_of` changed), and the writer's next one-statement appends pass
    `settings_in_force` again."""
    for name, value in zip(PREPARED_WITH, stored, strict=True):
        if value != getattr(workspace, name):
            setattr(workspace, name, value)


# --- leases and fencing -----------------------------------------------------------------------


def lease_live(expires_at: datetime | None, now: datetime) -> bool:
    """A lease (of a run, a tool call, a re-execution request) is live until the moment it expires."""
    return expires_at is not None and expires_at > now


# The run is leased to the writer: its token is the current one (0 means never leased).
FENCING_TOKEN = "fencing_token <> 0 AND fencing_token::text = %(token)s"
# A writer without a token: the run must not be leased to anyone now.
NOT_LEASED = "(lease_expires_at IS NULL OR lease_expires_at <= %(now)s)"


def check_fencing(run: Run, fencing_token: Any, now: datetime) -> None:
    if fencing_token is None:
        if lease_live(run.lease_expires_at, now):
            raise Fenced(
                f"run {run.run_id} is leased to {run.lease_owner}; send its fencingToken", runId=run.run_id, leased=True
            )
        return
    if run.fencing_token == 0:
        # Never leased: nobody holds it, and no token was ever given out for it.
        raise Fenced(
            f"run {run.run_id} is not leased, so fencing token {fencing_token} is not its; send no fencingToken",
            runId=run.run_id,
            leased=False,
        )
    if str(fencing_token) != str(run.fencing_token):
        if lease_live(run.lease_expires_at, now):
            raise Fenced(
                f"fencing token {fencing_token} is stale for run {run.run_id}; another executor holds it",
                runId=run.run_id,
                leased=True,
            )
        raise Fenced(
            f"fencing token {fencing_token} is stale for run {run.run_id}: its lease was given out again since, "
            "and the run is not leased now",
            runId=run.run_id,
            leased=False,
        )


def holder_token(run: Run, now: datetime) -> int | None:
    """The token to write with beside the run's holder (a cancel, a tool approval): its own if
    its lease is live, so the write is not a takeover and the holder keeps its lease."""
    return run.fencing_token if lease_live(run.lease_expires_at, now) else None


# --- the run's lifecycle ----------------------------------------------------------------------

# The run's own lifecycle events: the only ones whose fold moves the run's status.
MOVES_STATUS = frozenset({"RunStarted", "RunCompleted", "RunFailed"})
# Little Workflow's runtime writes a cycle's compile and planning events into the run's log before
# RunStarted, and the outer loop's supervise decision after the cycle's run ended (its
# outer-loop.ts); an imported log keeps them where they are, or its event ids would change.
IMPORTED_BEFORE_START = frozenset(
    {
        "OrchestrationRequested",
        "PlannerStarted",
        "PlannerDraftedWorkflow",
        "WorkflowValidationFailed",
        "WorkflowValidationSucceeded",
        "PlannerReuseDecisionRecorded",
        "WorkflowVersionRegistered",
    }
)
IMPORTED_AFTER_END = frozenset({"OuterLoopCycleCompleted"})
# A model call reported after its run ended (an OpenTelemetry span exported after its trace's root,
# docs/otlp.md): it was made, and may have been billed, so the OTLP receiver logs it where the fold
# counts it, marked `late: true`; it moves no status, so the run stays finished as it ended. Only
# that writer may (`Head.append(late_calls=True)`): for `POST …/events` it is run_finished, as
# docs/api.md says of every event but custom.* after the end.
LATE_CALL_TYPES = frozenset({"harness.model.called", "harness.model.responded", "harness.model.failed"})
# RunStatus.finished() as plain strings: the enum's members cost 0.6-1.8 µs a call here, and
# the lifecycle check asks for every event of a batch.
FINISHED = frozenset(status.value for status in RunStatus.finished())


def check_lifecycle(
    state: RunState, last_sequence: int, event_type: str, index: int, imported: bool = False, late: bool = False
) -> None:
    """The run's lifecycle rules for an event after `last_sequence`, read from the fold's status
    (`state` may lag behind `last_sequence` by events that do not move the status). `late`: the
    writer may log late calls and the payload says `late: true` (LATE_CALL_TYPES)."""
    run_id = state.run_id
    if imported and state.status == "pending" and event_type in IMPORTED_BEFORE_START:
        return
    if imported and state.status in FINISHED and event_type in IMPORTED_AFTER_END:
        return
    if imported and state.status == "pending" and event_type == "RunStarted":
        return  # after the compile events above
    if last_sequence == 0 and event_type != "RunStarted":
        raise RunNotStarted(
            f"run {run_id} has no events; its first event must be RunStarted", index=index, runId=run_id
        )
    if last_sequence > 0 and event_type == "RunStarted":
        raise RunAlreadyStarted(f"run {run_id} has already started", index=index, runId=run_id)
    if state.status in FINISHED and not is_custom(event_type) and not (late and event_type in LATE_CALL_TYPES):
        raise RunFinished(
            f"run {run_id} is {state.status}; only custom.* events may follow",
            index=index,
            runId=run_id,
        )


def lifecycle_refusal(run_id: str, types: Sequence[str], *, imported: bool = False) -> tuple[int, LedgerError] | None:
    """The first of a whole log's events (their types, from sequence 1) that an append would
    refuse for the run's lifecycle, with the error; None when it would take them all."""
    state = RunState(run_id=run_id)
    for index, event_type in enumerate(types):
        try:
            check_lifecycle(state, index, event_type, index, imported)
        except LedgerError as exc:
            return index, exc
        # What the fold's run handlers do to the status, the one thing the rules read.
        state.status = {"RunStarted": "running", "RunCompleted": "completed", "RunFailed": "failed"}.get(
            event_type, state.status
        )
    return None


# --- idempotent replays -----------------------------------------------------------------------


def same_request(index: int, prepared: Prepared, original_digest: str | None, conflict: str) -> None:
    """A key sent again must carry the same event (type, occurrence, payload) as its original."""
    if original_digest != prepared.request_digest:
        raise IdempotencyConflict(
            f"event {index}: idempotency key {prepared.idempotency_key!r} {conflict}",
            index=index,
            idempotencyKey=prepared.idempotency_key,
        )


@functools.cache
def keys_not_logged() -> str:
    """None of the batch's keys is in the run's log yet. One index probe per key (a LATERAL with
    LIMIT is never flattened into a join): with `= ANY(array)` the generic plan scanned all of the
    run's rows and filtered them, a cost that grew with the run."""
    return (
        "NOT EXISTS (SELECT 1 FROM json_array_elements_text(%(keys)s::json) AS k(key), LATERAL ("
        f"SELECT 1 FROM {table(Event)} WHERE run_id = %(run_pk)s AND idempotency_key = k.key"
        " LIMIT 1) AS logged)"
    )


@functools.cache
def calls_not_known() -> str:
    """None of the tool calls the batch starts has a projection row yet."""
    return (
        "NOT EXISTS (SELECT 1 FROM json_array_elements_text(%(new_calls)s::json) AS c(call_id), LATERAL ("
        f"SELECT 1 FROM {table(ToolCall)} WHERE run_id = %(run_pk)s AND call_id = c.call_id"
        " LIMIT 1) AS known)"
    )


# Outside a caller's transaction the statement is its own, and these unique indexes hold the keys
# and the new calls instead: a second row for one of them fails the statement, nothing written.
GUARDING_CONSTRAINTS = frozenset({"event_idempotency_key_unique_in_run", "tool_call_unique_in_run"})


# --- the tool gateway's control row -----------------------------------------------------------

_CLAIMS = ToolGatewayClaim._meta.db_table
# Neither the call id nor the idempotency key has a control row in the run. Two probes of the two
# unique indexes: one NOT EXISTS with `call_id = … OR idempotency_key = …` read every claim of the
# run, a cost that grew with the run.
CLAIM_IS_NEW = (
    f"NOT EXISTS (SELECT 1 FROM {_CLAIMS} c WHERE c.run_id = %(run_pk)s AND c.call_id = %(claim_call)s)"
    f" AND NOT EXISTS (SELECT 1 FROM {_CLAIMS} c WHERE c.run_id = %(run_pk)s"
    " AND c.idempotency_key = %(claim_key)s)"
)


def holds(claim: ToolGatewayClaim, lease_token: str, now: datetime) -> bool:
    """The caller still holds the call: claimed, with this lease token, under a live lease."""
    return (
        claim.status == ToolGatewayClaim.Status.CLAIMED
        and hmac.compare_digest(claim.lease_token.encode(), str(lease_token).encode())
        and lease_live(claim.lease_expires_at, now)
    )


def held_row(call_id: str, lease_token: str, outbound_at: datetime | None) -> dict[str, Any]:
    """What the control row of a call holds while the claimer that got this lease still holds it
    (the lease being live is `held_condition`'s last term)."""
    return {
        "call_id": call_id,
        "status": ToolGatewayClaim.Status.CLAIMED,
        "lease_token": lease_token,
        "outbound_at": outbound_at,
    }


def held_condition(
    columns: Sequence[str], *, alias: str = "", values: str | None = None, live_after: str | None = None
) -> str:
    """`holds` in SQL over `held_row`'s `columns`: each equal to its value, the lease live after
    a moment. Placeholders `%s` in order, or named `%(<values>_<i>)s` and `%(<live_after>)s`."""
    prefix = f"{alias}." if alias else ""
    terms = [f"{prefix}{c} = " + (f"%({values}_{i})s" if values else "%s") for i, c in enumerate(columns)]
    return " AND ".join(terms) + f" AND {prefix}lease_expires_at > " + (f"%({live_after})s" if live_after else "%s")
