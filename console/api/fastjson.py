"""JSON in and out of the API through orjson: DRF's JSONParser and JSONRenderer, same contract.

A 500-event batch is a few hundred kilobytes each way; the stdlib's decoder and encoder were a
visible share of a batch append over HTTP (bench/ingest.py). Each class takes orjson's path only
where it yields what DRF's would, and hands everything else to DRF's own code, so the error
bodies, their messages and the content types stay those of docs/api.md.
"""

from __future__ import annotations

import codecs
import io
import json
import re
from array import array
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

import orjson
from django.conf import settings
from rest_framework.compat import INDENT_SEPARATORS, SHORT_SEPARATORS
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.utils import json as drf_json
from rest_framework.utils.encoders import JSONEncoder

from ledger.canonical import ecma_token
from ledger.errors import LedgerError
from ledger.limits import MAX_JSON_DEPTH, DuplicateKey, json_depth_exceeds, may_repeat_a_key, nul_path, unique_object

from ..input_limits import decompressed

# orjson decodes an integer beyond 64 bits as a float; the stdlib keeps it exact (and canonical
# JSON then refuses it). Such an integer has at least 19 digits in a row; so does a long string
# of digits, which merely takes the stdlib's path. The body with every ASCII digit made "0" and
# every other byte " " finds such a run by a substring search: a regex took longer than decoding.
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_DIGIT_RUN = b"0" * 19
_UTF8 = frozenset({"utf-8", "utf8", "utf_8"})
# DRF's encoder for what orjson leaves to `default`: Decimal, lazy strings, bytes, querysets, and
# datetimes, dates, times and dataclasses (passed through so they are written as DRF writes them).
_DRF_DEFAULT = JSONEncoder().default
_DUMPS_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# U+2028 or U+2029 in UTF-8, which DRF writes escaped.
_LINE_SEPARATOR = re.compile(b"\xe2\x80[\xa8\xa9]")


class BadBody(LedgerError):
    """A JSON body refused for what it holds rather than how it is written: nested deeper than
    MAX_JSON_DEPTH, or a string with a NUL character (docs/security.md "Input limits"). The code is
    the view's own validation code (`invalid_body_code`: `invalid_event` for appends), else
    `invalid_request`; for a batch of events, details name the event's `index` and its `field`."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.code = code


class UnreadableBody(LedgerError):
    """A compressed body that does not inflate (not gzip or deflate, cut short, bytes after its
    end): as malformed as bad JSON, and named by its header."""

    code = "invalid_json"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="Content-Encoding")


def _refuse(
    parser_context: Mapping[str, Any] | None, message: str, path: list[str | int] | None = None, **details: Any
) -> BadBody:
    view = (parser_context or {}).get("view")
    code = getattr(view, "invalid_body_code", "invalid_request")
    if path is not None:
        if len(path) >= 2 and path[0] == "events" and isinstance(path[1], int):
            details.update(index=path[1], field=".".join(str(p) for p in path[2:]))
        else:
            details["field"] = ".".join(str(p) for p in path)
    return BadBody(code, message, **details)


def _checked(value: Any, body: bytes | None, parser_context: Mapping[str, Any] | None) -> Any:
    # An escaped \u0000 is the only way a NUL gets into JSON (a raw one is malformed): without it, no walk.
    if body is None or b"\\u0000" in body:
        path = nul_path(value)
        if path is not None:
            raise _refuse(parser_context, "strings may not contain the NUL character (U+0000)", path)
    return value


_QUOTE = b'"'
_EMPTY_STRING = b'""'
_ESCAPED_BACKSLASH = b"\\\\"
_ESCAPED_QUOTE = b'\\"'
# Brackets as +1 / -1, every other byte dropped (as ledger.limits counts them).
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS_OR_QUOTES = bytes(b for b in range(256) if b not in b'[]{}"')


def valid_json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """json_depth_exceeds(body, limit) for a body that is valid JSON, several times faster on a
    batch of events: in valid JSON a backslash is only ever inside a string, where escapes pair
    left to right, so with the escaped backslashes and then the escaped quotes removed, every quote
    left opens or closes a string, and the text between the pairs is what is outside strings.

    Only brackets and quotes matter then, and nearly every string holds no bracket: kept alone, such
    a string is an empty pair `""`. Removing every `""` in one left-to-right pass leaves no quote
    exactly when the pairs it removed were each string's own (the first quote is an opening one,
    and a pass that skipped it would leave it), that is when no string holds a bracket; otherwise
    the strings are taken out one by one (split at the quotes). What is left is the document's
    brackets, balanced: a pass that removes every empty `[]` and then every empty `{}` takes one or
    two levels off, so brackets gone within `limit // 2` passes nest no deeper than `limit`; a
    deeper document (or a low limit) is counted through."""
    if b"\\" in body:
        body = body.replace(_ESCAPED_BACKSLASH, b"").replace(_ESCAPED_QUOTE, b"")
    marks = body.translate(None, _NOT_BRACKETS_OR_QUOTES)
    if marks.count(b"[") + marks.count(b"{") <= limit:
        return False
    brackets = marks.replace(_EMPTY_STRING, b"")
    if _QUOTE in brackets:
        brackets = b"".join(marks.split(_QUOTE)[::2])
    left = brackets
    for _ in range(min(_PEELS, limit // 2)):
        left = left.replace(b"[]", b"").replace(b"{}", b"")
        if not left:
            return False
    return max(accumulate(array("b", brackets.translate(_BRACKETS))), default=0) > limit


# Passes of valid_json_too_deep's peeling before it counts: a batch of events nests ~6 levels.
_PEELS = 8


class JsonParser(JSONParser):
    """DRF's JSONParser, decoding a UTF-8 body with orjson when orjson accepts it.

    A body orjson refuses goes to DRF's parser, so malformed JSON is 400 `invalid_json` with the
    stdlib's message as before, and what only the stdlib accepts (a lone surrogate escape, 1e400)
    reaches validation as before. Other charsets are DRF's alone.

    Before any of that, a body sent with `Content-Encoding` is inflated, as the OTLP receiver
    inflates its own (console/input_limits.py `decompressed`: gzip or deflate, 10 MiB once
    inflated, another encoding 415); a body nested deeper than MAX_JSON_DEPTH is refused unparsed;
    after it, an object naming a key twice (`BadBody`, `invalid_json`, `details.key`: orjson keeps
    the last value silently, so a body ledger.limits.may_repeat_a_key cannot clear is read again by
    the stdlib's parser, which names the key) and a string holding a NUL character (`BadBody`, with
    the view's validation code).
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        body = stream.read()
        request = (parser_context or {}).get("request")
        encoding = request.META.get("HTTP_CONTENT_ENCODING") if request is not None else None
        if encoding:
            body = decompressed(body, encoding, unreadable=UnreadableBody)
        utf8 = str((parser_context or {}).get("encoding", "utf-8")).lower() in _UTF8
        if utf8 and _LONG_DIGIT_RUN not in body.translate(_DIGITS_AS_ZEROS):
            # orjson first: it nests 1,024 levels at most and does not recurse in Python, so a deep
            # body costs it nothing dangerous, and a body it reads is valid JSON, whose depth
            # valid_json_too_deep finds faster than json_depth_exceeds (the same answer there).
            try:
                value = orjson.loads(body)
            except orjson.JSONDecodeError:
                pass  # DRF's parser below gives the error (or accepts what only the stdlib reads)
            else:
                if valid_json_too_deep(body):
                    raise self._too_deep(parser_context)
                if may_repeat_a_key(body, value):
                    self._stdlib(body, media_type, parser_context)  # names the repeated key, if one is
                return _checked(value, body, parser_context)
        if json_depth_exceeds(body):
            raise self._too_deep(parser_context)
        return _checked(self._stdlib(body, media_type, parser_context), body if utf8 else None, parser_context)

    @staticmethod
    def _too_deep(parser_context: Mapping[str, Any] | None) -> BadBody:
        return _refuse(
            parser_context,
            f"JSON may nest arrays and objects at most {MAX_JSON_DEPTH} levels deep",
            limit=MAX_JSON_DEPTH,
        )

    def _stdlib(self, body: bytes, media_type: str | None, parser_context: Mapping[str, Any] | None) -> Any:
        """DRF's JSONParser.parse, refusing an object that names a key twice."""
        try:
            text = codecs.getreader((parser_context or {}).get("encoding", settings.DEFAULT_CHARSET))(
                io.BytesIO(body)
            ).read()
            return json.loads(
                text,
                parse_constant=drf_json.strict_constant if self.strict else None,
                object_pairs_hook=unique_object,
            )
        except DuplicateKey as repeated:
            raise BadBody(
                "invalid_json", f"JSON parse error - {repeated}: name each key once", key=repeated.key
            ) from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        except RecursionError:  # a charset whose brackets the depth check cannot see
            raise ParseError("JSON parse error - the document is nested too deeply") from None


class JsonRenderer(JSONRenderer):
    """DRF's JSONRenderer, encoding with orjson: the same media type, compact separators, text as
    UTF-8 with U+2028/U+2029 escaped as DRF escapes them, and DRF's encoder for the types orjson
    does not write as DRF does.

    Floats are orjson's shortest form, spelt differently from Python's below 1e-4 (`1e-7`, not
    `1e-07`): the same number to any JSON parser. An indent asked for, and anything orjson refuses
    (an integer beyond 64 bits, nesting deeper than 254, a type DRF cannot encode either), go to
    DRF's renderer. Text that is not Unicode (a lone surrogate a client sent, echoed in an error)
    is written as JSON's `\\ud800` escape: UTF-8 cannot carry it, and a client's bad input never
    makes a 500.
    """

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is not None and self.get_indent(accepted_media_type or "", renderer_context or {}) is None:
            try:
                out = orjson.dumps(data, default=_DRF_DEFAULT, option=_DUMPS_OPTIONS)
            except orjson.JSONEncodeError:
                pass  # DRF's renderer below writes it
            else:
                if out.isascii() or _LINE_SEPARATOR.search(out) is None:  # the scan of ASCII is the cheap one
                    return out
                return out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
        try:
            rendered: bytes = super().render(data, accepted_media_type, renderer_context)
        except UnicodeEncodeError:
            indent = self.get_indent(accepted_media_type or "", renderer_context or {})
            rendered = json.dumps(
                data,
                cls=self.encoder_class,
                indent=indent,
                ensure_ascii=True,
                allow_nan=not self.strict,
                separators=INDENT_SEPARATORS if indent else SHORT_SEPARATORS,
            ).encode()
        return rendered


# Number tokens orjson (or DRF's encoder, indenting) may write otherwise than ECMAScript: with an
# exponent (`1e20`, `1e-6`, `1e21`, `1e-06`; ECMAScript has `100000000000000000000`, `0.000001`,
# `1e+21`), an integral float (`1.0`, `-0.0`), or 16 digits and more (an integer beyond 2**53 - 1).
# They are found in the text with every digit made `0`, `E` made `e` and what may end a value made
# `|` by substring searches (a regex over megabytes was ten times slower): `0e`, `0.0|`, `0` * 16.
_ZEROED = bytes(
    0x30 if 0x30 <= b <= 0x39 else 0x65 if b == 0x45 else 0x7C if b in b",]} \t\r\n" else b for b in range(256)
)
_MARKS = (b"0e", b"0.0|", b"0" * 16)
_IN_TOKEN = frozenset(b"0.-+e")
_TOKEN = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_VALUE_STARTS = frozenset(b":[,")
_WHITESPACE = frozenset(b" \t\r\n")
_ENDS = frozenset(b",]} \t\r\n")
_ESCAPED_PAIR = re.compile(rb"\\.", re.DOTALL)


def _token_starts(out: bytes) -> list[int]:
    """Where a number token that may need respelling begins, in order: each mark's token, walked
    back to its first byte, kept when a value begins there (after `:`, `[` or `,` and any space)."""
    zeroed = out.translate(_ZEROED)
    starts = set()
    for mark in _MARKS:
        at = zeroed.find(mark)
        while at != -1:
            start = at
            while start > 0 and zeroed[start - 1] in _IN_TOKEN:
                start -= 1
            before = start - 1
            while before >= 0 and out[before] in _WHITESPACE:
                before -= 1
            if before >= 0 and out[before] in _VALUE_STARTS:
                starts.add(start)
            at = zeroed.find(mark, at + len(mark))
    return sorted(starts)


def ecma_numbers_in(out: bytes) -> bytes:
    """Compact or indented JSON text `out` with every number in ECMAScript form (as
    ledger.canonical.ecma_dumps writes them), the rest byte for byte. Text without such a number
    is searched (`_token_starts`) and kept."""
    starts = _token_starts(out)
    if not starts:
        return out
    # In JSON text a backslash is only ever inside a string, where escapes pair left to right: with
    # each pair masked (same length), the quotes left before a position say whether it is in one.
    masked = _ESCAPED_PAIR.sub(b"__", out) if b"\\" in out else out
    pieces: list[bytes] = []
    kept = counted = quotes = 0
    for start in starts:
        quotes += masked.count(b'"', counted, start)
        counted = start
        token = _TOKEN.match(out, start)
        if quotes % 2 or token is None or (token.end() < len(out) and out[token.end()] not in _ENDS):
            continue  # inside a string, or not a number
        written = ecma_token(token.group().decode()).encode()
        if written != token.group():
            pieces += (out[kept:start], written)
            kept = token.end()
    if not pieces:
        return out
    pieces.append(out[kept:])
    return b"".join(pieces)


class EcmaJsonRenderer(JsonRenderer):
    """JsonRenderer with numbers in ECMAScript form (`5e-7`, `1e+21`, `100000000000000000000`, `0`
    for -0.0, `1` for 1.0), as the NDJSON answers, the exports and the evidence zip write them: for
    the reads docs/api.md says do (the evidence, the replay plan, the state). The text is
    JsonRenderer's, its number tokens respelt where they differ (`ecma_numbers_in`): the 3.5 MB
    evidence of a 20,000-event run took ~9 ms to write, ~17 ms so, ~73 ms with the data walked for
    its numbers first as ecma_dumps walks it."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        return ecma_numbers_in(super().render(data, accepted_media_type, renderer_context))
