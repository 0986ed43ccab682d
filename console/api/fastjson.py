"""JSON in and out of the API through orjson: DRF's JSONParser and JSONRenderer, same contract.

A 500-event batch is a few hundred kilobytes each way; the stdlib's decoder and encoder were a
visible share of a batch append over HTTP (bench/ingest.py). Each class takes orjson's path only
where it yields what DRF's would, and hands everything else to DRF's own code, so the error
bodies, their messages and the content types stay those of API.md.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import orjson
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

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


class JsonParser(JSONParser):
    """DRF's JSONParser, decoding a UTF-8 body with orjson when orjson accepts it.

    A body orjson refuses goes to DRF's parser, so malformed JSON is 400 `invalid_json` with the
    stdlib's message as before, and what only the stdlib accepts (a lone surrogate escape, 1e400)
    reaches validation as before. Other charsets are DRF's alone. Nesting too deep for the
    stdlib's decoder is 400 `invalid_json` too, where its RecursionError used to be a 500.
    """

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        if str((parser_context or {}).get("encoding", "utf-8")).lower() in _UTF8:
            body = stream.read()
            if _LONG_DIGIT_RUN not in body.translate(_DIGITS_AS_ZEROS):
                try:
                    return orjson.loads(body)
                except orjson.JSONDecodeError:
                    pass  # DRF's parser below gives the error (or accepts what only the stdlib reads)
            stream = io.BytesIO(body)
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the document is nested too deeply") from None


class JsonRenderer(JSONRenderer):
    """DRF's JSONRenderer, encoding with orjson: the same media type, compact separators, text as
    UTF-8 with U+2028/U+2029 escaped as DRF escapes them, and DRF's encoder for the types orjson
    does not write as DRF does.

    Floats are orjson's shortest form, spelt differently from Python's below 1e-4 (`1e-7`, not
    `1e-07`): the same number to any JSON parser. An indent asked for, and anything orjson refuses
    (an integer beyond 64 bits, nesting deeper than 254, a type DRF cannot encode either), go to
    DRF's renderer.
    """

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is not None and self.get_indent(accepted_media_type or "", renderer_context or {}) is None:
            try:
                out = orjson.dumps(data, default=_DRF_DEFAULT, option=_DUMPS_OPTIONS)
            except orjson.JSONEncodeError:
                pass  # DRF's renderer below writes it
            else:
                return out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
        rendered: bytes = super().render(data, accepted_media_type, renderer_context)
        return rendered
