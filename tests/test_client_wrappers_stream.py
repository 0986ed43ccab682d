"""Streamed model calls (`stream=True`) through the wrapped `openai` and `anthropic` SDKs
(client/README.md, SDK wrappers), against a local fake provider that streams in each API's wire
format: the user gets the SDK's chunks as they come, and the call is recorded when its stream ends,
with the answer the chunks add up to (text, tool calls whose arguments came in pieces, the model,
the usage); a stream broken mid-way, or closed, dropped or left unread before its end, is a failed
call the provider may bill; after a restart a streamed call the log answered is streamed again from
the record, without asking the provider."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import io
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.reads import selectors
from ledger.tenancy.services import create_key
from runledger.client import Client, wrap_anthropic, wrap_openai
from tests.fake_providers import OPENAI_MODEL, FakeProviders
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

# The SDKs are imported by the tests that call them (see tests/test_client_wrappers.py).

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
RESPONSE_TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
CLAUDE_TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]
QUESTION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Paris?"}]
ASKED = [{"role": "user", "content": "Weather in Paris?"}]
WITH_USAGE = {"stream_options": {"include_usage": True}}

CHAT_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20, "reasoningTokens": 0}
RESPONSES_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20, "reasoningTokens": 5}
CLAUDE_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20}
WEATHER_CALL = {"name": "get_weather", "args": {"city": "Paris"}}


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProviders]:
    fake = FakeProviders().start()
    yield fake
    fake.stop()


@pytest.fixture
def client(server: Daphne, workspace: Workspace) -> Iterator[Client]:
    with Client(server.url, create_key(workspace=workspace, scopes=["ingest", "read"])[1]) as c:
        yield c


def openai_sdk(provider: FakeProviders, asynchronous: bool = False) -> Any:
    import openai

    sdk = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return sdk(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0)


def anthropic_sdk(provider: FakeProviders, asynchronous: bool = False) -> Any:
    import anthropic

    sdk = anthropic.AsyncAnthropic if asynchronous else anthropic.Anthropic
    return sdk(base_url=provider.url, api_key="sk-ant-test", max_retries=0)


def logged(workspace: Workspace, run_id: str, type_: str) -> list[dict[str, Any]]:
    events = selectors.events(RunRow.objects.get(workspace=workspace, run_id=run_id))
    return [e["payload"] for e in events if e["type"] == type_]


def answers(workspace: Workspace, run_id: str) -> list[tuple[str, str, str | None, list[Any], dict[str, Any]]]:
    """Each responded call: its provider, model, text, tool calls (without their ids) and usage."""
    return [
        (
            r["model"]["provider"],
            r["model"]["modelId"],
            r["response"].get("text"),
            [{k: v for k, v in c.items() if k != "id"} for c in r["response"].get("toolCalls") or []],
            r["response"]["usage"],
        )
        for r in logged(workspace, run_id, "harness.model.responded")
    ]


def failures(workspace: Workspace, run_id: str) -> list[tuple[str, str, bool]]:
    return [
        (f["model"]["provider"], f["error"]["name"], f["requestLeft"])
        for f in logged(workspace, run_id, "harness.model.failed")
    ]


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())


def chat_said(chunks: list[Any]) -> tuple[str, str, int | None]:
    """What a consumer of chat chunks reads: the text, the tool call's arguments, the prompt tokens."""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    arguments = "".join(
        call.function.arguments or ""
        for c in chunks
        if c.choices
        for call in c.choices[0].delta.tool_calls or []
        if call.function
    )
    usage = next((c.usage.prompt_tokens for c in chunks if c.usage), None)
    return text, arguments, usage


def response_said(events: list[Any]) -> tuple[str, str, int | None]:
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.response.usage for e in events if e.type == "response.completed"]
    return text, arguments, done[0].input_tokens if done and done[0] else None


def claude_said(events: list[Any]) -> tuple[str, str, int | None]:
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    text = "".join(d.text for d in deltas if d.type == "text_delta")
    arguments = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    return text, arguments, next((e.usage.output_tokens for e in events if e.type == "message_delta"), None)


def test_a_streamed_chat_completion_is_recorded_with_its_tool_call_in_pieces_model_and_usage(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """The chunks the user reads are the SDK's, as the unwrapped SDK reads them; the call is
    recorded once the stream ends, with the tool call its arguments' pieces make. Without
    `include_usage` (never added for the user) the stream reports no usage: `{}`, unpriced."""
    import openai

    llm = wrap_openai(openai_sdk(provider))
    asked = len(provider.requests)
    with client.start_run("wfver_stream", run_id="run_stream_chat") as run, run.session(role="agent"):
        stream = llm.chat.completions.create(model="gpt-4o", messages=QUESTION, tools=TOOLS, stream=True, **WITH_USAGE)
        chunks = list(stream)
        text_chunks = [c for c in llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True)]
    plain = openai_sdk(provider).chat.completions.create(
        model="gpt-4o", messages=QUESTION, tools=TOOLS, stream=True, **WITH_USAGE
    )
    assert [c.model_dump() for c in chunks] == [c.model_dump() for c in plain]  # untouched
    assert all(type(c) is openai.types.chat.ChatCompletionChunk for c in chunks + text_chunks)
    assert chat_said(chunks) == ("", '{"city": "Paris"}', 120)
    assert chat_said(text_chunks) == (provider.answer, "", None)
    assert "stream_options" not in provider.requests[asked + 1]  # nothing injected into the request

    assert answers(workspace, "run_stream_chat") == [
        ("openai", OPENAI_MODEL, None, [WEATHER_CALL], CHAT_USAGE),
        ("openai", OPENAI_MODEL, provider.answer, [], {}),
    ]
    called = logged(workspace, "run_stream_chat", "harness.model.called")
    assert called[0]["request"]["stream"] is True and called[0]["request"]["messages"] == QUESTION
    raw = logged(workspace, "run_stream_chat", "harness.model.responded")[0]["response"]["raw"]
    assert raw["object"] == "chat.completion" and raw["choices"][0]["finish_reason"] == "tool_calls"
    row = RunRow.objects.get(run_id="run_stream_chat")
    assert (row.input_tokens, row.output_tokens, row.priced_calls, row.unpriced_calls) == (120, 30, 1, 1)
    assert row.cost_usd is not None and row.cost_usd > 0
    verify("run_stream_chat")


def test_streamed_responses_and_anthropic_messages_are_recorded_as_context_managers(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`with ... as stream`: the SDK stream's attributes pass through (`.response`), its events
    come as the SDK parses them, and each call is recorded with the answer the events add up to:
    a function call from argument deltas, an Anthropic tool_use from `input_json_delta` pieces,
    usage from `response.completed` and from `message_start` + `message_delta`."""
    import anthropic
    import openai

    llm, claude = wrap_openai(openai_sdk(provider)), wrap_anthropic(anthropic_sdk(provider))
    seen: list[tuple[str, str, int | None]] = []
    with client.start_run("wfver_stream", run_id="run_stream_events") as run, run.session(role="agent"):
        for tools in (RESPONSE_TOOLS, []):
            with llm.responses.create(model="gpt-4o", input=ASKED, tools=tools, stream=True) as stream:
                assert stream.response.status_code == 200
                events = list(stream)
            assert all(isinstance(e, openai.BaseModel) for e in events)
            seen.append(response_said(events))
        for claude_tools in (CLAUDE_TOOLS, []):
            with claude.messages.create(
                model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, tools=claude_tools, stream=True
            ) as stream:
                assert stream.response.headers["content-type"] == "text/event-stream"
                events = [e for e in stream]
            assert all(isinstance(e, anthropic.BaseModel) for e in events)
            seen.append(claude_said(events))
    assert seen == [
        ("", '{"city": "Paris"}', 120),
        (provider.answer, "", 120),
        ("", '{"city": "Paris"}', 30),
        (provider.answer, "", 30),
    ]
    assert answers(workspace, "run_stream_events") == [
        ("openai.responses", OPENAI_MODEL, None, [WEATHER_CALL], RESPONSES_USAGE),
        ("openai.responses", OPENAI_MODEL, provider.answer, [], RESPONSES_USAGE),
        ("anthropic", "claude-sonnet-4-6", None, [WEATHER_CALL], CLAUDE_USAGE),
        ("anthropic", "claude-sonnet-4-6", provider.answer, [], CLAUDE_USAGE),
    ]
    row = RunRow.objects.get(run_id="run_stream_events")
    assert (row.input_tokens, row.priced_calls, row.unpriced_calls) == (480, 4, 0)
    verify("run_stream_events")


def test_asyncio_clients_streams_are_recorded_when_read_to_their_end(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`AsyncOpenAI` and `AsyncAnthropic` with `stream=True`: `async for` and `async with`, the
    call recorded when its stream ends."""
    llm, claude = wrap_openai(openai_sdk(provider, True)), wrap_anthropic(anthropic_sdk(provider, True))

    async def agent() -> list[tuple[str, str, int | None]]:
        stream = await llm.chat.completions.create(
            model="gpt-4o", messages=QUESTION, tools=TOOLS, stream=True, **WITH_USAGE
        )
        seen = [chat_said([c async for c in stream])]
        async with await llm.responses.create(model="gpt-4o", input=ASKED, stream=True) as events:
            seen.append(response_said([e async for e in events]))
        async with await claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, tools=CLAUDE_TOOLS, stream=True
        ) as events:
            seen.append(claude_said([e async for e in events]))
        return seen

    with client.start_run("wfver_stream", run_id="run_stream_async") as run, run.session(role="agent"):
        assert asyncio.run(agent()) == [
            ("", '{"city": "Paris"}', 120),
            (provider.answer, "", 120),
            ("", '{"city": "Paris"}', 30),
        ]
    assert answers(workspace, "run_stream_async") == [
        ("openai", OPENAI_MODEL, None, [WEATHER_CALL], CHAT_USAGE),
        ("openai.responses", OPENAI_MODEL, provider.answer, [], RESPONSES_USAGE),
        ("anthropic", "claude-sonnet-4-6", None, [WEATHER_CALL], CLAUDE_USAGE),
    ]
    assert RunRow.objects.get(run_id="run_stream_async").priced_calls == 3
    verify("run_stream_async")


def test_a_stream_broken_mid_way_is_a_failed_call_that_may_be_billed(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """The connection lost after half the events: the SDK raises to the user, and the call is
    recorded failed with `requestLeft` true (the provider answered: it may bill it), a call of
    unknown cost."""
    llm, claude = wrap_openai(openai_sdk(provider)), wrap_anthropic(anthropic_sdk(provider, True))
    raised: list[str] = []

    async def read_claude() -> None:
        stream = await claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, stream=True)
        async for _event in stream:
            pass

    provider.fail = "cut-stream"
    try:
        with client.start_run("wfver_stream", run_id="run_stream_broken") as run, run.session(role="agent"):
            for read in (
                lambda: list(llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True, **WITH_USAGE)),
                lambda: list(llm.responses.create(model="gpt-4o", input=ASKED, stream=True)),
                lambda: asyncio.run(read_claude()),
            ):
                try:
                    read()
                except Exception as exc:
                    raised.append(type(exc).__name__)
    finally:
        provider.fail = None
    assert len(raised) == 3 and "APIConnectionError" in raised
    assert [(provider, left) for provider, _name, left in failures(workspace, "run_stream_broken")] == [
        ("openai", True),
        ("openai.responses", True),
        ("anthropic", True),
    ]
    assert [f[1] for f in failures(workspace, "run_stream_broken")] == raised
    assert logged(workspace, "run_stream_broken", "harness.model.responded") == []
    row = RunRow.objects.get(run_id="run_stream_broken")
    assert (row.priced_calls, row.unpriced_calls, row.status) == (0, 3, "completed")
    verify("run_stream_broken")


def test_a_stream_closed_dropped_or_left_unread_is_recorded_failed_and_the_run_ends_cleanly(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """A stream left before its last event, by `close()`, a `with` block, being dropped, or the run
    ending while it was never read, is recorded failed (`StreamClosedEarly`, `requestLeft` true: an
    unknown cost), once; one read to its last event and then closed is recorded as answered."""
    llm, claude = wrap_openai(openai_sdk(provider)), wrap_anthropic(anthropic_sdk(provider))
    async_llm = wrap_openai(openai_sdk(provider, True))

    async def leave_async() -> None:
        async with await async_llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True) as stream:
            async for _chunk in stream:
                break

    with client.start_run("wfver_stream", run_id="run_stream_closed") as run, run.session(role="agent"):
        stream = llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True)
        for _chunk in stream:
            break
        stream.close()
        stream.close()  # closed twice: recorded once
        with claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, stream=True) as events:
            next(iter(events))
        dropped = llm.responses.create(model="gpt-4o", input=ASKED, stream=True)
        next(dropped)
        del dropped
        gc.collect()
        asyncio.run(leave_async())
        with claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, stream=True) as events:
            for event in events:
                if event.type == "message_stop":
                    break  # the last event came: the answer is whole
        unread = llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True)
    unread.close()  # after the run: already recorded, nothing more to write
    assert failures(workspace, "run_stream_closed") == [
        ("openai", "StreamClosedEarly", True),
        ("anthropic", "StreamClosedEarly", True),
        ("openai.responses", "StreamClosedEarly", True),
        ("openai", "StreamClosedEarly", True),
        ("openai", "StreamClosedEarly", True),
    ]
    messages = [f["error"]["message"] for f in logged(workspace, "run_stream_closed", "harness.model.failed")]
    assert messages[2] == "the stream was dropped before its end"
    assert messages[-1] == "the run ended before the stream was read to its end"
    assert answers(workspace, "run_stream_closed") == [
        ("anthropic", "claude-sonnet-4-6", provider.answer, [], CLAUDE_USAGE)
    ]
    row = RunRow.objects.get(run_id="run_stream_closed")
    assert (row.priced_calls, row.unpriced_calls, row.status) == (1, 5, "completed")
    types = [e["type"] for e in selectors.events(row)]
    assert types.count("harness.model.called") == 6 and types[-1] == "RunCompleted"
    verify("run_stream_closed")


def test_a_restarted_run_streams_its_recorded_answers_again_without_asking_the_provider(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """A harness restarted from the top after a crash: its streamed calls the log answered are
    streamed again from the record, as the SDK's own chunk and event types (text, tool-call
    arguments and usage read as from the provider), sync and asyncio; the provider is not asked."""
    sync_llm, sync_claude = wrap_openai(openai_sdk(provider)), wrap_anthropic(anthropic_sdk(provider))
    async_llm, async_claude = wrap_openai(openai_sdk(provider, True)), wrap_anthropic(anthropic_sdk(provider, True))

    def calls() -> list[tuple[str, str, int | None]]:
        with sync_llm.chat.completions.create(
            model="gpt-4o", messages=QUESTION, tools=TOOLS, stream=True, **WITH_USAGE
        ) as chunks:
            seen = [chat_said(list(chunks))]
        seen.append(response_said(list(sync_llm.responses.create(model="gpt-4o", input=ASKED, stream=True))))
        events = sync_claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, tools=CLAUDE_TOOLS, stream=True
        )
        seen.append(claude_said(list(events)))
        return seen + asyncio.run(async_calls())

    async def async_calls() -> list[tuple[str, str, int | None]]:
        chunks = await async_llm.chat.completions.create(model="gpt-4o", messages=QUESTION, stream=True, **WITH_USAGE)
        seen = [chat_said([c async for c in chunks])]
        async with await async_llm.responses.create(
            model="gpt-4o", input=ASKED, tools=RESPONSE_TOOLS, stream=True
        ) as events:
            seen.append(response_said([e async for e in events]))
        events = await async_claude.messages.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=ASKED, stream=True
        )
        seen.append(claude_said([e async for e in events]))
        await events.close()
        return seen

    def crashed() -> list[tuple[str, str, int | None]]:
        run = client.start_run("wfver_stream", run_id="run_stream_replay")
        with run.session(role="agent"):
            seen = calls()
        run.flush()  # and the process dies: the run never ends
        return seen

    first = contextvars.copy_context().run(crashed)
    asked, answer = len(provider.requests), provider.answer
    provider.answer = "Snowing in Paris."  # a non-deterministic model: asked again, it would say otherwise
    try:
        with client.start_run("wfver_stream", run_id="run_stream_replay") as run, run.session(role="agent"):
            assert run.restarted
            again = calls()
    finally:
        provider.answer = answer
    assert len(provider.requests) == asked  # every answer from the log
    assert (
        again
        == first
        == [
            ("", '{"city": "Paris"}', 120),
            (answer, "", 120),
            ("", '{"city": "Paris"}', 30),
            (answer, "", 120),
            ("", '{"city": "Paris"}', 120),
            (answer, "", 30),
        ]
    )
    assert len(logged(workspace, "run_stream_replay", "harness.model.responded")) == 6
    row = RunRow.objects.get(run_id="run_stream_replay")
    assert (row.status, row.priced_calls, row.unpriced_calls) == ("completed", 6, 0)
    verify("run_stream_replay")


def test_openai_stream_helpers_are_recorded_and_replayed_through_the_wrapped_create(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """OpenAI's `chat.completions.stream(...)` and `responses.stream(...)` helpers call their
    resource's `create(stream=True)`: on a wrapped client they call the recorded one, so their
    calls are recorded (the request without the arguments the helper did not get), and after a
    restart their events come from the record, the helper's own accumulation working on it."""
    llm, async_llm = wrap_openai(openai_sdk(provider)), wrap_openai(openai_sdk(provider, True))

    async def respond() -> tuple[str, int | None]:
        async with async_llm.responses.stream(model="gpt-4o", input=ASKED) as events:
            async for _event in events:
                pass
            final = await events.get_final_response()
        return final.output_text, final.usage.input_tokens if final.usage else None

    def calls() -> list[Any]:
        with llm.chat.completions.stream(model="gpt-4o", messages=QUESTION, tools=TOOLS, **WITH_USAGE) as chunks:
            arguments = "".join(e.arguments_delta for e in chunks if e.type == "tool_calls.function.arguments.delta")
            completion = chunks.get_final_completion()
        called = completion.choices[0].message.tool_calls[0].function
        return [arguments, called.arguments, completion.usage.prompt_tokens, asyncio.run(respond())]

    def crashed() -> list[Any]:
        run = client.start_run("wfver_stream", run_id="run_stream_helpers")
        with run.session(role="agent"):
            seen = calls()
        run.flush()  # and the process dies: the run never ends
        return seen

    first = contextvars.copy_context().run(crashed)
    asked = len(provider.requests)
    with client.start_run("wfver_stream", run_id="run_stream_helpers") as run, run.session(role="agent"):
        assert run.restarted
        again = calls()
    assert len(provider.requests) == asked  # every answer from the log
    assert again == first == ['{"city": "Paris"}', '{"city": "Paris"}', 120, (provider.answer, 120)]
    assert answers(workspace, "run_stream_helpers") == [  # once: the restart's are replays
        ("openai", OPENAI_MODEL, None, [WEATHER_CALL], CHAT_USAGE),
        ("openai.responses", OPENAI_MODEL, provider.answer, [], RESPONSES_USAGE),
    ]
    request = logged(workspace, "run_stream_helpers", "harness.model.called")[0]["request"]
    assert request["stream"] is True and "frequency_penalty" not in request  # nothing the helper was not given
    assert "<Omit>" not in str(request) and "<NotGiven>" not in str(request)
    verify("run_stream_helpers")
