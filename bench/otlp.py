"""The OTLP row of bench/ingest.py: GenAI spans/s through `POST /api/v1/otlp/v1/traces` on Daphne,
against the same events POSTed to the append endpoint on the same Daphne, interleaved request by
request. The ratio is what decoding OTLP protobuf and mapping spans to events costs on top of
writing the events those spans become.

The exports are what an instrumented agent's BatchSpanProcessor sends: 512 spans (its default
max_export_batch_size), four traces of 128 spans each (a request span, an invoke_agent span, and
63 chat spans with 63 execute_tool spans between them), uncompressed protobuf.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

from bench.common import record, start_daphne, stop

SPANS_PER_TRACE = 128
TRACES_PER_EXPORT = 4
_T0 = 1_764_547_200_000_000_000


def _export(trace_ids: list[bytes]) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def kv(key: str, value: Any) -> KeyValue:
        return KeyValue(
            key=key, value=AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
        )

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(kv("service.name", "bench-agent"))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "bench"
    for trace_id in trace_ids:
        root, agent = secrets.token_bytes(8), secrets.token_bytes(8)
        calls = SPANS_PER_TRACE - 2
        for i in range(calls):
            span = scope.spans.add(
                trace_id=trace_id,
                span_id=secrets.token_bytes(8),
                parent_span_id=agent,
                start_time_unix_nano=_T0 + i * 1000,
                end_time_unix_nano=_T0 + i * 1000 + 900,
            )
            if i % 2 == 0:
                span.name = "chat gpt-4o-mini"
                span.attributes.extend(
                    [
                        kv("gen_ai.operation.name", "chat"),
                        kv("gen_ai.provider.name", "openai"),
                        kv("gen_ai.request.model", "gpt-4o-mini"),
                        kv("gen_ai.usage.input_tokens", 1200),
                        kv("gen_ai.usage.output_tokens", 150),
                    ]
                )
            else:
                span.name = "execute_tool vendors.lookup"
                span.attributes.extend(
                    [
                        kv("gen_ai.operation.name", "execute_tool"),
                        kv("gen_ai.tool.name", "vendors.lookup"),
                        kv("gen_ai.tool.call.id", f"t{i}"),
                        kv("gen_ai.tool.call.arguments", '{"vendorId": "v_1", "limit": 1}'),
                    ]
                )
        end = _T0 + calls * 1000 + 1000
        scope.spans.add(
            trace_id=trace_id,
            span_id=agent,
            parent_span_id=root,
            name="invoke_agent bench",
            start_time_unix_nano=_T0 - 10,
            end_time_unix_nano=end,
            attributes=[kv("gen_ai.operation.name", "invoke_agent")],
        )
        scope.spans.add(
            trace_id=trace_id,
            span_id=root,
            name="handle request",
            start_time_unix_nano=_T0 - 20,
            end_time_unix_nano=end + 10,
        )
    return request.SerializeToString()


def print_otlp(workspace: Any, appender: Any, spans: int, copy_rate: float) -> None:
    """`copy_rate`: raw COPY's events/s, measured earlier in the same run."""
    import httpx
    import orjson

    from ledger.interop.otlp.ingest import ingest
    from ledger.interop.otlp.wire import PROTOBUF, parse
    from ledger.models import Run
    from ledger.reads import selectors
    from ledger.tenancy.services import create_key

    per_export = SPANS_PER_TRACE * TRACES_PER_EXPORT
    exports = max(2, spans // per_export)

    def traces() -> list[bytes]:
        return [secrets.token_bytes(16) for _ in range(TRACES_PER_EXPORT)]

    # The baseline's requests: what each export's traces become, read back from an untimed ingest of
    # the same shape in this process, re-addressed to fresh run ids.
    shape = [traces() for _ in range(exports)]
    append_bodies: list[list[tuple[str, bytes]]] = []
    for trace_ids in shape:
        ingest(workspace=workspace, request=parse(_export(trace_ids), PROTOBUF))
        bodies = []
        for trace_id in trace_ids:
            run = Run.objects.get(workspace=workspace, run_id=f"run_otel_{trace_id.hex()}")
            appender.run_ids.append(run.run_id)
            events = [{"type": e["type"], "payload": e["payload"]} for e in selectors.events(run)]
            bodies.append((appender.new_run_id(), orjson.dumps({"events": events})))
        append_bodies.append(bodies)
    otlp_bodies = []
    for _ in range(exports):
        trace_ids = traces()
        appender.run_ids.extend(f"run_otel_{t.hex()}" for t in trace_ids)
        otlp_bodies.append(_export(trace_ids))

    _, key = create_key(workspace=workspace, scopes=["ingest"])
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-otlp-daphne-{os.getpid()}.log"
    process, base = start_daphne(log_path)
    otlp_s = append_s = 0.0
    try:
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:

            def send(url: str, body: bytes, content_type: str) -> None:
                response = client.post(url, content=body, headers={"Content-Type": content_type})
                if response.status_code != 200 or (
                    content_type == "application/json" and b"partialSuccess" in response.content
                ):
                    raise SystemExit(f"OTLP bench request failed: {response.status_code} {response.text[:300]}")

            warm = traces()
            appender.run_ids.extend(f"run_otel_{t.hex()}" for t in warm)
            send("/api/v1/otlp/v1/traces", _export(warm), PROTOBUF)
            for otlp_body, appends in zip(otlp_bodies, append_bodies):
                start = time.perf_counter()
                send("/api/v1/otlp/v1/traces", otlp_body, PROTOBUF)
                otlp_s += time.perf_counter() - start
                start = time.perf_counter()
                for run_id, body in appends:
                    send(f"/api/v1/runs/{run_id}/events", body, "application/json")
                append_s += time.perf_counter() - start
    finally:
        stop(process)
    total = exports * per_export
    events = sum(len(orjson.loads(body)["events"]) for appends in append_bodies for _, body in appends)
    otlp_rate, append_rate = total / otlp_s, total / append_s
    ratio = otlp_rate / append_rate
    print(
        f"\nOTLP: {exports} protobuf exports of {per_export} GenAI spans ({TRACES_PER_EXPORT} traces each, "
        f"{events / total:.2f} events per span), through Daphne, interleaved with the same events appended"
    )
    print(f"  OTLP /v1/traces          {total:>8} spans {otlp_s:9.3f}s {otlp_rate:>10,.0f} spans/s")
    print(
        f"  the same events appended {total:>8} spans {append_s:9.3f}s {append_rate:>10,.0f} spans/s"
        f"   ({TRACES_PER_EXPORT} requests per export, one per run)"
    )
    events_rate = events / otlp_s
    print(
        f"  OTLP ingest runs at {ratio:.0%} of appending what it writes; it writes {events_rate:,.0f} events/s, "
        f"{events_rate / copy_rate:.1%} of raw COPY"
    )
    record(
        "OTLP spans through Daphne / the same events appended",
        value=otlp_rate,
        unit="spans/s",
        baseline=append_rate,
        ratio=ratio,
        target="",
        met=None,
        ratio_format="{:.0%}",
        note=f"{per_export}-span protobuf exports, {events / total:.2f} events per span; "
        f"{events_rate:,.0f} events/s = {events_rate / copy_rate:.1%} of raw COPY",
    )
