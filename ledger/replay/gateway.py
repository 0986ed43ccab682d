"""The tool gateway: idempotent tool calls under a lease (docs/design.md §5 item 3).

A harness claims a call before running it, says when the request is about to leave (`outbound`),
and completes it with a result or an error. The control row (ToolGatewayClaim) holds what the log
does not: owner, lease token, the outbound stamp. Every change the log must know about is
appended under the run's head lock in the same transaction as the row change (`log.holding`),
or, in a harness's common case on PostgreSQL (`runtime_batch`), in the same statement
(`log.append(..., attached=...)`), so the row and the `harness.tool_call.*` events never disagree.

Every service locks the run's head row first: it is the row every append locks, so the lock
order is always run → claim, and two claimers of one call are serialized (on SQLite the IMMEDIATE
transaction does the same). The one-statement form keeps that order: its head update takes the
run's row lock before its claim row is written. Which of the two runs a batch is decided once,
in `runtime_batch`; the conditions of its attached changes are the rule book's
(ledger/log/rules.py `CLAIM_IS_NEW`, `held_condition`).
"""

from __future__ import annotations

import functools
import hmac
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.db.models import Q

from .. import audit, clock
from ..canonical import NotCanonicalizable, canonical_bytes, digest
from ..errors import Conflict, IdempotencyConflict, IntegrityFailure, LedgerError, NotFound
from ..limits import written
from ..log import Attached, Head, append, artifacts, holding, rules
from ..log.envelopes import format_recorded_at
from ..log.leases import Lease, renew_locked
from ..log.redaction import Redactor, policy
from ..log.vocabulary import with_origin
from ..models import Run, ToolCall, ToolGatewayClaim, Workspace
from ..transactions import atomic_then_refuse

Status = ToolGatewayClaim.Status

DEFAULT_LEASE_S = 60.0
LEASE_MARGIN_S = 10.0
# Results (or errors) whose canonical JSON is larger than this are kept as artifacts.
INLINE_RESULT_BYTES = 8192
ARTIFACT_KIND = "tool_result"


class ToolCallInProgress(Conflict):
    code = "tool_call_in_progress"


class ToolCallInDoubt(Conflict):
    code = "tool_call_in_doubt"


class LeaseLost(Conflict):
    code = "lease_lost"


class ToolCallNotInDoubt(Conflict):
    code = "tool_call_not_in_doubt"


class InvalidToolCall(LedgerError):
    code = "invalid_request"


@dataclass(frozen=True)
class Claimed:
    call_id: str
    lease_token: str
    lease_expires_at: datetime
    attempt: int
    status: str = "claimed"
    outbound_at: datetime | None = None  # what the row holds: when the request left


@dataclass(frozen=True)
class Finished:
    """A finished call's recorded outcome: what a replay (or a repeated complete) answers."""

    call_id: str
    status: str  # succeeded | failed
    attempt: int
    result: Any = None
    error: Any = None
    duration_ms: float | None = None
    reconciled: bool = False
    idempotent_replay: bool = False


@dataclass(frozen=True)
class Outbound:
    call_id: str
    attempt: int
    outbound_at: datetime
    lease_expires_at: datetime
    status: str = "claimed"


Emit = Callable[[dict[str, Any]], None]  # where a service's events go: appended now, or batched


# --- helpers ---------------------------------------------------------------------------------


def _lock_run(workspace: Workspace, run_id: str) -> Head:
    # The whole row, as the gateway has always read it (tests/test_write_path_sql.py holds the statement).
    return holding(workspace=workspace, run_id=run_id, columns=None)


def _get_claim(run: Run, call_id: str) -> ToolGatewayClaim:
    claim = ToolGatewayClaim.objects.select_for_update().filter(run=run, call_id=call_id).first()
    if claim is None:
        raise NotFound(f"tool call {call_id} not found in run {run.run_id}", runId=run.run_id, callId=call_id)
    return claim


def _redactor(workspace: Workspace) -> Redactor:
    return policy(workspace.redact_keys, workspace.redact_value_patterns)


def _canonical(value: Any, field: str) -> bytes:
    try:
        return canonical_bytes(value)
    except NotCanonicalizable as exc:
        raise InvalidToolCall(f"{field} has no canonical JSON form: {exc}", field=field) from exc


def _lease_seconds(timeout_s: float | None) -> float:
    if timeout_s is None:
        return DEFAULT_LEASE_S
    return max(DEFAULT_LEASE_S, timeout_s + LEASE_MARGIN_S)


def _token_matches(claim: ToolGatewayClaim, lease_token: str) -> bool:
    return hmac.compare_digest(claim.lease_token.encode(), str(lease_token).encode())


def _appender(head: Head, fencing_token: Any) -> Emit:
    def emit(event: dict[str, Any]) -> None:
        head.append([event], fencing_token=fencing_token)

    return emit


def _with_step_path(run: Run, call_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Stamp the step of the call, as its started event named it (the projection kept it)."""
    step_path = _step_path_of(run, call_id)
    return {**payload, "stepPath": step_path} if step_path else payload


def _step_path_of(run: Run, call_id: str) -> str | None:
    return ToolCall.objects.filter(run=run, call_id=call_id).values_list("step_path", flat=True).first()


def lease_ran_out_after_outbound(claim: ToolGatewayClaim, now: datetime) -> bool:
    """The call is in doubt but not yet written down as such (the next touch of the call does)."""
    return (
        claim.status == Status.CLAIMED
        and claim.outbound_at is not None
        and not rules.lease_live(claim.lease_expires_at, now)
    )


def is_in_doubt(claim: ToolGatewayClaim, now: datetime | None = None) -> bool:
    """In doubt, or about to be: the gateway writes a lapsed call down as in doubt on the next
    touch (reconciling is one)."""
    return claim.status == Status.IN_DOUBT or lease_ran_out_after_outbound(claim, now or clock.now())


def _settle_expiry(run: Run, claim: ToolGatewayClaim, now: datetime, emit: Emit) -> bool:
    """A lease that ran out after the request left makes the call in doubt: nobody knows whether
    the tool acted, so it is never retried automatically. True when this call just became so."""
    if not lease_ran_out_after_outbound(claim, now):
        return False
    assert claim.outbound_at is not None  # checked just above, out of mypy's sight
    claim.status = Status.IN_DOUBT
    claim.updated_at = now
    claim.save(update_fields=["status", "updated_at"])
    emit(
        {
            "type": "harness.tool_call.in_doubt",
            "payload": _with_step_path(
                run,
                claim.call_id,
                {
                    "callId": claim.call_id,
                    "toolName": claim.tool_name,
                    "attempt": claim.attempt,
                    "owner": claim.owner,
                    "outboundAt": format_recorded_at(claim.outbound_at),
                    "leaseExpiredAt": format_recorded_at(claim.lease_expires_at),
                },
            ),
        }
    )
    return True


def _in_doubt_error(claim: ToolGatewayClaim) -> ToolCallInDoubt:
    return ToolCallInDoubt(
        f"tool call {claim.call_id} is in doubt: its lease expired after the request left; "
        "an operator must reconcile it",
        callId=claim.call_id,
        attempt=claim.attempt,
    )


def _outcome_columns(workspace: Workspace, run_id: str, call_id: str, field: str, value: Any) -> dict[str, Any]:
    """The row's outcome columns: the value inline, or in an artifact bound to this run and call
    when large."""
    inline = _inline_outcome_columns(field, value)
    if inline is not None:
        return inline
    columns = {"result": None, "error": None, "outcome_ref": "", "outcome_digest": digest({field: value})}
    wrapped = {"kind": ARTIFACT_KIND, "runId": run_id, "callId": call_id, "field": field, "value": value}
    columns["outcome_ref"] = artifacts.store_bytes(workspace, canonical_bytes(wrapped)).ref
    return columns


def _inline_outcome_columns(field: str, value: Any) -> dict[str, Any] | None:
    """The row's outcome columns with the value inline; None when it is too large to be."""
    if len(canonical_bytes(value)) > INLINE_RESULT_BYTES:
        return None
    return {
        "result": value if field == "result" else None,
        "error": value if field == "error" else None,
        "outcome_ref": "",
        "outcome_digest": digest({field: value}),
    }


def _store_outcome(run: Run, claim: ToolGatewayClaim, field: str, value: Any) -> None:
    for name, column in _outcome_columns(run.workspace, run.run_id, claim.call_id, field, value).items():
        setattr(claim, name, column)


def _outcome(run: Run, claim: ToolGatewayClaim) -> tuple[str, Any]:
    """(field, value) of a finished call, re-checking an artifact's scope and hash before use."""
    field = "result" if claim.status == Status.SUCCEEDED else "error"
    if not claim.outcome_ref:
        return field, getattr(claim, field)
    data = artifacts.read_held(
        run.workspace, claim.outcome_ref, f"the stored {field} of tool call {claim.call_id}", callId=claim.call_id
    )
    try:
        wrapped = json.loads(data)
    except ValueError:
        wrapped = None
    if not (
        isinstance(wrapped, dict)
        and wrapped.get("kind") == ARTIFACT_KIND
        and wrapped.get("runId") == run.run_id
        and wrapped.get("callId") == claim.call_id
        and wrapped.get("field") == field
    ):
        raise IntegrityFailure(
            f"the stored {field} of tool call {claim.call_id} belongs to another call",
            callId=claim.call_id,
            ref=claim.outcome_ref,
        )
    return field, wrapped.get("value")


def _finished(run: Run, claim: ToolGatewayClaim, *, replay: bool) -> Finished:
    field, value = _outcome(run, claim)
    return Finished(
        call_id=claim.call_id,
        status=claim.status,
        attempt=claim.attempt,
        result=value if field == "result" else None,
        error=value if field == "error" else None,
        duration_ms=claim.duration_ms,
        reconciled=bool(claim.reconciled_by),
        idempotent_replay=replay,
    )


def _identity_conflict(claim: ToolGatewayClaim, message: str) -> IdempotencyConflict:
    return IdempotencyConflict(message, callId=claim.call_id, idempotencyKey=claim.idempotency_key)


# --- services --------------------------------------------------------------------------------


def _prepare_args(workspace: Workspace, tool_name: str, args: Any) -> tuple[Any, str]:
    args = _redactor(workspace)(args)
    _canonical(args, "args")
    return args, digest({"toolName": tool_name, "args": args})


def prepare_args(workspace: Workspace, tool_name: str, args: Any) -> tuple[Any, str]:
    """The args as the log will hold them (redacted, canonical-checked) and the claim's digest of them."""
    return _prepare_args(workspace, tool_name, args)


@atomic_then_refuse
def claim_tool_call(
    *,
    workspace: Workspace,
    run_id: str,
    call_id: str,
    tool_name: str,
    args: Any,
    effect: str,
    owner: str,
    idempotency_key: str | None = None,
    timeout_s: float | None = None,
    caller: str = "gateway",
    turn: int | None = None,
    step_path: str | None = None,
    fencing_token: Any = None,
) -> Claimed | Finished | LedgerError:
    """Claim a tool call under a lease, or answer with what is known of it.

    Returns Claimed (new, re-claimed after an expiry before outbound, or the holder's own live
    lease) or Finished with idempotent_replay (a finished call with the same identity: nothing
    runs, nothing is appended). Refuses with IdempotencyConflict, ToolCallInProgress, ToolCallInDoubt.
    """
    head = _lock_run(workspace, run_id)
    run = head.run
    args, args_digest = _prepare_args(workspace, tool_name, args)
    return _claim(
        run,
        clock.now(),
        _appender(head, fencing_token),
        call_id=call_id,
        tool_name=tool_name,
        args=args,
        args_digest=args_digest,
        effect=effect,
        owner=owner,
        idempotency_key=idempotency_key,
        timeout_s=timeout_s,
        caller=caller,
        turn=turn,
        step_path=step_path,
    )


def _claim(
    run: Run,
    now: datetime,
    emit: Emit,
    *,
    call_id: str,
    tool_name: str,
    args: Any,
    args_digest: str,
    effect: str,
    owner: str,
    idempotency_key: str | None,
    timeout_s: float | None,
    caller: str,
    turn: int | None,
    step_path: str | None,
    outbound: bool = False,
) -> Claimed | Finished | LedgerError:
    """claim_tool_call's work with the run locked and the args prepared; `outbound` also stamps
    the claim it hands back as outbound, in the same write (the caller's request leaves next)."""
    identity = {
        "call_id": call_id,
        "tool_name": tool_name,
        "args": args,
        "args_digest": args_digest,
        "effect": effect,
        "owner": owner,
        "idempotency_key": idempotency_key,
        "timeout_s": timeout_s,
    }
    new = _claim_new(run.workspace, run.run_id, now, identity, outbound=outbound)
    if new is not None:
        emit(
            _started(
                call_id,
                new.attempt,
                caller=caller,
                tool_name=tool_name,
                args=args,
                effect=effect,
                owner=owner,
                idempotency_key=idempotency_key,
                timeout_s=timeout_s,
                turn=turn,
                step_path=step_path,
            )
        )
        return new
    # The key names the logical call: a harness retrying under a fresh callId still finds it.
    match = (
        Q(call_id=call_id) | Q(idempotency_key=idempotency_key) if idempotency_key is not None else Q(call_id=call_id)
    )
    rows = list(ToolGatewayClaim.objects.select_for_update().filter(match, run=run).order_by("pk"))
    claim = next((row for row in rows if idempotency_key is not None and row.idempotency_key == idempotency_key), None)
    by_call = next((row for row in rows if row.call_id == call_id), None)
    if by_call is not None and (claim is None or by_call.pk != claim.pk):
        if by_call.idempotency_key != idempotency_key:
            return _identity_conflict(by_call, f"tool call {call_id} was claimed with another idempotency key")
        claim = by_call
    assert claim is not None  # the row that stopped _claim_new; the run's lock keeps it there
    if claim.tool_name != tool_name or claim.args_digest != args_digest:
        return _identity_conflict(
            claim, "this idempotency key (or callId) was used for another tool or other arguments"
        )

    if claim.status in (Status.SUCCEEDED, Status.FAILED):
        return _finished(run, claim, replay=True)  # nothing executed, nothing appended
    if claim.status == Status.IN_DOUBT:
        return _in_doubt_error(claim)
    if rules.lease_live(claim.lease_expires_at, now):
        if claim.owner == owner:  # a retried claim of the holder: the same lease again
            if outbound and claim.outbound_at is None:
                claim.outbound_at = claim.updated_at = now
                claim.save(update_fields=["outbound_at", "updated_at"])
            return Claimed(
                claim.call_id, claim.lease_token, claim.lease_expires_at, claim.attempt, outbound_at=claim.outbound_at
            )
        return ToolCallInProgress(
            f"tool call {claim.call_id} is leased to another owner until {clock.iso(claim.lease_expires_at)}",
            callId=claim.call_id,
            leaseExpiresAt=clock.iso(claim.lease_expires_at),
        )
    if _settle_expiry(run, claim, now, emit):
        return _in_doubt_error(claim)
    # Expired before the request left: nothing happened outside, so it may run again.
    claim.attempt += 1
    claim.effect, claim.timeout_s, claim.owner = effect, timeout_s, owner
    claim.lease_token = secrets.token_urlsafe(32)
    claim.lease_expires_at = now + timedelta(seconds=_lease_seconds(timeout_s))
    claim.claimed_at = claim.updated_at = now
    claim.outbound_at = now if outbound else None
    claim.status = Status.CLAIMED
    claim.save()
    emit(
        _started(
            claim.call_id,
            claim.attempt,
            caller=caller,
            tool_name=tool_name,
            args=args,
            effect=effect,
            owner=owner,
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
            turn=turn,
            step_path=step_path,
        )
    )
    return Claimed(
        claim.call_id, claim.lease_token, claim.lease_expires_at, claim.attempt, outbound_at=claim.outbound_at
    )


def _started(
    call_id: str,
    attempt: int,
    *,
    caller: str,
    tool_name: str,
    args: Any,
    effect: str,
    owner: str,
    idempotency_key: str | None,
    timeout_s: float | None,
    turn: int | None,
    step_path: str | None,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "callId": call_id,
        "caller": caller,
        "toolName": tool_name,
        "args": args,
        "effect": effect,
        "attempt": attempt,
        "owner": owner,
    }
    optional = {"idempotencyKey": idempotency_key, "timeoutS": timeout_s, "turn": turn, "stepPath": step_path}
    payload.update({k: v for k, v in optional.items() if v is not None})
    return {"type": "harness.tool_call.started", "payload": payload}


@atomic_then_refuse
def mark_outbound(
    *, workspace: Workspace, run_id: str, call_id: str, lease_token: str, fencing_token: Any = None
) -> Outbound | LedgerError:
    """Stamp that the request is about to leave: from now on an expiry means in doubt."""
    head = _lock_run(workspace, run_id)
    run = head.run
    claim = _get_claim(run, call_id)
    now = clock.now()
    if _settle_expiry(run, claim, now, _appender(head, fencing_token)):
        return _lease_lost(claim)
    if not rules.holds(claim, lease_token, now):
        return _lease_lost(claim)
    if claim.outbound_at is None:  # a repeated outbound keeps the first stamp
        claim.outbound_at = claim.updated_at = now
        claim.save(update_fields=["outbound_at", "updated_at"])
    return Outbound(claim.call_id, claim.attempt, claim.outbound_at, claim.lease_expires_at)


def _lease_lost(claim: ToolGatewayClaim) -> LeaseLost:
    return LeaseLost(
        f"the lease on tool call {claim.call_id} is stale or held by another owner",
        callId=claim.call_id,
        status=claim.status,
        attempt=claim.attempt,
    )


def prepare_outcome(workspace: Workspace, outcome: str, value: Any) -> Any:
    """The value as the log will hold it (redacted); raises for an outcome with no JSON form."""
    if outcome not in ("result", "error"):
        raise InvalidToolCall("send either result or error", field="result")
    value = _redactor(workspace)(value)
    _canonical(value, outcome)
    return value


@atomic_then_refuse
def complete_tool_call(
    *,
    workspace: Workspace,
    run_id: str,
    call_id: str,
    lease_token: str,
    outcome: str,
    value: Any,
    fencing_token: Any = None,
) -> Finished | LedgerError:
    """Record the call's result (`outcome="result"`) or error (`"error"`) under a live lease.

    A stale or foreign lease raises LeaseLost; the holder repeating the same complete gets the
    recorded answer back with idempotent_replay and nothing is appended.
    """
    if outcome not in ("result", "error"):
        raise InvalidToolCall("send either result or error", field="result")
    head = _lock_run(workspace, run_id)
    run = head.run
    value = prepare_outcome(workspace, outcome, value)
    return _complete(
        run,
        clock.now(),
        _appender(head, fencing_token),
        call_id=call_id,
        lease_token=lease_token,
        outcome=outcome,
        value=value,
    )


def _complete(
    run: Run,
    now: datetime,
    emit: Emit,
    *,
    call_id: str,
    lease_token: str,
    outcome: str,
    value: Any,
    step_path: str | None = None,
    held: Claimed | None = None,
) -> Finished | LedgerError:
    """complete_tool_call's work with the run locked and the value prepared. `step_path`, when the
    caller knows it (the one it claimed the call with), saves looking it up; `held`, the claim the
    caller got for this call, lets the common case (it still holds it) skip reading the row."""
    if held is not None and held.lease_token == lease_token:
        done = _complete_held(run.workspace, run.run_id, now, held, outcome, value)
        if done is not None:
            emit(_finished_event(done, outcome, value, step_path or _step_path_of(run, call_id)))
            return done
    claim = _get_claim(run, call_id)
    if (
        claim.status in (Status.SUCCEEDED, Status.FAILED)
        and not claim.reconciled_by
        and _token_matches(claim, lease_token)
        and claim.outcome_digest == digest({outcome: value})
    ):
        return _finished(run, claim, replay=True)  # the holder retrying its own complete
    if _settle_expiry(run, claim, now, emit):
        return _lease_lost(claim)
    if not rules.holds(claim, lease_token, now):
        return _lease_lost(claim)

    status = Status.SUCCEEDED if outcome == "result" else Status.FAILED
    # The tool's own time: from when the request left, else from the claim of this attempt.
    duration_ms = round((now - (claim.outbound_at or claim.claimed_at)).total_seconds() * 1000)
    _store_outcome(run, claim, outcome, value)
    claim.status, claim.duration_ms, claim.finished_at, claim.updated_at = status, duration_ms, now, now
    claim.save(
        update_fields=[
            "result",
            "error",
            "outcome_ref",
            "outcome_digest",
            "status",
            "duration_ms",
            "finished_at",
            "updated_at",
        ]
    )
    done = Finished(
        call_id=claim.call_id,
        status=status,
        attempt=claim.attempt,
        result=value if outcome == "result" else None,
        error=value if outcome == "error" else None,
        duration_ms=duration_ms,
    )
    emit(_finished_event(done, outcome, value, step_path or _step_path_of(run, call_id)))
    return done


def _finished_event(done: Finished, outcome: str, value: Any, step_path: str | None) -> dict[str, Any]:
    payload = {"callId": done.call_id, outcome: value, "durationMs": done.duration_ms, "attempt": done.attempt}
    if step_path:
        payload["stepPath"] = step_path
    return {"type": f"harness.tool_call.{done.status}", "payload": payload}


# --- the common case in one statement --------------------------------------------------------
# A harness claims calls nobody claimed before and completes the calls it holds. The services
# above read the row first, for everything else (a retry, a key used again, a lease that ran
# out); these two write it with one statement whose condition is the common case, and answer
# None when it does not hold, for the service to read the row and sort it out.


def _claim_new(
    workspace: Workspace, run_id: str, now: datetime, identity: Mapping[str, Any], *, outbound: bool
) -> Claimed | None:
    """Insert a claim for a call with no row yet (neither its call id nor its idempotency key has
    one: the unique constraints turn the INSERT into nothing otherwise)."""
    row, claimed = _new_claim(now, identity, outbound=outbound)
    columns, params = _columns(row)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {_CLAIMS} (run_id, {', '.join(columns)}) "
            f"SELECT id, {', '.join(['%s'] * len(columns))} FROM {_RUNS} "
            "WHERE workspace_id = %s AND run_id = %s ON CONFLICT DO NOTHING",
            [*params, workspace.pk, run_id],
        )
        if cursor.rowcount != 1:
            return None
    return claimed


def _new_claim(now: datetime, identity: Mapping[str, Any], *, outbound: bool) -> tuple[dict[str, Any], Claimed]:
    """The row of a first claim of a call (every column but the run), and what the claimer holds."""
    token = secrets.token_urlsafe(32)
    expires = now + timedelta(seconds=_lease_seconds(identity["timeout_s"]))
    row = {
        **identity,
        "lease_token": token,
        "lease_expires_at": expires,
        "attempt": 1,
        "claimed_at": now,
        "outbound_at": now if outbound else None,
        "status": Status.CLAIMED,
        "result": None,
        "error": None,
        "outcome_ref": "",
        "outcome_digest": "",
        "duration_ms": None,
        "finished_at": None,
        "reconciled_by": "",
        "reconcile_note": "",
        "created_at": now,
        "updated_at": now,
    }
    return row, Claimed(identity["call_id"], token, expires, 1, outbound_at=row["outbound_at"])


def _complete_held(
    workspace: Workspace, run_id: str, now: datetime, held: Claimed, outcome: str, value: Any
) -> Finished | None:
    """Record the outcome of a call the caller claimed (`held`), if its lease is still the live one."""
    if held.outbound_at is None:
        return None  # the tool's time counts from the claim, which only the row holds
    changes, done = _held_completion(
        now, held, outcome, value, _outcome_columns(workspace, run_id, held.call_id, outcome, value)
    )
    columns, params = _columns(changes)
    where, keys = _columns(rules.held_row(held.call_id, held.lease_token, held.outbound_at))
    _, (live_after,) = _columns({"lease_expires_at": now})
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {_CLAIMS} SET {', '.join(f'{c} = %s' for c in columns)} "
            f"WHERE {rules.held_condition(where)} "
            f"AND run_id = (SELECT id FROM {_RUNS} WHERE workspace_id = %s AND run_id = %s)",
            [*params, *keys, live_after, workspace.pk, run_id],
        )
        if cursor.rowcount != 1:
            return None
    return done


def _held_completion(
    now: datetime, held: Claimed, outcome: str, value: Any, outcome_columns: Mapping[str, Any]
) -> tuple[dict[str, Any], Finished]:
    """The columns a completion of the held call `held` sets, and its answer."""
    assert held.outbound_at is not None
    status = Status.SUCCEEDED if outcome == "result" else Status.FAILED
    duration_ms = round((now - held.outbound_at).total_seconds() * 1000)  # from when the request left
    changes = {**outcome_columns, "status": status, "duration_ms": duration_ms, "finished_at": now, "updated_at": now}
    return changes, Finished(
        call_id=held.call_id,
        status=status,
        attempt=held.attempt,
        result=value if outcome == "result" else None,
        error=value if outcome == "error" else None,
        duration_ms=duration_ms,
    )


# --- the common case attached to the append's statement (PostgreSQL) --------------------------
# The same two changes as Attached: their condition joins the run head's conditional
# update, so the control row and the events commit in one statement (outside a transaction one
# round trip, one commit) without the head's lock taken first. The parameters are named, each
# value once per use, so that no parameter's type is deduced from two contexts.


def _attached_claim(row: Mapping[str, Any], db: Any = None) -> Attached:
    """Insert the first claim `row` (`_new_claim`) if neither its call id nor its idempotency key
    has a row in the run. A row that appears after the condition's snapshot fails the INSERT on
    the unique constraints, and with it the whole statement."""
    columns, values = _columns(row, db)
    names, sql = _claim_shape(columns)
    params = dict(zip(names, values))
    params.update(claim_call=row["call_id"], claim_key=row["idempotency_key"])
    return Attached(name="claim", condition=rules.CLAIM_IS_NEW, params=params, sql=sql)


@functools.lru_cache(maxsize=16)
def _claim_shape(columns: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The parameter names and the statement of `_attached_claim` for a row of `columns`: the
    same text for every claim of that shape, built once (with its parameters' names) instead of
    per call."""
    names = tuple(f"claim_{i}" for i in range(len(columns)))
    return names, (
        f"INSERT INTO {_CLAIMS} (run_id, {', '.join(columns)}) "
        f"SELECT head.id, {', '.join(f'%({name})s' for name in names)} FROM head RETURNING 1"
    )


def _attached_completion(now: datetime, held: Claimed, changes: Mapping[str, Any], db: Any = None) -> Attached:
    """Set `changes` (`_held_completion`) on the row of the call `held`, if its claimer still holds
    it under a live lease. `db`: the default connection, if the caller has it at hand."""
    columns, values = _columns(changes, db)
    where, keys = _columns(rules.held_row(held.call_id, held.lease_token, held.outbound_at), db)
    _, (live_after,) = _columns({"lease_expires_at": now}, db)
    shape = _completion_shape(columns, where)
    params = dict(zip(shape.sets, values))
    params.update(zip(shape.where, keys))
    params.update(zip(shape.cond, keys))
    params.update(done_live_after=live_after, done_cond_live_after=live_after)
    return Attached(name="done", params=params, condition=shape.condition, sql=shape.sql)


@dataclass(frozen=True)
class _CompletionShape:
    sets: tuple[str, ...]  # the parameters' names: the columns set
    where: tuple[str, ...]  # the held row's values, in the UPDATE's WHERE
    cond: tuple[str, ...]  # the same values, in the head's condition (each value once per use)
    condition: str
    sql: str


@functools.lru_cache(maxsize=16)
def _completion_shape(columns: tuple[str, ...], where: tuple[str, ...]) -> _CompletionShape:
    """`_attached_completion`'s condition and statement for `columns` set on a row held as
    `where` says, built once per shape (with its parameters' names) instead of per call."""
    held_then = rules.held_condition(where, alias="c", values="done_cond", live_after="done_cond_live_after")
    held_now = rules.held_condition(where, alias="c", values="done_where", live_after="done_live_after")
    sets = ", ".join(f"{c} = %(done_{i})s" for i, c in enumerate(columns))
    return _CompletionShape(
        sets=tuple(f"done_{i}" for i in range(len(columns))),
        where=tuple(f"done_where_{i}" for i in range(len(where))),
        cond=tuple(f"done_cond_{i}" for i in range(len(where))),
        condition=f"EXISTS (SELECT 1 FROM {_CLAIMS} c WHERE c.run_id = %(run_pk)s AND {held_then})",
        sql=f"UPDATE {_CLAIMS} c SET {sets} FROM head WHERE c.run_id = head.id AND {held_now} RETURNING 1",
    )


_CLAIMS, _RUNS = ToolGatewayClaim._meta.db_table, Run._meta.db_table
_CLAIM_FIELDS = {f.name: f for f in ToolGatewayClaim._meta.concrete_fields}


def _columns(values: Mapping[str, Any], db: Any = None) -> tuple[tuple[str, ...], list[Any]]:
    """The columns of ToolGatewayClaim's fields `values` names, and the values as this backend
    stores them (JSON, datetimes). `db`: the default connection, if the caller has it at hand."""
    # The connection itself, looked up once: every attribute of the `connection` proxy is a
    # context-local lookup, and the fields' conversions ask it for `ops` once per value (a claim's
    # row went from ~190 µs to ~60 µs; four of these per model call with its tool call).
    if db is None:
        db = connections[DEFAULT_DB_ALIAS]
    key = (db.vendor, tuple(values))
    columns = _QUOTED.get(key)
    if columns is None:
        columns = _QUOTED[key] = tuple(db.ops.quote_name(str(_CLAIM_FIELDS[name].column)) for name in values)
    # What Django's conversion would hand back unchanged goes as it is (most of a row: its text
    # columns, a status among them, NULLs, and on PostgreSQL aware datetimes); the rest (JSON,
    # integers) through it.
    times = _TIMES_PASS if db.vendor == "postgresql" else frozenset()
    return columns, [
        v
        if v is None
        or (name in _TEXTS and isinstance(v, str))
        or (name in times and type(v) is datetime and v.tzinfo is not None)
        else _CLAIM_FIELDS[name].get_db_prep_save(v, db)
        for name, v in values.items()
    ]


_QUOTED: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}
# The fields whose get_db_prep_save is the value itself for these values. None is also NULL as it
# is for every field (JSONField's None too: SQL NULL). CharField/TextField.to_python keeps any str,
# a str-valued choice (Status) too; a DateTimeField keeps an aware datetime and PostgreSQL's
# adapt_datetimefield_value returns it.
_TEXTS = frozenset(
    f.name for f in ToolGatewayClaim._meta.concrete_fields if isinstance(f, (models.CharField, models.TextField))
)
_TIMES_PASS = frozenset(f.name for f in ToolGatewayClaim._meta.concrete_fields if isinstance(f, models.DateTimeField))


@dataclass(frozen=True)
class Batch:
    """What runtime_batch did: the completion's and the claim's answers, where the log ends."""

    completed: Finished | None
    claimed: Claimed | Finished | None
    last_sequence: int
    lease: Lease | None = None  # the run lease, renewed by this write


def runtime_batch(
    *,
    workspace: Workspace,
    run_id: str,
    fencing_token: Any = None,
    complete: dict[str, Any] | None = None,
    events: Sequence[Mapping[str, Any]] = (),
    claim: dict[str, Any] | None = None,
    origin: str | None = None,
    renew: Lease | None = None,
) -> Batch:
    """In ONE transaction and one append: complete a call (complete_tool_call's keywords, the
    value already through prepare_outcome), then `events`, then claim a call and stamp it
    outbound (claim_tool_call's keywords). For a harness whose writes have no effect outside
    between them: the outcome of one call and the intent of the next commit together, and a
    claim is outbound in the commit that precedes the request.

    A refusal of the completion stops there (nothing after it is written); a refusal of the claim
    comes after `events`. Either way what was written (an in-doubt fact) commits, then it raises.
    `origin` (a re-execution's live calls) is stamped on the model and tool events written.
    `renew`, the run lease of the writer, is renewed in the same transaction (Fenced if taken over).

    The common case (a claim of a call never claimed, the completion of a call the caller holds
    under its live lease, no renewal) is one statement on PostgreSQL and takes no lock of its own
    (`_in_one_statement`): outside a transaction one round trip, one commit. Anything else (a
    renewal, a row that exists, a refusal, a miss of the guessed head, SQLite, where the log
    answers None to an attached append) goes the locked way.
    """
    if renew is None and complete is None and claim is None and events:
        # Events alone: the log's append outside a transaction is one statement when its guess holds.
        return Batch(
            None,
            None,
            append(
                workspace=workspace,
                run_id=run_id,
                events=[with_origin(e, origin) for e in events],
                fencing_token=fencing_token,
            ).last_sequence,
        )
    if renew is None:
        done = _in_one_statement(
            workspace=workspace,
            run_id=run_id,
            fencing_token=fencing_token,
            complete=complete,
            events=events,
            claim=claim,
            origin=origin,
        )
        if done is not None:
            return done
    return _locked(
        workspace=workspace,
        run_id=run_id,
        fencing_token=fencing_token,
        complete=complete,
        events=events,
        claim=claim,
        origin=origin,
        renew=renew,
    )


def _in_one_statement(
    *,
    workspace: Workspace,
    run_id: str,
    fencing_token: Any,
    complete: dict[str, Any] | None,
    events: Sequence[Mapping[str, Any]],
    claim: dict[str, Any] | None,
    origin: str | None,
) -> Batch | None:
    """runtime_batch's common case as one statement: the control rows attached to the append
    (`log.append(..., attached=...)`), whose head update checks the fence, the guessed head and the rows'
    conditions at once. None, with nothing written, when it is not the common case or the
    database did not confirm it; the locked way then sorts it out on what the rows hold."""
    now = clock.now()
    db = connections[DEFAULT_DB_ALIAS]
    batch: list[Mapping[str, Any]] = []
    attached: list[Attached] = []
    completed: Finished | None = None
    claimed: Claimed | None = None
    if complete is not None:
        held, step_path = complete.get("held"), complete.get("step_path")
        if held is None or step_path is None or held.lease_token != complete["lease_token"] or held.outbound_at is None:
            return None
        outcome, value = complete["outcome"], complete["value"]
        columns = _inline_outcome_columns(outcome, value)
        if columns is None:
            return None  # its artifact is written in the locked way's transaction
        changes, completed = _held_completion(now, held, outcome, value, columns)
        attached.append(_attached_completion(now, held, changes, db))
        batch.append(_finished_event(completed, outcome, value, step_path))
    batch.extend(events)
    if claim is not None:
        args, args_digest = _prepare_args(workspace, claim["tool_name"], claim["args"])
        identity = {k: claim[k] for k in ("call_id", "tool_name", "effect", "owner", "idempotency_key", "timeout_s")}
        row, claimed = _new_claim(now, {**identity, "args": args, "args_digest": args_digest}, outbound=True)
        attached.append(_attached_claim(row, db))
        batch.append(
            _started(
                claimed.call_id,
                claimed.attempt,
                caller=claim["caller"],
                tool_name=claim["tool_name"],
                args=args,
                effect=claim["effect"],
                owner=claim["owner"],
                idempotency_key=claim["idempotency_key"],
                timeout_s=claim["timeout_s"],
                turn=claim["turn"],
                step_path=claim["step_path"],
            )
        )
    if not batch:
        return None  # nothing to append: only the locked way answers to the fence then
    result = append(
        workspace=workspace,
        run_id=run_id,
        events=[with_origin(e, origin) for e in batch],
        fencing_token=fencing_token,
        attached=attached,
    )
    return None if result is None else Batch(completed, claimed, result.last_sequence)


@atomic_then_refuse
def _locked(
    *,
    workspace: Workspace,
    run_id: str,
    fencing_token: Any,
    complete: dict[str, Any] | None,
    events: Sequence[Mapping[str, Any]],
    claim: dict[str, Any] | None,
    origin: str | None,
    renew: Lease | None,
) -> Batch | LedgerError:
    """runtime_batch with the run's head locked first: every case, refusals included."""
    args = None
    if claim is not None:
        args, args_digest = _prepare_args(workspace, claim["tool_name"], claim["args"])
    head = holding(workspace=workspace, run_id=run_id)
    run = head.run
    lease = renew_locked(run=run, lease=renew) if renew is not None else None
    now = clock.now()
    batch: list[Mapping[str, Any]] = []
    completed: Finished | None = None
    claimed: Claimed | Finished | None = None
    refusal: LedgerError | None = None
    if complete is not None:
        done = _complete(run, now, batch.append, **complete)
        if isinstance(done, LedgerError):
            refusal = done
        else:
            completed = done
    if refusal is None:
        batch.extend(events)
        if claim is not None:
            got = _claim(run, now, batch.append, **{**claim, "args": args}, args_digest=args_digest, outbound=True)
            if isinstance(got, LedgerError):
                refusal = got
            else:
                claimed = got
    # An empty batch (a replayed claim) appends nothing: the rows changed still answer to the fence.
    batch = [with_origin(event, origin) for event in batch]
    last = head.append(batch, fencing_token=fencing_token).last_sequence
    return refusal or Batch(completed, claimed, last, lease)


@atomic_then_refuse
def reconcile_tool_call(
    *,
    workspace: Workspace,
    run_id: str,
    call_id: str,
    outcome: str,
    value: Any,
    note: str,
    by: str,
    fencing_token: Any = None,
) -> Finished | LedgerError:
    """An operator settles a call in doubt as succeeded (with its result) or failed (its error).

    Only from in doubt (a claimed call whose lease ran out after outbound counts: it is written
    down as in doubt first); anything else raises ToolCallNotInDoubt.
    """
    if outcome not in (Status.SUCCEEDED, Status.FAILED):
        raise InvalidToolCall("outcome must be succeeded or failed", field="outcome")
    note = written(note, field="note", label="note", error=InvalidToolCall, workspace=workspace)
    head = _lock_run(workspace, run_id)
    run = head.run
    claim = _get_claim(run, call_id)
    now = clock.now()
    _settle_expiry(run, claim, now, _appender(head, fencing_token))
    if claim.status != Status.IN_DOUBT:
        return ToolCallNotInDoubt(
            f"tool call {call_id} is {claim.status}; only a call in doubt can be reconciled",
            callId=call_id,
            status=claim.status,
        )
    field = "result" if outcome == Status.SUCCEEDED else "error"
    value = _redactor(workspace)(value)
    _canonical(value, field)
    _store_outcome(run, claim, field, value)
    claim.status, claim.finished_at, claim.updated_at = outcome, now, now
    claim.reconciled_by, claim.reconcile_note = by, note
    claim.save()
    head.append(
        [
            {
                "type": "harness.tool_call.reconciled",
                "payload": _with_step_path(
                    run,
                    call_id,
                    {
                        "callId": call_id,
                        "outcome": outcome,
                        field: value,
                        "note": note,
                        "by": by,
                        "attempt": claim.attempt,
                    },
                ),
            }
        ],
        fencing_token=fencing_token,
    )
    audit.record(
        actor=by,
        tenant=workspace.tenant,
        workspace=workspace,
        action=audit.Action.TOOL_CALL_RECONCILED,
        target=f"{run_id}/{call_id}",
        reason=note,
        details={"runId": run_id, "callId": call_id, "toolName": claim.tool_name, "outcome": outcome},
    )
    return Finished(
        call_id=call_id,
        status=outcome,
        attempt=claim.attempt,
        result=value if field == "result" else None,
        error=value if field == "error" else None,
        reconciled=True,
    )


@transaction.atomic
def settle_expired_claims(*, workspace: Workspace, run_id: str, fencing_token: Any = None) -> list[str]:
    """Write down as in doubt every call of the run whose lease ran out after its request left
    (otherwise that is only discovered when someone touches the call). The call ids settled now."""
    head = _lock_run(workspace, run_id)
    run = head.run
    now = clock.now()
    expired = (
        ToolGatewayClaim.objects.select_for_update()
        .filter(run=run, status=Status.CLAIMED, outbound_at__isnull=False, lease_expires_at__lte=now)
        .order_by("pk")
    )
    emit = _appender(head, fencing_token)
    return [claim.call_id for claim in expired if _settle_expiry(run, claim, now, emit)]


@transaction.atomic
def declare_in_doubt(
    *,
    workspace: Workspace,
    run_id: str,
    call_id: str,
    lease_token: str,
    reason: str,
    fencing_token: Any = None,
    **details: Any,
) -> int:
    """The holder of a claimed, outbound call gives up on it without an outcome (its tool outlived
    its timeout): nobody knows whether it acted, so the call is in doubt now, as a lease running out
    would make it, and an operator must reconcile it. The log's new end; LeaseLost (nothing written)
    when the caller no longer holds the call."""
    head = _lock_run(workspace, run_id)
    run = head.run
    claim = _get_claim(run, call_id)
    now = clock.now()
    if claim.status != Status.CLAIMED or not _token_matches(claim, lease_token) or claim.outbound_at is None:
        raise _lease_lost(claim)
    claim.status, claim.updated_at = Status.IN_DOUBT, now
    claim.save(update_fields=["status", "updated_at"])
    payload = _with_step_path(
        run,
        call_id,
        {
            "callId": call_id,
            "toolName": claim.tool_name,
            "attempt": claim.attempt,
            "owner": claim.owner,
            "outboundAt": format_recorded_at(claim.outbound_at),
            "reason": reason,
            **details,
        },
    )
    return head.append(
        [{"type": "harness.tool_call.in_doubt", "payload": payload}], fencing_token=fencing_token
    ).last_sequence


def abandon_for_cancel(run: Run, now: datetime, emit: Emit, reason: str) -> tuple[list[str], list[str]]:
    """A cancelled run's calls still claimed (ledger/replay/cancellation.py, with the run locked): a
    write call whose request left is in doubt (nobody knows whether the tool acted; an operator
    reconciles it), every other call is abandoned, recorded as failed with `Cancelled`. Its holder
    completing it later is refused (`lease_lost`). The call ids (abandoned, in doubt)."""
    abandoned: list[str] = []
    in_doubt: list[str] = []
    claims = ToolGatewayClaim.objects.select_for_update().filter(run=run, status=Status.CLAIMED).order_by("pk")
    for claim in claims:
        if claim.effect == ToolGatewayClaim.Effect.WRITE and claim.outbound_at is not None:
            claim.lease_expires_at = min(claim.lease_expires_at, now)  # cancelling ends its lease now
            claim.save(update_fields=["lease_expires_at"])
            _settle_expiry(run, claim, now, emit)
            in_doubt.append(claim.call_id)
            continue
        error = {"name": "Cancelled", "message": reason}
        duration_ms = round((now - (claim.outbound_at or claim.claimed_at)).total_seconds() * 1000)
        _store_outcome(run, claim, "error", error)
        claim.status, claim.duration_ms, claim.finished_at, claim.updated_at = Status.FAILED, duration_ms, now, now
        claim.save(
            update_fields=[
                "result",
                "error",
                "outcome_ref",
                "outcome_digest",
                "status",
                "duration_ms",
                "finished_at",
                "updated_at",
            ]
        )
        done = Finished(
            call_id=claim.call_id, status=Status.FAILED, attempt=claim.attempt, error=error, duration_ms=duration_ms
        )
        emit(_finished_event(done, "error", error, _step_path_of(run, claim.call_id)))
        abandoned.append(claim.call_id)
    return abandoned, in_doubt


# --- selectors -------------------------------------------------------------------------------


def first_call_in_doubt(*, workspace: Workspace, run_id: str) -> ToolGatewayClaim | None:
    """The run's oldest call in doubt, written down as such or with a lease that ran out after the
    request left: the run may not continue until an operator reconciles it."""
    return (
        ToolGatewayClaim.objects.filter(run__workspace=workspace, run__run_id=run_id)
        .filter(
            Q(status=Status.IN_DOUBT)
            | Q(status=Status.CLAIMED, outbound_at__isnull=False, lease_expires_at__lte=clock.now()),
        )
        .order_by("pk")
        .first()
    )


def tool_call_rows(
    run: Run, *, after_pk: int = 0, limit: int = 50, status: str | None = None
) -> list[ToolGatewayClaim]:
    """The run's control rows in claim order, `limit` of them after the row `after_pk`."""
    qs = ToolGatewayClaim.objects.filter(run=run, pk__gt=after_pk).order_by("pk")
    if status:
        qs = qs.filter(status=status)
    return list(qs[:limit])


def calls_in_doubt(run: Run, plan: Mapping[str, Any] | None) -> set[str]:
    """The calls a person must see as in doubt: those the replay plan `plan` reports missing as in
    doubt (it replays an in-doubt call's outcome once reconciled; until then the call blocks the
    replay), and those whose lease ran out after the request left, before the gateway wrote them
    down (`in_doubt_call_ids`)."""
    missing = plan["replayReady"]["missing"] if plan else []
    reported = {
        m[len("tool:") : -len(":in_doubt")] for m in missing if m.startswith("tool:") and m.endswith(":in_doubt")
    }
    return reported | in_doubt_call_ids(run)


def in_doubt_call_ids(run: Run) -> set[str]:
    """Calls in doubt or about to be (`is_in_doubt`), read now."""
    now = clock.now()
    rows = ToolGatewayClaim.objects.filter(run=run, status__in=[Status.CLAIMED, Status.IN_DOUBT])
    return {c.call_id for c in rows if is_in_doubt(c, now)}
