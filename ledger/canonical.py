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
    body: dict[str, Any] = {"runId": run_id, "sequence": sequence, "type": type, "payload": payload}
    if occurrence_id is not None:
        body["occurrenceId"] = occurrence_id
    return "evt_" + sha256_hex(canonical_bytes(body))[:16]
