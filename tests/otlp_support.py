"""What the OTLP tests share: a span as OTLP/JSON writes it (tests/test_otlp.py posts them to the
receiver, tests/test_otlp_ingest.py hands them to the ingest)."""

from __future__ import annotations

from typing import Any


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
