"""Structured-output (`parse`) and raw-response (`with_raw_response`) calls through the wrapped
`openai` and `anthropic` SDKs (client/README.md, SDK wrappers), against a local fake provider that
answers a JSON schema with JSON: each is recorded as a model call, the request as the SDK sent it
(a pydantic model as its JSON schema), the answer with its usage; the raw response stays the user's
to read; after a restart a call the log answered comes back from the record, without asking the
provider, as the SDK's own parsed type (`.parsed` an instance of the user's model) or as a raw
response whose `parse()` gives the rebuilt answer."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
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

QUESTION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Paris?"}]
CHAT_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20, "reasoningTokens": 0}
RESPONSES_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20, "reasoningTokens": 5}
CLAUDE_USAGE = {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20}


class Weather(pydantic.BaseModel):
    city: str
    celsius: int


class GetWeather(pydantic.BaseModel):
    """The weather in a city."""

    city: str


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProviders]:
    fake = FakeProviders().start()
    yield fake
    fake.stop()


@pytest.fixture
def client(server: Daphne, workspace: Workspace) -> Iterator[Client]:
    with Client(server.url, create_key(workspace=workspace, scopes=["ingest", "read"])[1]) as c:
        yield c


def logged(workspace: Workspace, run_id: str, kind: str) -> list[dict[str, Any]]:
    run = RunRow.objects.get(workspace=workspace, run_id=run_id)
    return [e["payload"] for e in selectors.events(run) if e["type"] == kind]


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())


def twice(client: Client, provider: FakeProviders, run_id: str, calls: Callable[[], list[Any]]) -> list[list[Any]]:
    """`calls` in a run whose process dies before it ends, then again in the run restarted, with
    the model now saying something else: what each time returned."""

    def crashed() -> list[Any]:
        run = client.start_run("wfver_wrapped", run_id=run_id)
        with run.session(role="agent"):
            said = calls()
        run.flush()  # and the process dies: the run never ends
        return said

    first = contextvars.copy_context().run(crashed)
    asked, answer = len(provider.requests), provider.answer
    provider.answer = "Snowing in Paris."  # asked again, the model would say otherwise
    try:
        with client.start_run("wfver_wrapped", run_id=run_id) as run, run.session(role="agent"):
            assert run.restarted
            again = calls()
    finally:
        provider.answer = answer
    assert len(provider.requests) == asked  # every answer from the log
    return [first, again]


@pytest.mark.filterwarnings("error::UserWarning")  # recording a parsed answer warns the user of nothing
def test_structured_output_calls_record_the_schema_sent_and_replay_as_the_parsed_type(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`chat.completions.parse` (a `response_format`, then strict pydantic tools) and
    `responses.parse` (a `text_format`) post their requests themselves, never through `create`:
    each is recorded, its pydantic model as the JSON schema the SDK sent; after a restart each
    comes back as `ParsedChatCompletion` / `ParsedResponse`, parsed into the user's model. The
    same through `client.beta.chat`, whose `stream` helper sends its model through `create`."""
    import openai
    from openai.types.chat import ParsedChatCompletion
    from openai.types.responses import ParsedResponse

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    tool = openai.pydantic_function_tool(GetWeather, name="get_weather")

    def calls() -> list[Any]:
        chat = llm.chat.completions.parse(model="gpt-4o", messages=QUESTION, response_format=Weather)
        asked = llm.chat.completions.parse(model="gpt-4o", messages=QUESTION, tools=[tool])
        answered = llm.responses.parse(model="gpt-4o", input="Weather in Paris?", text_format=Weather)
        assert isinstance(chat, ParsedChatCompletion) and isinstance(asked, ParsedChatCompletion)
        assert isinstance(answered, ParsedResponse)
        arguments = asked.choices[0].message.tool_calls[0].function.parsed_arguments  # type: ignore[index]
        # `client.beta.chat` is the same resource: its `parse`, and its `stream` helper given a model.
        beta = llm.beta.chat.completions.parse(model="gpt-4o", messages=QUESTION, response_format=Weather)
        with llm.beta.chat.completions.stream(
            model="gpt-4o", messages=QUESTION, response_format=Weather, stream_options={"include_usage": True}
        ) as chunks:
            streamed = chunks.get_final_completion()
        return [
            chat.choices[0].message.parsed,
            arguments,
            answered.output_parsed,
            beta.choices[0].message.parsed,
            streamed.choices[0].message.parsed,
        ]

    sent = len(provider.requests)
    first, again = twice(client, provider, "run_wrapped_parse", calls)
    assert first == [Weather(city=provider.answer, celsius=21), GetWeather(city="Paris"), *[first[0]] * 3]
    assert again == first and all(type(a) is type(b) for a, b in zip(again, first, strict=True))

    bodies = provider.requests[sent:]
    called = [p["request"] for p in logged(workspace, "run_wrapped_parse", "harness.model.called")]
    assert called[0]["response_format"] == bodies[0]["response_format"]  # the schema, as sent
    assert called[0]["response_format"]["json_schema"]["schema"]["required"] == ["city", "celsius"]
    assert called[1]["tools"] == bodies[1]["tools"] and called[1]["tools"][0]["function"]["strict"] is True
    assert called[2]["text"] == bodies[2]["text"] and "text_format" not in called[2]
    assert called[3]["response_format"] == called[4]["response_format"] == called[0]["response_format"]
    responded = logged(workspace, "run_wrapped_parse", "harness.model.responded")
    assert [(r["model"]["provider"], r["model"]["modelId"], r["response"]["usage"]) for r in responded] == [
        ("openai", OPENAI_MODEL, CHAT_USAGE),
        ("openai", OPENAI_MODEL, CHAT_USAGE),
        ("openai.responses", OPENAI_MODEL, RESPONSES_USAGE),
        ("openai", OPENAI_MODEL, CHAT_USAGE),
        ("openai", OPENAI_MODEL, CHAT_USAGE),
    ]
    assert json.loads(responded[0]["response"]["text"]) == {"city": provider.answer, "celsius": 21}
    raw = [r["response"]["raw"] for r in responded[:3]]  # as the provider sent it, what was parsed left out
    assert "parsed" not in raw[0]["choices"][0]["message"]
    assert "parsed_arguments" not in raw[1]["choices"][0]["message"]["tool_calls"][0]["function"]
    assert "parsed" not in raw[2]["output"][0]["content"][0]
    assert responded[1]["response"]["toolCalls"] == [{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}]
    row = RunRow.objects.get(run_id="run_wrapped_parse")
    assert (row.status, row.priced_calls, row.unpriced_calls, row.input_tokens) == ("completed", 5, 0, 600)
    assert not logged(workspace, "run_wrapped_parse", "harness.model.failed")
    verify("run_wrapped_parse")


def test_asyncio_structured_output_calls_are_recorded_replayed_and_failed_as_create_is(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`AsyncOpenAI`'s `parse` methods: recorded when awaited, replayed after a restart as the
    parsed type; an HTTP error is a failed call the provider may bill."""
    import openai

    llm = wrap_openai(openai.AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))

    async def agent() -> list[Any]:
        chat = await llm.chat.completions.parse(model="gpt-4o", messages=QUESTION, response_format=Weather)
        answered = await llm.responses.parse(model="gpt-4o", input="Weather in Paris?", text_format=Weather)
        return [chat.choices[0].message.parsed, answered.output_parsed]

    first, again = twice(client, provider, "run_wrapped_parse_async", lambda: asyncio.run(agent()))
    assert first == again == [Weather(city=provider.answer, celsius=21)] * 2
    assert all(isinstance(parsed, Weather) for parsed in again)

    provider.fail = "http-500"
    try:
        with client.start_run("wfver_wrapped", run_id="run_wrapped_parse_failed") as run, run.session(role="agent"):
            with pytest.raises(openai.InternalServerError):
                asyncio.run(llm.chat.completions.parse(model="gpt-4o", messages=QUESTION, response_format=Weather))
    finally:
        provider.fail = None
    failed = logged(workspace, "run_wrapped_parse_failed", "harness.model.failed")
    assert [(f["error"]["name"], f["requestLeft"]) for f in failed] == [("InternalServerError", True)]
    called = logged(workspace, "run_wrapped_parse_failed", "harness.model.called")
    assert called[0]["request"]["response_format"]["json_schema"]["name"] == "Weather"
    assert RunRow.objects.get(run_id="run_wrapped_parse_async").priced_calls == 2
    assert RunRow.objects.get(run_id="run_wrapped_parse_failed").unpriced_calls == 1
    verify("run_wrapped_parse_async")
    verify("run_wrapped_parse_failed")


def test_raw_response_calls_are_recorded_and_left_readable_and_replay_without_headers(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`with_raw_response` (chat completions' `create` and `parse`, the Responses API's `create`,
    Anthropic's messages): recorded as the call its `parse()` answers, the raw response still the
    user's to parse, with its headers and HTTP response. After a restart it comes back without an
    HTTP request: `parse()` gives the rebuilt answer, `headers` are empty, `http_response` None."""
    import anthropic
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))
    live: list[bool] = []

    def calls() -> list[Any]:
        raws = [
            llm.chat.completions.with_raw_response.create(model="gpt-4o", messages=QUESTION),
            llm.chat.completions.with_raw_response.parse(model="gpt-4o", messages=QUESTION, response_format=Weather),
            llm.responses.with_raw_response.create(model="gpt-4o", input="Weather in Paris?"),
            claude.messages.with_raw_response.create(model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:]),
        ]
        live.append(all(raw.http_response is not None for raw in raws))
        if live[-1]:
            assert all(raw.http_response.status_code == 200 for raw in raws)
            assert all(raw.headers["content-type"] == "application/json" for raw in raws)
        else:
            assert all(dict(raw.headers) == {} for raw in raws)
        chat, parsed, answered, message = (raw.parse() for raw in raws)
        assert isinstance(chat, openai.types.chat.ChatCompletion) and isinstance(message, anthropic.types.Message)
        assert isinstance(answered, openai.types.responses.Response)
        return [
            chat.choices[0].message.content,
            parsed.choices[0].message.parsed,
            answered.output_text,
            message.content,
        ]

    first, again = twice(client, provider, "run_wrapped_raw", calls)
    assert live == [True, False]
    assert again == first and first[:3] == [provider.answer, Weather(city=provider.answer, celsius=21), provider.answer]

    responded = logged(workspace, "run_wrapped_raw", "harness.model.responded")
    assert [(r["model"]["provider"], r["response"]["usage"]) for r in responded[:4]] == [
        ("openai", CHAT_USAGE),
        ("openai", CHAT_USAGE),
        ("openai.responses", RESPONSES_USAGE),
        ("anthropic", CLAUDE_USAGE),
    ]
    assert responded[0]["response"]["text"] == provider.answer
    called = logged(workspace, "run_wrapped_raw", "harness.model.called")
    assert "extra_headers" not in called[0]["request"]  # the SDK's raw-response marker is its own
    assert called[1]["request"]["response_format"]["type"] == "json_schema"
    row = RunRow.objects.get(run_id="run_wrapped_raw")
    assert (row.status, row.priced_calls, row.unpriced_calls) == ("completed", 4, 0)
    verify("run_wrapped_raw")


def test_asyncio_raw_response_calls_are_recorded_and_replayed(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`AsyncOpenAI`'s raw response is parsed without `await`, `AsyncAnthropic`'s with one: both
    are recorded, still readable by the user, and replayed after a restart in the same shape."""
    import anthropic
    import openai

    llm = wrap_openai(openai.AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.AsyncAnthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))

    async def agent() -> list[Any]:
        chat = await llm.chat.completions.with_raw_response.create(model="gpt-4o", messages=QUESTION)
        message = await claude.messages.with_raw_response.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:]
        )
        return [chat.parse().choices[0].message.content, (await message.parse()).content[0].text]

    first, again = twice(client, provider, "run_wrapped_raw_async", lambda: asyncio.run(agent()))
    assert first == again == [provider.answer] * 2
    responded = logged(workspace, "run_wrapped_raw_async", "harness.model.responded")
    assert [(r["model"]["provider"], r["response"]["usage"]) for r in responded[:2]] == [
        ("openai", CHAT_USAGE),
        ("anthropic", CLAUDE_USAGE),
    ]
    assert RunRow.objects.get(run_id="run_wrapped_raw_async").priced_calls == 2
    verify("run_wrapped_raw_async")


def test_a_streamed_raw_response_records_the_stream_its_parse_gives(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`with_raw_response.create(..., stream=True)`: the raw response's `parse()` gives the SDK's
    stream, recorded as `create(stream=True)`'s is when read to its end; after a restart its
    `parse()` gives the recorded answer streamed again, without asking the provider."""
    import anthropic
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.AsyncAnthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))

    async def claude_says() -> str:
        raw = await claude.messages.with_raw_response.create(
            model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:], stream=True
        )
        return "".join([e.delta.text async for e in await raw.parse() if e.type == "content_block_delta"])

    def calls() -> list[Any]:
        raw = llm.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=QUESTION, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(raw.parse())
        assert all(isinstance(chunk, openai.types.chat.ChatCompletionChunk) for chunk in chunks)
        return ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices), asyncio.run(claude_says())]

    first, again = twice(client, provider, "run_wrapped_raw_stream", calls)
    assert first == again == [provider.answer] * 2
    responded = logged(workspace, "run_wrapped_raw_stream", "harness.model.responded")
    assert [(r["model"]["provider"], r["response"]["text"], r["response"]["usage"]) for r in responded] == [
        ("openai", provider.answer, CHAT_USAGE),
        ("anthropic", provider.answer, CLAUDE_USAGE),
    ]
    assert RunRow.objects.get(run_id="run_wrapped_raw_stream").priced_calls == 2
    assert not logged(workspace, "run_wrapped_raw_stream", "harness.model.failed")
    verify("run_wrapped_raw_stream")
