"""runledger.client records what an agent does without bookkeeping by hand (client/README.md):
the real `openai` and `anthropic` SDKs, wrapped (`wrap_openai`, `wrap_anthropic`), against a local
fake provider, record each call with its messages (roles kept), tool calls, the model that answered
and its usage; `@observe` records steps, nested and repeated; the current run follows the code
(contextvars), so a run started inside another is its sub-run, in threads and asyncio tasks alike."""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client as DjangoClient

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import Client, current_run, current_step, observe, wrap_anthropic, wrap_openai
from tests.client_support import logged
from tests.fake_providers import OPENAI_MODEL, FakeProviders
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

# The SDKs are imported by the tests that call them: every test process collects this module, and
# importing `anthropic` takes about a second (README § Tests, "Where CI's time goes").

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
QUESTION = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProviders]:
    fake = FakeProviders().start()
    yield fake
    fake.stop()


@pytest.fixture
def client(server: Daphne, workspace: Workspace) -> Iterator[Client]:
    with Client(server.url, create_key(workspace=workspace, scopes=["ingest", "read"])[1]) as c:
        yield c


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())


def test_a_wrapped_openai_client_records_messages_tool_calls_model_and_usage(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    with client.start_run("wfver_wrapped", run_id="run_wrapped_openai") as run, run.session(role="agent"):
        answer = llm.chat.completions.create(model="gpt-4o", messages=QUESTION, tools=TOOLS, temperature=0.2)
    assert isinstance(answer, openai.types.chat.ChatCompletion)  # the SDK's own answer, untouched
    assert answer.choices[0].message.tool_calls[0].function.name == "get_weather"

    events = logged(workspace, "run_wrapped_openai")
    called = next(e["payload"] for e in events if e["type"] == "harness.model.called")
    assert called["request"]["messages"] == QUESTION and called["request"]["temperature"] == 0.2
    responded = next(e["payload"] for e in events if e["type"] == "harness.model.responded")
    assert responded["model"] == {"provider": "openai", "modelId": OPENAI_MODEL}
    assert responded["response"]["toolCalls"] == [{"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}]
    assert responded["response"]["usage"] == {
        "inputTokens": 120,
        "outputTokens": 30,
        "cachedInputTokens": 20,
        "reasoningTokens": 0,
    }
    row = RunRow.objects.get(run_id="run_wrapped_openai")
    assert (row.input_tokens, row.output_tokens, row.priced_calls, row.unpriced_calls) == (120, 30, 1, 0)
    assert row.cost_usd is not None and row.cost_usd > 0  # the dated model priced as gpt-4o
    verify("run_wrapped_openai")


def test_messages_and_tools_given_as_generators_are_sent_and_recorded_whole(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """The SDKs take any iterable of messages and tools; a generator can be read once: the provider
    still gets every message and tool, and the record holds them, not the generator's type."""
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    sent = len(provider.requests)
    with client.start_run("wfver_wrapped", run_id="run_wrapped_generators") as run, run.session(role="agent"):
        llm.chat.completions.create(
            model="gpt-4o", messages=(m for m in QUESTION), tools=map(dict, TOOLS), temperature=0.2
        )
    received = provider.requests[sent]
    assert received["messages"] == QUESTION and received["tools"] == TOOLS
    called = next(
        e["payload"] for e in logged(workspace, "run_wrapped_generators") if e["type"] == "harness.model.called"
    )
    assert called["request"]["messages"] == QUESTION and called["request"]["tools"] == TOOLS
    verify("run_wrapped_generators")


def test_every_choice_of_a_wrapped_call_asked_for_several_is_recorded_and_shown(
    client: Client, provider: FakeProviders, workspace: Workspace, admin: Any
) -> None:
    """`n=2`: the call's text is the first choice's, as before; each choice is a message of the
    response too, and the conversation shows both, labelled (as it does for OTLP's spans)."""
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    question = [{"role": "user", "content": "Say hello."}]
    with client.start_run("wfver_wrapped", run_id="run_wrapped_choices") as run, run.session(role="agent"):
        answer = llm.chat.completions.create(model="gpt-4o", messages=question, n=2)
    texts = [c.message.content for c in answer.choices]
    assert len(texts) == 2 and texts[0] != texts[1]

    responded = next(
        e["payload"] for e in logged(workspace, "run_wrapped_choices") if e["type"] == "harness.model.responded"
    )
    assert responded["response"]["text"] == texts[0]
    assert responded["response"]["messages"] == [{"role": "assistant", "content": text} for text in texts]
    verify("run_wrapped_choices")
    console = DjangoClient()
    console.force_login(admin)
    page = console.get("/w/acme/support/runs/run_wrapped_choices/conversation/").content.decode()
    assert "response · choice 1/2" in page and "response · choice 2/2" in page
    assert all(text in page for text in texts)


def test_a_wrapped_anthropic_client_counts_cache_reads_inside_input(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    import anthropic

    llm = wrap_anthropic(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))
    with client.start_run("wfver_wrapped", run_id="run_wrapped_anthropic"):
        with current_run().session(role="agent"):  # type: ignore[union-attr]
            message = llm.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=100,
                system="Be terse.",
                messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
            )
    assert isinstance(message, anthropic.types.Message)
    responded = next(
        e["payload"] for e in logged(workspace, "run_wrapped_anthropic") if e["type"] == "harness.model.responded"
    )
    assert responded["model"] == {"provider": "anthropic", "modelId": "claude-sonnet-4-6"}
    assert responded["response"]["usage"] == {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20}
    assert responded["response"]["toolCalls"] == [{"id": "toolu_1", "name": "get_weather", "args": {"city": "Paris"}}]
    row = RunRow.objects.get(run_id="run_wrapped_anthropic")
    assert row.cost_usd is not None and row.priced_calls == 1
    verify("run_wrapped_anthropic")


def test_wrapped_asyncio_clients_record_the_awaited_answer_and_failure(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """`AsyncOpenAI` and `AsyncAnthropic`, whose `create` is a plain function returning a coroutine
    (the SDKs' argument-checking decorator): the call is recorded when awaited, with the answer's
    model, tool calls and usage (priced), and a failure met while awaiting is a failed call."""
    import anthropic
    import openai

    chat = wrap_openai(openai.AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.AsyncAnthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))

    async def agent() -> list[str]:
        await chat.chat.completions.create(model="gpt-4o", messages=QUESTION, tools=TOOLS)
        await claude.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=100,
            messages=QUESTION[1:],
            tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        )
        provider.fail = "http-500"
        try:
            await chat.chat.completions.create(model="gpt-4o", messages=QUESTION)
        except openai.InternalServerError as exc:
            return [type(exc).__name__]
        finally:
            provider.fail = None
        return []

    with client.start_run("wfver_wrapped", run_id="run_wrapped_async") as run, run.session(role="agent"):
        assert asyncio.run(agent()) == ["InternalServerError"]
    events = logged(workspace, "run_wrapped_async")
    responded = [e["payload"] for e in events if e["type"] == "harness.model.responded"]
    assert [(r["model"], r["response"]["usage"], r["response"]["toolCalls"][0]["name"]) for r in responded] == [
        (
            {"provider": "openai", "modelId": OPENAI_MODEL},
            {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20, "reasoningTokens": 0},
            "get_weather",
        ),
        (
            {"provider": "anthropic", "modelId": "claude-sonnet-4-6"},
            {"inputTokens": 120, "outputTokens": 30, "cachedInputTokens": 20},
            "get_weather",
        ),
    ]
    failed = [e["payload"] for e in events if e["type"] == "harness.model.failed"]
    assert [(f["error"]["name"], f["requestLeft"]) for f in failed] == [("InternalServerError", True)]
    row = RunRow.objects.get(run_id="run_wrapped_async")
    assert (row.input_tokens, row.priced_calls, row.unpriced_calls) == (240, 2, 1)
    verify("run_wrapped_async")


def test_an_answer_without_usage_is_recorded_as_no_report_and_left_unpriced(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """A server that answers without `usage` (some OpenAI-compatible ones do): the call is recorded
    with usage `{}`, which the ledger leaves unpriced, never as zero tokens priced at $0."""
    import anthropic
    import openai

    chat = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))
    provider.report_usage = False
    try:
        with client.start_run("wfver_wrapped", run_id="run_wrapped_no_usage") as run, run.session(role="agent"):
            chat.chat.completions.create(model="gpt-4o", messages=QUESTION)
            claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:])
    finally:
        provider.report_usage = True
    usages = [
        e["payload"]["response"]["usage"]
        for e in logged(workspace, "run_wrapped_no_usage")
        if e["type"] == "harness.model.responded"
    ]
    assert usages == [{}, {}]
    row = RunRow.objects.get(run_id="run_wrapped_no_usage")
    assert (row.priced_calls, row.unpriced_calls, row.cost_usd) == (0, 2, None)
    verify("run_wrapped_no_usage")


def test_a_failed_sdk_call_says_whether_its_request_left_and_the_run_counts_those_that_may_be_billed(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """A provider that answered an HTTP error, or hung up after reading the request, may bill the
    call: `requestLeft: true`, and the server counts it as a call of unknown cost (unpriced, never
    $0). A connection refused on the SDK's only try, and arguments the SDK refused, sent nothing:
    `requestLeft: false`, nothing counted. After the SDK's own retries an earlier try may have left,
    so a refused connection then counts too."""
    import anthropic
    import openai

    def openai_at(url: str, retries: int = 0) -> Any:
        return wrap_openai(openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=retries))

    claude = wrap_anthropic(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))
    raised: list[str] = []

    def attempt(fail: str | None, call: Any) -> None:
        provider.fail = fail
        try:
            call()
        except Exception as exc:
            raised.append(type(exc).__name__)
        finally:
            provider.fail = None

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
        chat, refused, refused_twice = openai_at(provider.url), openai_at(nowhere), openai_at(nowhere, retries=1)
        with client.start_run("wfver_wrapped", run_id="run_wrapped_failures") as run, run.session(role="agent"):
            attempt("http-500", lambda: chat.chat.completions.create(model="gpt-4o", messages=QUESTION))
            attempt("hang-up", lambda: chat.chat.completions.create(model="gpt-4o", messages=QUESTION))
            attempt(
                "http-500",
                lambda: claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:]),
            )
            attempt(None, lambda: refused.chat.completions.create(model="gpt-4o", messages=QUESTION))
            attempt(None, lambda: refused_twice.chat.completions.create(model="gpt-4o", messages=QUESTION))
            attempt(None, lambda: chat.chat.completions.create(model="gpt-4o"))  # no messages: refused by the SDK
            chat.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert raised == [
        "InternalServerError",
        "APIConnectionError",
        "InternalServerError",
        "APIConnectionError",
        "APIConnectionError",
        "TypeError",
    ]
    failures = [
        (e["payload"]["model"]["provider"], e["payload"]["error"]["name"], e["payload"]["requestLeft"])
        for e in logged(workspace, "run_wrapped_failures")
        if e["type"] == "harness.model.failed"
    ]
    assert failures == [
        ("openai", "InternalServerError", True),  # HTTP 500: answered, may be billed
        ("openai", "APIConnectionError", True),  # hung up after reading the request
        ("anthropic", "InternalServerError", True),
        ("openai", "APIConnectionError", False),  # refused on the only try: nothing sent
        ("openai", "APIConnectionError", True),  # refused after a retry: the first try may have left
        ("openai", "TypeError", False),  # the SDK refused its arguments: nothing sent
    ]
    row = RunRow.objects.get(run_id="run_wrapped_failures")
    assert (row.priced_calls, row.unpriced_calls, row.input_tokens) == (1, 4, 120)
    assert row.cost_usd is not None and row.cost_usd > 0  # the answered call, priced; the rest unknown
    assert client.get_run("run_wrapped_failures")["usage"]["unpricedCalls"] == 4
    verify("run_wrapped_failures")


def test_observe_records_steps_nested_and_repeated_and_calls_inside_carry_them(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))

    @observe
    def ask(question: str) -> str | None:
        return (
            llm.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": question}])
            .choices[0]
            .message.content
        )

    @observe(name="plan")
    def plan(questions: list[str]) -> list[str | None]:
        assert current_step() == "plan"
        return [ask(q) for q in questions]

    @observe
    def explode() -> None:
        raise ValueError("no plan survives")

    assert ask("outside any run") == provider.answer  # unrecorded, unchanged
    with client.start_run("wfver_observed", run_id="run_observed"):
        assert plan(["a", "b"]) == [provider.answer] * 2
        with pytest.raises(ValueError):
            explode()

    events = logged(workspace, "run_observed")
    scheduled = [(e["payload"]["stepPath"], e["payload"].get("input")) for e in events if e["type"] == "StepScheduled"]
    assert scheduled == [
        ("plan", {"args": [["a", "b"]], "kwargs": {}}),
        ("plan.ask", {"args": ["a"], "kwargs": {}}),
        ("plan.ask.visit[1]", {"args": ["b"], "kwargs": {}}),
        ("explode", {"args": [], "kwargs": {}}),
    ]
    models = [e["payload"]["stepPath"] for e in events if e["type"] == "harness.model.responded"]
    assert models == ["plan.ask", "plan.ask.visit[1]"]
    completed = {e["payload"]["stepPath"]: e["payload"].get("output") for e in events if e["type"] == "StepCompleted"}
    assert completed["plan"] == [provider.answer] * 2
    failed = next(e["payload"] for e in events if e["type"] == "StepFailed")
    assert failed["stepPath"] == "explode" and failed["error"]["name"] == "ValueError"
    assert events[-1]["type"] == "RunCompleted"  # the step failed; the run, which caught it, did not
    verify("run_observed")


def test_a_run_started_inside_another_is_its_sub_run_in_threads_and_tasks(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    import openai

    llm = wrap_openai(openai.AsyncOpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))

    @observe
    async def research(topic: str) -> str | None:
        with client.start_run("wfver_child", run_id=f"run_child_{topic}") as child, child.session(role="researcher"):
            answer = await llm.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": topic}])
        return answer.choices[0].message.content

    async def fan_out() -> list[str | None]:
        return list(await asyncio.gather(research("x"), research("y")))

    with client.start_run("wfver_parent", run_id="run_parent") as parent, parent.session(role="lead"):
        assert asyncio.run(fan_out()) == [provider.answer] * 2  # asyncio.run copies the context

    for topic in ("x", "y"):
        child = RunRow.objects.get(run_id=f"run_child_{topic}")
        assert child.parent_run_id == "run_parent" and child.status == "completed"
        assert [e["type"] for e in logged(workspace, child.run_id)].count("harness.model.responded") == 1
    parent_steps = [e["payload"]["stepPath"] for e in logged(workspace, "run_parent") if e["type"] == "StepScheduled"]
    assert sorted(parent_steps) == ["research", "research.visit[1]"]
    assert sorted(c["runId"] for c in client._json("GET", "/api/v1/runs/run_parent/children")["runs"]) == [
        "run_child_x",
        "run_child_y",
    ]


def test_a_restarted_run_rebuilds_recorded_answers_a_strict_validation_would_refuse(
    client: Client, provider: FakeProviders, workspace: Workspace
) -> None:
    """After a restart a call the log answered is rebuilt as the SDK's own type, as the SDK reads
    an answer off the wire (without validating): a Responses API answer whose usage lacks a field
    this SDK declares required (`input_tokens_details.cache_write_tokens`, which the fake provider,
    like servers that predate it, leaves out) replays instead of raising."""
    import contextvars

    import anthropic
    import openai

    llm = wrap_openai(openai.OpenAI(base_url=f"{provider.url}/v1", api_key="sk-test", max_retries=0))
    claude = wrap_anthropic(anthropic.Anthropic(base_url=provider.url, api_key="sk-ant-test", max_retries=0))

    def calls() -> list[Any]:
        answered = llm.responses.create(model="gpt-4o", input="Weather in Paris?")
        chat = llm.chat.completions.create(model="gpt-4o", messages=QUESTION)
        message = claude.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=QUESTION[1:])
        assert isinstance(answered, openai.types.responses.Response)
        assert isinstance(chat, openai.types.chat.ChatCompletion) and isinstance(message, anthropic.types.Message)
        return [answered.output_text, answered.usage.input_tokens, chat.choices[0].message.content, message.content]

    def crashed() -> list[Any]:
        run = client.start_run("wfver_wrapped", run_id="run_wrapped_replay")
        with run.session(role="agent"):
            said = calls()
        run.flush()  # and the process dies: the run never ends
        return said

    first = contextvars.copy_context().run(crashed)
    asked, answer = len(provider.requests), provider.answer
    provider.answer = "Snowing in Paris."  # asked again, the model would say otherwise
    try:
        with client.start_run("wfver_wrapped", run_id="run_wrapped_replay") as run, run.session(role="agent"):
            assert run.restarted
            again = calls()
    finally:
        provider.answer = answer
    assert len(provider.requests) == asked  # every answer from the log
    assert again == first and first[:3] == [answer, 120, answer]
    assert logged(workspace, "run_wrapped_replay")[-1]["type"] == "RunCompleted"
    assert not [e for e in logged(workspace, "run_wrapped_replay") if e["type"] == "harness.model.failed"]
    verify("run_wrapped_replay")
