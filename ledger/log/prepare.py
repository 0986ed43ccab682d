"""A batch made ready for the log, before any lock is taken and without the database: each item
validated against the vocabulary, redacted, turned into canonical bytes, its idempotency digest
computed. The event id needs the sequence, so it is computed when the batch is numbered
(`strategies.allocate`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..canonical import NotCanonicalizable, canonical_bytes, canonical_bytes_plain, request_digest_for_canonical
from ..errors import InvalidEvent, InvalidRunId
from ..limits import MAX_ROW_ID, NUL, nul_path
from ..models import Workspace
from .redaction import NotPlain, Redactor, policy
from .vocabulary import column_text_with_nul, reject_recorded_cost, validate_fields

# Published as is (docs/api.md, the OpenAPI schema), so written for ECMAScript too; matched with
# fullmatch, since `$` alone also matches before a trailing newline ("run_a\n" would pass).
RUN_ID_RE = re.compile(r"^run_[A-Za-z0-9_-]{1,80}$")
MAX_BATCH = 5000
MAX_KEY_LENGTH = 200


@dataclass
class Prepared:
    type: str
    payload: dict[str, Any]  # redacted, as sent
    canonical: bytes  # canonical JSON of `payload`
    occurrence_id: str | None
    idempotency_key: str | None
    request_digest: str | None


def validate_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.fullmatch(run_id):
        raise InvalidRunId(f"run id must match {RUN_ID_RE.pattern}", runId=run_id if isinstance(run_id, str) else None)
    return run_id


def redactor(workspace: Workspace) -> Redactor:
    """The workspace's redaction policy, built-ins and its own rules."""
    return policy(workspace.redact_keys, workspace.redact_value_patterns)


def batch(workspace: Workspace, events: Any, expected_sequence: Any, *, imported: bool = False) -> list[Prepared]:
    """Validate, redact and canonicalize the batch."""
    check_batch(events, expected_sequence)
    redact = redactor(workspace)
    return [item(i, event, redact, imported=imported) for i, event in enumerate(events)]


def check_batch(events: Any, expected_sequence: Any) -> None:
    """The request's shape, before its items are looked at."""
    if not isinstance(events, Sequence) or isinstance(events, (str, bytes)) or not events:
        raise InvalidEvent("events must be a non-empty list", field="events")
    if len(events) > MAX_BATCH:
        raise InvalidEvent(f"a batch holds at most {MAX_BATCH} events", field="events")
    if expected_sequence is not None and (
        isinstance(expected_sequence, bool) or not isinstance(expected_sequence, int) or expected_sequence < 0
    ):
        raise InvalidEvent("expectedSequence must be a non-negative integer", field="expectedSequence")
    if expected_sequence is not None and expected_sequence > MAX_ROW_ID:
        # Sequences are bigints: past a signed 64-bit integer is bad input, not a conflict.
        raise InvalidEvent(
            f"expectedSequence must be at most {MAX_ROW_ID} (a signed 64-bit integer)",
            field="expectedSequence",
            limit=MAX_ROW_ID,
        )


def stored_payload(workspace: Workspace, index: int, event: Mapping[str, Any]) -> bytes:
    """The canonical payload the log would store for request item `event` (validated, redacted),
    or the LedgerError an append would raise: for a caller that checks a whole log before writing
    any of it (`ledger import-little`)."""
    return item(index, event, redactor(workspace), imported=True).canonical


def item(index: int, event: Any, redact: Redactor, *, imported: bool = False) -> Prepared:
    """One request item `{type, payload, idempotencyKey?, occurrenceId?}`, checked as it came in."""
    if event.__class__ is not dict and not isinstance(event, Mapping):
        raise InvalidEvent(f"event {index} must be an object", index=index, field="")
    event_type = event.get("type")
    if not isinstance(event_type, str) or not event_type or len(event_type) > 200 or not _is_text(event_type):
        raise InvalidEvent(f"event {index}: type must be a non-empty string", index=index, field="type")
    occurrence_id = _optional_str(index, event, "occurrenceId")
    key = _optional_str(index, event, "idempotencyKey")
    if redact.changes_name(event_type):
        _refuse_secret(index, "type", event_type, redact)
    if key is not None:
        _refuse_secret(index, "idempotencyKey", key, redact)
    payload = event.get("payload", {})
    to_canonical = canonical_bytes
    try:
        validate_fields(index, event_type, payload, imported=imported)
        try:
            if imported:
                # Little Workflow's fold never reads an event's own costUsd (run-state.ts); a
                # session rollup may hold one, and its id hashes it: the long way, without the rule.
                raise NotPlain
            # One walk redacts, and shows that the recorded-cost rule has nothing to find and that
            # orjson writes the canonical form; any other payload takes the three walks.
            payload, to_canonical = redact.plain(payload), canonical_bytes_plain
        except (NotPlain, RecursionError):
            if not imported:
                reject_recorded_cost(index, payload)
            payload = redact(payload)
    except RecursionError:
        # A body the JSON parser accepted can still be deeper than these recursive walks go.
        raise InvalidEvent(f"event {index}: payload is nested too deeply", index=index, field="payload") from None
    try:
        canonical = to_canonical(payload)
    except NotCanonicalizable as exc:
        raise InvalidEvent(
            f"event {index}: payload has no canonical JSON form: {exc}", index=index, field="payload"
        ) from exc
    # PostgreSQL's jsonb cannot hold U+0000 (SQLite could): refused on both. Canonical JSON writes
    # it as \u0000, so only a payload whose canonical form holds that is walked.
    # An imported log keeps its NULs (Little Workflow's store holds them as \u0000 in its JSON
    # text, as ours does): only a string a text column keeps is refused; the projections' JSON
    # columns hold them as U+FFFD (ledger.log.projection.column_json).
    if imported:
        if b"\\u0000" in canonical and (field := column_text_with_nul(event_type, payload)) is not None:
            raise InvalidEvent(
                f"event {index}: payload.{field} may not contain the NUL character (U+0000)",
                index=index,
                field=f"payload.{field}",
            )
    elif b"\\u0000" in canonical and (where := nul_path(payload)) is not None:
        raise InvalidEvent(
            f"event {index}: strings may not contain the NUL character (U+0000)",
            index=index,
            field=".".join(["payload", *map(str, where)]),
        )
    request_digest = None
    if key is not None:
        request_digest = request_digest_for_canonical(
            type=event_type, payload_canonical=canonical, occurrence_id=occurrence_id
        )
    return Prepared(event_type, payload, canonical, occurrence_id, key, request_digest)


def _refuse_secret(index: int, field: str, value: str, redact: Redactor) -> None:
    """An event's type and idempotency key are hashed into its id and digest, so a secret in them
    cannot be replaced where it stands: the event is refused instead."""
    if redact.scrub(value) != value:
        raise InvalidEvent(
            f"event {index}: {field} holds what looks like a secret; it is stored as sent, so it may not",
            index=index,
            field=field,
        )


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


def _optional_str(index: int, event: Mapping[str, Any], field: str) -> str | None:
    value = event.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH or not _is_text(value):
        raise InvalidEvent(
            f"event {index}: {field} must be a non-empty string of at most {MAX_KEY_LENGTH} characters",
            index=index,
            field=field,
        )
    return value
