"""A weather agent traced the way users trace theirs: the real `openai` SDK, instrumented by
`opentelemetry-instrumentation-openai-v2` (`genai`) or `openinference-instrumentation-openai`
(`openinference`), exporting with the OpenTelemetry SDK's OTLP/HTTP exporter configured only by the
standard environment (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _HEADERS, OTEL_SERVICE_NAME and the
content-capture variables docs/otlp.md names).

    python tests/otel_agent.py genai|openinference OPENAI_BASE_URL [stream|stream-with-usage|ask-again|two-choices|late]

One request span holds an agent span holding: a chat call that asks for a tool, the tool (a span
made by each convention's own library: util-genai's `handler.tool`, OpenInference's
`@tracer.tool`), and a chat call that answers. With `stream` both chat calls stream, as most
agents' do, without `stream_options` (so the provider reports no usage); `stream-with-usage` asks
for it (`include_usage`). With `ask-again` a first chat call that fails (the provider answered an
error, or hung up) is caught and asked again once, as an agent with a fallback does. With `two-choices` the answering call asks for two
(`n=2`), as a best-of-n agent does. With `late` the request span is another service's, exported
alone as it ends, while the agent's spans (the model calls among them) wait in a BatchSpanProcessor
flushed only after it: they reach the ledger after the run's root span. Prints, as JSON, each span's name, id and times as the SDK recorded
them, for the test to compare with what the ledger shows.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def weather(city: str) -> dict[str, Any]:
    return {"city": city, "celsius": 21}


def chat(client: openai.OpenAI, streaming: str | None, **request: Any) -> dict[str, Any]:
    """One chat completion's message, as a dict; streamed (and read to its end, which ends the
    instrumentation's span) when `streaming` says so."""
    if streaming is None:
        return client.chat.completions.create(**request).choices[0].message.model_dump(exclude_none=True)
    options = {"stream_options": {"include_usage": True}} if streaming == "stream-with-usage" else {}
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(stream=True, **options, **request):
        for choice in chunk.choices:
            message["content"] += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                call = calls.setdefault(part.index, {"type": "function", "function": {"name": "", "arguments": ""}})
                call["id"] = part.id or call.get("id")
                if part.function is not None:
                    call["function"]["name"] += part.function.name or ""
                    call["function"]["arguments"] += part.function.arguments or ""
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    if not message["content"]:
        del message["content"]  # as a reply's message_dump(exclude_none=True) leaves a tool-call message
    return message


def converse(client: openai.OpenAI, run_tool: Any, streaming: str | None = None) -> str:
    messages: list[Any] = [
        {"role": "system", "content": "You are a terse weather agent."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    ask_again, two_choices = streaming == "ask-again", streaming == "two-choices"
    streaming = None if ask_again or two_choices else streaming
    try:
        asked = chat(client, streaming, model="gpt-4o", messages=messages, tools=TOOLS, temperature=0.2)
    except openai.APIError:
        if not ask_again:
            raise
        asked = chat(client, streaming, model="gpt-4o", messages=messages, tools=TOOLS, temperature=0.2)
    messages.append(asked)
    for call in asked.get("tool_calls") or []:
        result = run_tool(call["id"], json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    final = chat(client, streaming, model="gpt-4o", messages=messages, tools=TOOLS, **({"n": 2} if two_choices else {}))
    return str(final.get("content") or "")


def main(convention: str, base_url: str, streaming: str | None = None) -> None:
    seen = InMemorySpanExporter()
    if convention == "openinference":
        from openinference.instrumentation import TracerProvider as OpenInferenceTracerProvider
        from openinference.instrumentation.openai import OpenAIInstrumentor as OpenInferenceInstrumentor

        provider: TracerProvider = OpenInferenceTracerProvider(resource=Resource.create())
        OpenInferenceInstrumentor().instrument(tracer_provider=provider)
    else:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        provider = TracerProvider(resource=Resource.create())
        OpenAIInstrumentor().instrument(tracer_provider=provider)
    late = streaming == "late"
    streaming = None if late else streaming
    # `late`: the batch is flushed only by the shutdown below, after the request span was sent.
    batch = BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=3_600_000) if late else None
    provider.add_span_processor(batch or BatchSpanProcessor(OTLPSpanExporter()))  # endpoint, headers: the environment
    provider.add_span_processor(SimpleSpanProcessor(seen))
    front = provider
    if late:
        front = TracerProvider(resource=Resource.create())
        front.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
        front.add_span_processor(SimpleSpanProcessor(seen))
    tracer = provider.get_tracer("weather-agent", "1.0")
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-test", max_retries=0)

    with front.get_tracer("weather-front", "1.0").start_as_current_span("handle request"):
        if convention == "openinference":

            @tracer.tool(name="get_weather")  # type: ignore[attr-defined]
            def get_weather(city: str) -> dict[str, Any]:
                return weather(city)

            @tracer.agent(name="weather")  # type: ignore[attr-defined]
            def agent(question: str) -> str:
                return converse(client, lambda call_id, args: get_weather(**args), streaming)

            agent("Weather in Paris?")
        else:
            from opentelemetry.util.genai.handler import TelemetryHandler

            handler = TelemetryHandler(tracer_provider=provider)

            def run_tool(call_id: str, args: dict[str, Any]) -> dict[str, Any]:
                with handler.tool("get_weather", tool_call_id=call_id) as invocation:
                    result = weather(**args)
                    if invocation.should_capture_content_on_span:
                        invocation.arguments, invocation.tool_result = args, result
                return result

            with handler.invoke_local_agent(agent_name="weather", request_model="gpt-4o"):
                converse(client, run_tool, streaming)
    if front is not provider:
        front.shutdown()
    provider.shutdown()  # flushes the batch to the ledger
    spans = [
        {
            "name": s.name,
            "spanId": format(s.context.span_id, "016x"),
            "traceId": format(s.context.trace_id, "032x"),
            "parent": format(s.parent.span_id, "016x") if s.parent else None,
            "start": s.start_time,
            "end": s.end_time,
        }
        for s in seen.get_finished_spans()
    ]
    print(json.dumps(spans))


if __name__ == "__main__":
    main(*sys.argv[1:4])
