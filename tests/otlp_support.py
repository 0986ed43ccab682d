"""What the OTLP tests share: a span as OTLP/JSON writes it (tests/test_otlp.py posts them to the
receiver, tests/test_otlp_ingest.py hands them to the ingest), and an export read back through
opentelemetry-proto."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def any_value(v: Any) -> dict[str, Any]:
    """A Python value as an OTLP/JSON AnyValue; a dict is taken as one already ({"doubleValue": 200.0})."""
    if isinstance(v, dict):
        return v
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": v}


def json_span(
    span_id: str,
    name: str,
    start: int,
    end: int,
    parent: str,
    trace: str,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "traceId": trace,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": any_value(v)} for k, v in (attributes or {}).items()],
        "status": {},
    }


def parse_otlp_json(document: dict[str, Any]) -> ExportTraceServiceRequest:
    """OTLP/JSON through protobuf's own JSON mapping (strict: an unknown field fails): only the
    hex ids become base64 first, the one place OTLP/JSON differs from the mapping."""

    def ids(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId") else ids(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [ids(v) for v in value]
        return value

    return json_format.ParseDict(ids(document), ExportTraceServiceRequest())


def value_of(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attributes(span: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in span.attributes}
