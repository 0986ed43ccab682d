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
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


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
        json_format.ParseDict(_map_ids(document, _hex_to_b64, "resourceSpans"), request, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise InvalidOtlp(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}", field="") from None
    except RecursionError:
        raise InvalidOtlp("the body is nested too deeply", field="") from None
    return request


def to_otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """The request as OTLP/JSON: camelCase, hex ids, enums as integers, int64 as strings."""
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    return _map_ids(document, _b64_to_hex, "resourceSpans")


def _map_ids(value: Any, convert: Callable[[str, str], str], where: str) -> Any:
    """`value` with every trace/span id string converted (ids sit in spans and their links only,
    but walking the whole document keeps this independent of the schema's nesting)."""
    if isinstance(value, dict):
        return {
            k: (
                convert(v, f"{where}.{k}")
                if k in _ID_FIELDS and isinstance(v, str)
                else _map_ids(v, convert, f"{where}.{k}")
            )
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_map_ids(v, convert, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


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
