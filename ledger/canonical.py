"""RFC 8785 canonical JSON, digests and event ids.

Everything that is hashed in the ledger goes through here, so that an event id computed by a
harness, by Little Workflow and by us agree byte for byte (tests/data/vectors.json).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import orjson
import rfc8785


class NotCanonicalizable(ValueError):
    """A value that has no RFC 8785 form (NaN, infinities, an integer that is not the shortest
    ECMAScript form of a double, lone surrogates)."""


# Integers in ±(2**53 - 1) are exact doubles and written as digits. rfc8785 refuses any integer
# beyond; we take one exactly when its digits are what ECMAScript's Number::toString writes for
# the double it denotes (`_double_int`), which is what a JavaScript writer (Little Workflow) hashed.
_INT_LIMIT = 2**53 - 1


def ecma_number(number: float) -> str:
    """ECMAScript Number::toString of a finite double (`5e-7`, `1e+21`, `100000000000000000000`)."""
    return rfc8785.dumps(float(number)).decode()


def _double_int(number: int) -> float | None:
    """The double an integer beyond ±(2**53 - 1) denotes, when the integer's digits are that
    double's shortest ECMAScript form (1152921504606847000 yes, 1152921504606846976 no: the same
    double, which ECMAScript writes as 1152921504606847000); None otherwise."""
    try:
        double = float(number)
    except OverflowError:
        return None
    if double != double or double in (float("inf"), float("-inf")):
        return None
    return double if ecma_number(double) == str(number) else None


def _as_doubles(value: Any) -> Any:
    """`value` with every integer beyond ±(2**53 - 1) replaced by the double it denotes, or
    NotCanonicalizable naming the first that is not a double's shortest form."""
    kind = type(value)
    if kind is int and not -_INT_LIMIT <= value <= _INT_LIMIT:
        double = _double_int(value)
        if double is None:
            try:
                shortest = ecma_number(float(value))
            except (OverflowError, rfc8785.CanonicalizationError):
                shortest = "none: it is beyond the largest double"
            digits = str(value)
            raise NotCanonicalizable(
                f"{digits if len(digits) <= 40 else digits[:20] + '…' + digits[-8:]} is not the shortest form of a JSON (double) number "
                f"(the double nearest it is written {shortest})"
            )
        return double
    if isinstance(value, dict):
        return {k: _as_doubles(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_doubles(v) for v in value]
    return value


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
    pop, extend = stack.pop, stack.extend
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
    except rfc8785.IntegerDomainError:
        pass  # an integer beyond ±(2**53 - 1): taken when it is a double's shortest form
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError, RecursionError) as exc:
        raise NotCanonicalizable(str(exc)) from exc
    try:
        return rfc8785.dumps(_as_doubles(value))
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError, RecursionError) as exc:
        raise NotCanonicalizable(str(exc)) from exc


def canonical_bytes_plain(value: Any) -> bytes:
    """`canonical_bytes` of a value its caller has already walked for `_orjson_is_canonical`'s
    conditions (ledger.log.redaction.Redactor.plain checks them in its own walk)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        return canonical_bytes(value)  # lone surrogates, nesting past orjson's limit


def canonical_json(value: Any) -> str:
    return canonical_bytes(value).decode("utf-8")


def _plain_for_orjson(value: Any) -> bool:
    """True when orjson writes `value`'s numbers as ECMAScript does: no float anywhere, every
    integer within ±(2**53 - 1)."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
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
            extend(item.values())
        elif kind is list or kind is tuple:
            extend(item)
        else:
            return False
    return True


def _ecma_numbers(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return orjson.Fragment(ecma_number(value))
    if kind is int and not -_INT_LIMIT <= value <= _INT_LIMIT:
        return orjson.Fragment(str(value) if _double_int(value) is not None else ecma_number(float(value)))
    if isinstance(value, dict):
        return {k: _ecma_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_ecma_numbers(v) for v in value]
    return value


def ecma_token(token: str) -> str:
    """A JSON number token (as orjson or Python writes it: `1e20`, `1e-06`, `-0.0`, `1.0`) in the
    ECMAScript form `_ecma_numbers` gives its value: the same double, spelt as JavaScript does."""
    if "." in token or "e" in token or "E" in token:
        return ecma_number(float(token))
    number = int(token)
    if -_INT_LIMIT <= number <= _INT_LIMIT:
        return token
    return token if _double_int(number) is not None else ecma_number(float(number))


def ecma_dumps(value: Any, *, option: int = 0, default: Any = None) -> bytes:
    """Compact JSON of `value` as JavaScript's JSON.stringify writes it: keys in their order,
    non-ASCII raw, numbers in ECMAScript form (`5e-7`, `1e+21`, `100`, never Python's `5e-07`
    or `100.0`). What leaves the product as JSON text (`ledger events`, NDJSON, exports,
    evidence) goes through here, so that its numbers read as the ids were computed over."""
    if not _plain_for_orjson(value):
        value = _ecma_numbers(value)
    return orjson.dumps(value, option=option, default=default)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    """`sha256:<hex>` over the canonical JSON of `value` (Little Workflow's sha256Digest)."""
    return "sha256:" + sha256_hex(canonical_bytes(value))


def event_id(*, run_id: str, sequence: int, type: str, payload: Any, occurrence_id: str | None = None) -> str:
    return event_id_for_canonical(
        run_id=run_id,
        sequence=sequence,
        type=type,
        payload_canonical=canonical_bytes(payload),
        occurrence_id=occurrence_id,
    )


# RFC 8785 composes: an object whose members are canonical values, written in key order, is
# itself canonical. The write path already holds each payload's canonical bytes, so the hashed
# envelopes below are assembled around them instead of canonicalizing the payload again.
# Key order (UTF-16 code units): occurrenceId < payload < runId < sequence < type.


def _canonical_str(text: str) -> bytes:
    # A str's RFC 8785 form is orjson's (the fast path's argument above); a lone surrogate makes
    # orjson raise, and canonical_bytes refuses it as before.
    if text.__class__ is str:
        try:
            return orjson.dumps(text)
        except orjson.JSONEncodeError:
            pass
    return canonical_bytes(text)


def _canonical_int(number: int) -> bytes:
    if number.__class__ is int and -_INT_LIMIT <= number <= _INT_LIMIT:
        return str(number).encode()
    return canonical_bytes(number)


def event_id_for_canonical(
    *, run_id: str, sequence: int, type: str, payload_canonical: bytes, occurrence_id: str | None = None
) -> str:
    """`evt_` + 16 hex of sha256 over canonical {runId, sequence, type, payload[, occurrenceId]}."""
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise NotCanonicalizable("sequence must be an integer")
    head = b'{"occurrenceId":' + _canonical_str(occurrence_id) + b"," if occurrence_id is not None else b"{"
    body = b"".join(
        (
            head,
            b'"payload":',
            payload_canonical,
            b',"runId":',
            _canonical_str(run_id),
            b',"sequence":',
            _canonical_int(sequence),
            b',"type":',
            _canonical_str(type),
            b"}",
        )
    )
    return "evt_" + sha256_hex(body)[:16]


class EventIds:
    """`event_id_for_canonical` for the events of one run, with the parts every event of the run
    shares (its id, the canonical text of each type) written once."""

    def __init__(self, run_id: str) -> None:
        self._run = b',"runId":' + _canonical_str(run_id) + b',"sequence":'
        self._types: dict[str, bytes] = {}

    def __call__(self, sequence: int, type: str, payload_canonical: bytes, occurrence_id: str | None) -> str:
        if sequence.__class__ is not int:
            raise NotCanonicalizable("sequence must be an integer")
        tail = self._types.get(type)
        if tail is None or type.__class__ is not str:
            tail = self._types[type] = b',"type":' + _canonical_str(type) + b"}"
        head = b'{"occurrenceId":' + _canonical_str(occurrence_id) + b"," if occurrence_id is not None else b"{"
        return (
            "evt_"
            + hashlib.sha256(
                b"".join((head, b'"payload":', payload_canonical, self._run, _canonical_int(sequence), tail))
            ).hexdigest()[:16]
        )


def request_digest_for_canonical(*, type: str, payload_canonical: bytes, occurrence_id: str | None = None) -> str:
    """`digest({type, occurrenceId?, payload})`, the idempotency digest of one event."""
    head = b'{"occurrenceId":' + _canonical_str(occurrence_id) + b"," if occurrence_id is not None else b"{"
    body = b"".join((head, b'"payload":', payload_canonical, b',"type":', _canonical_str(type), b"}"))
    return "sha256:" + sha256_hex(body)


class PayloadDecoder(json.JSONDecoder):
    """JSON text to the values the fold decodes a stored payload to (orjson, as
    ledger.log.envelopes.decode_payload), for the projections' JSON columns.

    PostgreSQL's jsonb keeps a number as a decimal and writes it back as one: `1e+21` comes back
    as `1000000000000000000000` and `6.02214076e+23` as `602214076000000000000000`, integers the
    standard decoder would read as such, unequal to the fold's double (and with no canonical
    form). orjson reads an integer beyond 64 bits as the double it denotes, as the fold's own
    decoding of the canonical text does, so the column reads back exactly the fold's value.
    """

    def decode(self, s: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return orjson.loads(s)
        except orjson.JSONDecodeError:
            return super().decode(s, *args, **kwargs)


# A JSON text's `\u0000` escape (one not itself escaped: an even run of backslashes before it).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
NUL_STAND_IN = "\ufffd"


def nul_as_stand_in(text: str) -> str:
    """JSON text with each U+0000 in its strings as U+FFFD: what a projection's JSON column holds
    for an imported log's NUL, which PostgreSQL's jsonb cannot (the log itself keeps it)."""
    return _NUL_ESCAPE.sub(lambda m: m.group(1) + NUL_STAND_IN, text) if "\\u0000" in text else text


def without_nul(value: Any) -> Any:
    """`value` with U+0000 in its strings and keys as U+FFFD (`nul_as_stand_in` on values)."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_STAND_IN) if "\x00" in value else value
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nul(v) for v in value]
    return value
