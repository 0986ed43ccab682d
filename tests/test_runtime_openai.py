"""The openai-compatible provider, against a chat completions server on 127.0.0.1 started by the
test (never the internet): an ai.generate step with a tool call round-trip through the runtime,
the wire format the server receives, usage and cost on the recorded events, and one clear error
for timeouts, unreachable servers, non-2xx answers and unreadable replies, none with the key, each
saying whether the request left (a call that may have been paid for)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ledger.canonical import canonical_json
from ledger.log.envelopes import log_of
from ledger.log.verify import verify_run
from ledger.models import CostEntry, Run, Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.model import request_left
from ledger.runtime.openai_compat import (
    API_KEY_ENV,
    BASE_URL_ENV,
    MODEL_ENV,
    PROVIDER_ENV,
    TIMEOUT_ENV,
    ModelProviderError,
    OpenAICompatibleProvider,
    chat_message,
)
from ledger.runtime.providers import ModelRequest
from ledger.runtime.registry import AIGenerate, Tool, Workflow

KEY = "sk-test-Zq81secret"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class ChatServer:
    """Answers POST /v1/chat/completions from a queue of (status, body, delay_s) and keeps what it
    received: path, headers, JSON body."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any, float]] = []
        self.received: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length", "0"))
                server.received.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(self.rfile.read(length))}
                )
                status, body, delay = server.replies.pop(0) if server.replies else (500, {"error": "no reply"}, 0)
                time.sleep(delay)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def reply(self, body: Any, status: int = 200, delay_s: float = 0.0) -> None:
        self.replies.append((status, body, delay_s))


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat = ChatServer()
    chat.thread.start()
    yield chat
    chat.httpd.shutdown()
    chat.httpd.server_close()


def completion(
    *, content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def weather_call(call_id: str = "call_1", arguments: str = '{"city": "Oslo"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "weather", "arguments": arguments}}


def workflow(provider: OpenAICompatibleProvider, weather_calls: list[Any] | None = None) -> Workflow:
    def weather(args: Any) -> dict[str, Any]:
        if weather_calls is not None:
            weather_calls.append(args)
        return {"city": args["city"], "tempC": 5}

    return Workflow(
        name="openai_weather",
        steps=(AIGenerate("ask", "How warm is Oslo?", system="You answer briefly.", tools=("weather",)),),
        tools={"weather": Tool("weather", weather, description="Current weather in a city", parameters=WEATHER_PARAMS)},
        models={"default": provider},
    )


def provider_for(server: ChatServer, **kwargs: Any) -> OpenAICompatibleProvider:
    kwargs.setdefault("model", "gpt-4o-mini")
    return OpenAICompatibleProvider(base_url=server.base_url, api_key=KEY, **kwargs)


def _events(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    return log_of(Run.objects.get(workspace=workspace, run_id=run_id))


def test_ai_generate_round_trips_a_tool_call_and_records_mapped_usage_and_cost(
    workspace: Workspace, server: ChatServer
) -> None:
    server.reply(
        completion(
            tool_calls=[weather_call()],
            usage={
                "prompt_tokens": 1000,
                "completion_tokens": 50,
                "total_tokens": 1050,
                "prompt_tokens_details": {"cached_tokens": 400},
                "completion_tokens_details": {"reasoning_tokens": 20},
            },
        )
    )
    server.reply(completion(content="Oslo is 5 °C.", usage={"prompt_tokens": 1100, "completion_tokens": 8}))
    calls: list[Any] = []

    outcome = start_run(workspace=workspace, workflow=workflow(provider_for(server), calls), input={})

    assert (outcome.status, outcome.output) == ("completed", "Oslo is 5 °C.")
    assert calls == [{"city": "Oslo"}]
    events = _events(workspace, outcome.run_id)
    responded = [e["payload"] for e in events if e["type"] == "harness.model.responded"]
    assert [r["model"] for r in responded] == [{"provider": "openai", "modelId": "gpt-4o-mini"}] * 2
    assert responded[0]["response"]["toolCalls"] == [{"id": "call_1", "name": "weather", "args": {"city": "Oslo"}}]
    assert responded[0]["response"]["usage"] == {
        "inputTokens": 1000,
        "outputTokens": 50,
        "cachedInputTokens": 400,
        "reasoningTokens": 20,
    }
    assert responded[1]["response"]["usage"] == {"inputTokens": 1100, "outputTokens": 8}
    costs = list(CostEntry.objects.filter(run__run_id=outcome.run_id).order_by("sequence"))
    # gpt-4o-mini: 0.15 in, 0.075 cached, 0.6 out per 1M: (600*0.15 + 400*0.075 + 50*0.6) / 1e6
    assert [c.cost_usd for c in costs] == [Decimal("0.000150"), Decimal("0.0001698")]
    assert [(c.cached_input_tokens, c.reasoning_tokens) for c in costs] == [(400, 20), (0, 0)]
    assert [
        c for c in verify_run(Run.objects.get(workspace=workspace, run_id=outcome.run_id)) if c.status == "fail"
    ] == []
    assert KEY not in canonical_json(events)


def test_the_server_receives_openai_messages_tools_and_the_bearer_key(workspace: Workspace, server: ChatServer) -> None:
    server.reply(completion(tool_calls=[weather_call()]))
    server.reply(completion(content="Mild."))

    start_run(workspace=workspace, workflow=workflow(provider_for(server)), input={})

    first, second = server.received
    assert first["path"] == second["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == f"Bearer {KEY}"
    assert first["body"] == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "How warm is Oslo?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Current weather in a city",
                    "parameters": WEATHER_PARAMS,
                },
            }
        ],
    }
    assistant, tool = second["body"]["messages"][2:]
    assert assistant == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
        ],
    }
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_1"
    assert json.loads(tool["content"]) == {"city": "Oslo", "tempC": 5}


def test_a_model_without_a_price_records_usage_with_no_cost(workspace: Workspace, server: ChatServer) -> None:
    server.reply(completion(content="Hello.", usage={"prompt_tokens": 30, "completion_tokens": 3}))

    outcome = start_run(
        workspace=workspace,
        input={},
        workflow=workflow(provider_for(server, model="llama-3.1-8b-instruct", name="vllm")),
    )

    entry = CostEntry.objects.get(run__run_id=outcome.run_id)
    assert (entry.provider, entry.model_id, entry.input_tokens, entry.cost_usd) == (
        "vllm",
        "llama-3.1-8b-instruct",
        30,
        None,
    )


def test_a_reply_without_usage_is_recorded_as_no_report_and_unpriced(workspace: Workspace, server: ChatServer) -> None:
    """A server that answers without `usage` (the provider never streams, but some servers omit it):
    `{}` is recorded, and the call costs an unknown amount, not $0, though gpt-4o-mini has a price."""
    reply = completion(content="Hello.")
    del reply["usage"]
    server.reply(reply)

    outcome = start_run(workspace=workspace, input={}, workflow=workflow(provider_for(server)))

    responded = [e["payload"] for e in _events(workspace, outcome.run_id) if e["type"] == "harness.model.responded"]
    assert [r["response"]["usage"] for r in responded] == [{}]
    entry = CostEntry.objects.get(run__run_id=outcome.run_id)
    assert (entry.model_id, entry.input_tokens, entry.cost_usd, entry.usage_reported) == ("gpt-4o-mini", 0, None, False)
    run = Run.objects.get(workspace=workspace, run_id=outcome.run_id)
    assert (run.cost_usd, run.priced_calls, run.unpriced_calls) == (None, 0, 1)
    assert [c for c in verify_run(run) if c.status == "fail"] == []


def test_a_timeout_is_a_clear_error_and_the_provider_answers_the_next_request(server: ChatServer) -> None:
    # The same timeout holds for the next request, which a loaded machine may take a few tenths of
    # a second to answer: a second, not 0.2 s (the first answer comes long after it).
    server.reply(completion(content="too late"), delay_s=5.0)
    server.reply(completion(content="Mild."))
    provider = provider_for(server, timeout_s=1.0)

    with pytest.raises(ModelProviderError) as failed:
        provider.generate(ModelRequest(step_path="ask", turn=1, body={"messages": []}))

    assert "within 1s (timeout)" in failed.value.message and server.base_url in failed.value.message
    assert request_left(failed.value)  # the server had it: what it charged is unknown, not 0
    assert provider.generate(ModelRequest(step_path="ask", turn=1, body={"messages": []})).text == "Mild."


def test_a_server_error_names_the_status_and_the_servers_message(server: ChatServer) -> None:
    server.reply({"error": {"message": "upstream overloaded", "type": "server_error"}}, status=500)

    with pytest.raises(ModelProviderError) as failed:
        provider_for(server).generate(ModelRequest(step_path="ask", turn=1, body={"messages": []}))

    assert "answered HTTP 500: upstream overloaded" in failed.value.message
    assert failed.value.details["httpStatus"] == 500
    assert request_left(failed.value)


def test_a_key_echoed_by_the_server_is_masked_in_the_error(server: ChatServer) -> None:
    server.reply({"error": {"message": f"Incorrect API key provided: {KEY}"}}, status=401)

    with pytest.raises(ModelProviderError) as failed:
        provider_for(server).generate(ModelRequest(step_path="ask", turn=1, body={"messages": []}))

    assert "HTTP 401: Incorrect API key provided: ***" in failed.value.message
    assert KEY not in failed.value.message and KEY not in repr(provider_for(server))


def test_tool_call_arguments_that_are_not_json_are_a_clear_error(server: ChatServer) -> None:
    server.reply(completion(tool_calls=[weather_call("call_9", '{"city": "Oslo"')]))

    with pytest.raises(ModelProviderError) as failed:
        provider_for(server).generate(ModelRequest(step_path="ask", turn=3, body={"messages": []}))

    assert "malformed reply to ask turn 3: tool call call_9 (weather) has arguments that are not valid JSON" in (
        failed.value.message
    )
    assert """'{"city": "Oslo"'""" in failed.value.message


def test_a_failing_provider_never_brings_the_key_into_the_log(workspace: Workspace, server: ChatServer) -> None:
    for _ in range(5):  # however often the runtime asks again
        server.reply({"error": {"message": f"Incorrect API key provided: {KEY}"}}, status=401)
    calls: list[Any] = []

    with contextlib.suppress(ModelProviderError):  # raised, or recorded as the call's error
        start_run(workspace=workspace, workflow=workflow(provider_for(server), calls), input={}, run_id="run_401")

    events = _events(workspace, "run_401")
    types = [e["type"] for e in events]
    assert "harness.model.called" in types and "harness.model.responded" not in types and calls == []
    assert KEY not in canonical_json(events)
    assert all(r["headers"]["Authorization"] == f"Bearer {KEY}" for r in server.received)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"<html>bad gateway</html>", "not JSON: '<html>bad gateway</html>'"),
        ({"choices": []}, "the body has no choices[0]"),
        (
            {"choices": [{"message": {"content": None, "tool_calls": [{"type": "function"}]}}]},
            "tool_calls[0] lacks an id or a function name",
        ),
        (completion(tool_calls=[weather_call(arguments="[1, 2]")]), "arguments that are a JSON list, not an object"),
    ],
)
def test_an_unreadable_reply_is_a_clear_error(server: ChatServer, body: Any, expected: str) -> None:
    server.reply(body)

    with pytest.raises(ModelProviderError) as failed:
        provider_for(server).generate(ModelRequest(step_path="ask", turn=2, body={"messages": []}))

    assert expected in failed.value.message


def test_an_unreachable_server_is_a_clear_error() -> None:
    chat = ChatServer()  # bound, never served, then closed: nothing listens on the port
    base_url = chat.base_url
    chat.httpd.server_close()

    with pytest.raises(ModelProviderError) as failed:
        OpenAICompatibleProvider(base_url=base_url, api_key=KEY, model="m", timeout_s=2).generate(
            ModelRequest(step_path="ask", turn=1, body={"messages": []})
        )

    assert f"could not reach {base_url}/chat/completions: ConnectError" in failed.value.message
    assert not request_left(failed.value)  # no connection, no request: nothing to pay for


def test_a_message_it_cannot_send_is_refused_before_the_request_leaves(server: ChatServer) -> None:
    body = {"messages": [{"role": "robot", "content": "beep"}]}

    with pytest.raises(ModelProviderError) as failed:
        provider_for(server).generate(ModelRequest(step_path="ask", turn=1, body=body))

    assert "cannot send a message with role 'robot'" in failed.value.message
    assert not request_left(failed.value) and server.received == []


def test_from_env_reads_the_settings_and_names_what_is_missing() -> None:
    provider = OpenAICompatibleProvider.from_env(
        {
            BASE_URL_ENV: "http://127.0.0.1:8000/v1/",
            API_KEY_ENV: "",
            MODEL_ENV: "qwen3",
            PROVIDER_ENV: "ollama",
            TIMEOUT_ENV: "5",
        }
    )
    assert (provider.endpoint, provider.model_id, provider.name, provider.timeout_s) == (
        "http://127.0.0.1:8000/v1/chat/completions",
        "qwen3",
        "ollama",
        5.0,
    )
    assert (
        OpenAICompatibleProvider.from_env({BASE_URL_ENV: "http://x/v1", API_KEY_ENV: "k", MODEL_ENV: "gpt-4o"}).name
        == "openai"
    )

    with pytest.raises(ModelProviderError) as missing:
        OpenAICompatibleProvider.from_env({MODEL_ENV: ""})
    assert missing.value.details["missing"] == [API_KEY_ENV, BASE_URL_ENV, MODEL_ENV]
    with pytest.raises(ModelProviderError, match=TIMEOUT_ENV):
        OpenAICompatibleProvider.from_env(
            {BASE_URL_ENV: "http://x", API_KEY_ENV: "", MODEL_ENV: "m", TIMEOUT_ENV: "soon"}
        )


def test_from_env_without_a_mapping_reads_the_django_settings(settings: Any) -> None:
    settings.RUNLEDGER_OPENAI_BASE_URL, settings.RUNLEDGER_OPENAI_API_KEY = "http://127.0.0.1:11434/v1", ""
    settings.RUNLEDGER_OPENAI_MODEL, settings.RUNLEDGER_OPENAI_TIMEOUT_S = "llama3", "7"
    settings.RUNLEDGER_OPENAI_PROVIDER = None
    provider = OpenAICompatibleProvider.from_env()
    assert (provider.endpoint, provider.model_id, provider.name, provider.timeout_s) == (
        "http://127.0.0.1:11434/v1/chat/completions",
        "llama3",
        "openai",
        7.0,
    )

    settings.RUNLEDGER_OPENAI_MODEL = None
    with pytest.raises(ModelProviderError) as missing:
        OpenAICompatibleProvider.from_env()
    assert missing.value.details["missing"] == [MODEL_ENV]


def test_a_failed_tool_call_reaches_the_model_as_an_error_object() -> None:
    assert chat_message({"role": "tool", "toolCallId": "c1", "error": {"name": "LookupError", "message": "no"}}) == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": '{"error": {"name": "LookupError", "message": "no"}}',
    }
    assert chat_message({"role": "tool", "toolCallId": "c2", "result": "plain text"})["content"] == "plain text"
