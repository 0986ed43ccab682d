"""RFC 8785 canonical JSON, digests and event ids.

Everything that is hashed in the ledger goes through here, so that an event id computed by a
harness, by Little Workflow and by us agree byte for byte (see shared/vectors/).
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


class NotCanonicalizable(ValueError):
    """A value that has no RFC 8785 form (NaN, infinities, integers beyond 2**53, lone surrogates)."""


def canonical_bytes(value: Any) -> bytes:
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError) as exc:
        raise NotCanonicalizable(str(exc)) from exc


def canonical_json(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """`sha256:<hex>` over the canonical JSON of `value` (Little Workflow's sha256Digest)."""
    return "sha256:" + sha256_hex(canonical_bytes(value))


def event_id(
    *, run_id: str, sequence: int, type: str, payload: Any, occurrence_id: str | None = None
) -> str:
    return event_id_for_canonical(run_id=run_id, sequence=sequence, type=type,
                                  payload_canonical=canonical_bytes(payload), occurrence_id=occurrence_id)


# RFC 8785 composes: an object whose members are canonical values, written in key order, is
# itself canonical. The write path already holds each payload's canonical bytes, so the hashed
# envelopes below are assembled around them instead of canonicalizing the payload again.
# Key order (UTF-16 code units): occurrenceId < payload < runId < sequence < type.


def event_id_for_canonical(
    *, run_id: str, sequence: int, type: str, payload_canonical: bytes, occurrence_id: str | None = None
) -> str:
    """`evt_` + 16 hex of sha256 over canonical {runId, sequence, type, payload[, occurrenceId]}."""
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise NotCanonicalizable("sequence must be an integer")
    head = b'{"occurrenceId":' + canonical_bytes(occurrence_id) + b"," if occurrence_id is not None else b"{"
    body = b"".join((
        head, b'"payload":', payload_canonical, b',"runId":', canonical_bytes(run_id),
        b',"sequence":', canonical_bytes(sequence), b',"type":', canonical_bytes(type), b"}",
    ))
    return "evt_" + sha256_hex(body)[:16]


def request_digest_for_canonical(*, type: str, payload_canonical: bytes, occurrence_id: str | None = None) -> str:
    """`digest({type, occurrenceId?, payload})`, the idempotency digest of one event."""
    head = b'{"occurrenceId":' + canonical_bytes(occurrence_id) + b"," if occurrence_id is not None else b"{"
    body = b"".join((head, b'"payload":', payload_canonical, b',"type":', canonical_bytes(type), b"}"))
    return "sha256:" + sha256_hex(body)
