"""The OTLP wire forms of a trace export request: protobuf, and the OTLP/JSON mapping.

OTLP/JSON is protobuf's JSON mapping with three differences (the OTLP specification, "JSON
Protobuf Encoding"): trace and span ids are hex, not base64; field names may be camelCase or the
proto's own; enums are integers. `proto_json` turns the ids into what `json_format` reads, and
`otlp_json` turns them back, so both directions use the protobuf runtime's own mapping.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ...errors import LedgerError
from ...limits import MAX_JSON_DEPTH, DuplicateKey, json_depth_exceeds, unique_object

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)


class InvalidOtlp(LedgerError):
    code = "invalid_otlp"


class UnsupportedOtlp(LedgerError):
    code = "unsupported_media_type"
    status = 415


def parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest from its protobuf or OTLP/JSON bytes (InvalidOtlp when not one)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError) as exc:
            raise InvalidOtlp(f"the body is not a protobuf ExportTraceServiceRequest: {exc}", field="") from None
        return request
    if media == JSON:
        if json_depth_exceeds(body):
            # The API's limit for every JSON body (docs/security.md): refused before parsing.
            raise InvalidOtlp(
                f"the body nests arrays and objects more than {MAX_JSON_DEPTH} deep", field="", limit=MAX_JSON_DEPTH
            )
        try:
            document = json.loads(body, object_pairs_hook=unique_object)
        except DuplicateKey as repeated:
            raise InvalidOtlp(f"the body is not valid JSON: {repeated}", field="", key=repeated.key) from None
        except (ValueError, RecursionError) as exc:
            raise InvalidOtlp(f"the body is not JSON: {exc}", field="") from None
        if not isinstance(document, dict):
            raise InvalidOtlp("the body must be a JSON object (an OTLP ExportTraceServiceRequest)", field="")
        return from_otlp_json(document)
    raise UnsupportedOtlp(f"Content-Type must be {PROTOBUF} or {JSON}", field="Content-Type")


def from_otlp_json(document: dict[str, Any]) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON document; unknown fields are ignored, as the specification asks receivers."""
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_map_ids(document, _hex_to_b64), request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise InvalidOtlp(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}", field="") from None
    except RecursionError:
        raise InvalidOtlp("the body is nested too deeply", field="") from None
    return request


def to_otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The request as OTLP/JSON: camelCase, hex ids, enums as integers, int64 as strings."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    return _map_ids(document, _b64_to_hex)


def _map_ids(document: Any, convert: Callable[[str, str], str]) -> Any:
    """`document` with the trace and span ids of its spans and their links converted, under either
    of the names protobuf's JSON mapping reads. Only there: an unknown field is ignored, as the
    specification asks receivers, even when a key inside it is named `spanId`. What is not of the
    schema's shape is left as it is, for the parser to refuse."""

    def spans(span: dict[str, Any], at: str) -> dict[str, Any]:
        span = _ids(span, at, _SPAN_IDS, convert)
        return _below(span, at, ("links",), lambda link, where: _ids(link, where, _LINK_IDS, convert))

    def scopes(scope: dict[str, Any], at: str) -> dict[str, Any]:
        return _below(scope, at, ("spans",), spans)

    def resources(resource: dict[str, Any], at: str) -> dict[str, Any]:
        return _below(resource, at, ("scopeSpans", "scope_spans"), scopes)

    if not isinstance(document, dict):
        return document
    return _below(document, "", ("resourceSpans", "resource_spans"), resources)


_SPAN_IDS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
_LINK_IDS = ("traceId", "trace_id", "spanId", "span_id")


def _below(
    item: dict[str, Any], at: str, names: tuple[str, ...], each: Callable[[dict[str, Any], str], dict[str, Any]]
) -> dict[str, Any]:
    """`item` with `each` applied to every object of its list field (by any of `names`)."""
    out = dict(item)
    for name in names:
        if isinstance(out.get(name), list):
            where = f"{at}.{name}" if at else name
            out[name] = [
                each(child, f"{where}[{n}]") if isinstance(child, dict) else child for n, child in enumerate(out[name])
            ]
    return out


def _ids(item: dict[str, Any], at: str, names: tuple[str, ...], convert: Callable[[str, str], str]) -> dict[str, Any]:
    return {k: convert(v, f"{at}.{k}") if k in names and isinstance(v, str) else v for k, v in item.items()}


def _hex_to_b64(value: str, where: str) -> str:
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise InvalidOtlp(f"{where} must be a hex string (OTLP/JSON encodes ids in hex)", field=where) from None
    return base64.b64encode(raw).decode()


def _b64_to_hex(value: str, where: str) -> str:
    try:
        return base64.b64decode(value, validate=True).hex()
    except binascii.Error:  # pragma: no cover - MessageToDict writes valid base64
        raise InvalidOtlp(f"{where} is not base64", field=where) from None
