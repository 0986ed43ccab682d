"""RFC 8785 canonical JSON, digests and event ids.

Everything that is hashed in the ledger goes through here, so that an event id computed by a
harness, by Little Workflow and by us agree byte for byte (see shared/vectors/).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import rfc8785


class NotCanonicalizable(ValueError):
    """A value that has no RFC 8785 form (NaN, infinities, integers beyond 2**53, lone surrogates)."""


# RFC 8785 allows integers in ±(2**53 - 1) only (rfc8785 raises beyond; so must we, via it).
_INT_LIMIT = 2**53 - 1


def _orjson_is_canonical(value: Any) -> bool:
    """True when orjson with sorted keys writes exactly RFC 8785's bytes for `value`.

    That holds for JSON made only of exact dict / list / tuple / str / int (within ±(2**53 - 1)) /
    bool / None, whose object keys are strings inside the Basic Multilingual Plane: orjson escapes
    strings as JCS does (\\b \\f \\n \\r \\t, other controls as lower-case \\u00xx, nothing else),
    and for BMP keys code-point order equals the UTF-16 order JCS sorts by. Floats (ECMAScript
    number formatting differs: 1.0 -> "1", 1e21 -> "1e+21"), larger integers, subclasses and
    non-BMP keys are left to rfc8785. tests/test_canonical_fast_path.py proves the equality.
    """
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int:
            if -_INT_LIMIT <= item <= _INT_LIMIT:
                continue
            return False
        if kind is dict:
            for key in item:
                if type(key) is not str or not (key.isascii() or max(key) <= "\uffff"):
                    return False
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        else:
            return False
    return True


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of `value`: orjson where it is provably identical, rfc8785 otherwise."""
    if _orjson_is_canonical(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # lone surrogates, nesting past orjson's limit: rfc8785 decides (and explains)
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError, RecursionError) as exc:
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
