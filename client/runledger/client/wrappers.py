"""Record the model calls an agent makes with the `openai` and `anthropic` SDKs, without
`respond(usage=...)` by hand:

    from openai import OpenAI
    from runledger.client import wrap_openai

    llm = wrap_openai(OpenAI())
    with client.start_run("wfver_agent") as run, run.session(role="agent"):
        answer = llm.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])

A wrapped client is the SDK's own client with `chat.completions.create` and `responses.create`
(OpenAI) or `messages.create` (Anthropic), sync or async, recorded as model calls of the current
session (else of the current run, in its current step): the request as sent (messages with their
roles, tools, parameters), the answer's text and tool calls, the model that answered (a dated
version such as `gpt-4o-2024-08-06`) and its usage in the ledger's terms. Outside any run a call
goes through unrecorded. A call the SDK raises on is recorded failed, with
`requestLeft` (whether the provider may bill it, which the server then counts as a call of unknown
cost): false for arguments the SDK refused (a TypeError) and for a connection never made on its
first try; true for an HTTP error, a timeout, a connection lost, or after the SDK's own retries.
After a restart (see `Client.start_run`) a call the log already answered returns the recorded
answer, rebuilt as the SDK's own response type, without calling the provider.

OpenAI's structured outputs, `chat.completions.parse(..., response_format=Model)` and
`responses.parse(..., text_format=Model)`, post their requests themselves, never through
`create`: they are recorded alike, the request as the SDK sends it (the model as its JSON schema,
by the SDK's own `type_to_response_format_param` / `type_to_text_format_param`; chat-shaped
pydantic tools in the Responses API's shape), the answer as the provider sent it (`raw` without
what the SDK parsed). Replayed, the rebuilt answer is parsed again by the SDK's own
`parse_chat_completion` / `parse_response` with the call's arguments: a `ParsedChatCompletion` or
`ParsedResponse` whose `.parsed` is the user's model. `client.beta.chat` (where `parse` lived
before) is the same resource, recorded the same.

`with_raw_response.create(...)` (and OpenAI's `with_raw_response.parse(...)`) are recorded as the
call their raw response answers, read through its own `parse()`, which the SDK caches: the user
still parses it and reads its `headers` and `http_response`. Replayed, no HTTP request was made,
so the user gets an object whose `parse()` (awaited on Anthropic's asyncio client, as there) gives
the rebuilt answer, with empty `headers` and `http_response` None. With `stream=True` the raw
response's `parse()` gives the stream, wrapped and recorded as `create(stream=True)`'s (replayed:
streamed again from the record). Not recorded: `with_streaming_response`, whose body is the
user's to read.

With `stream=True` the user gets the SDK's stream, wrapped: iterated (`for` / `async for`), as a
context manager, `close()`d, its other attributes the SDK stream's; each chunk or event is passed
on untouched as it comes. The call is recorded as called when `create` returns and as answered
when the stream is read to its end, with the answer its chunks add up to, in the shape of the
non-streamed answer (so `response.raw` replays): text, tool calls (OpenAI's arguments joined by
index, Anthropic's `input_json_delta` pieces), the model, the usage. An OpenAI chat stream reports
usage only when asked with `stream_options={"include_usage": True}`, which is never added for you
(it adds a chunk the user would see, and some OpenAI-compatible servers refuse it): set it to have
streamed chat calls priced; without it the call is recorded with usage `{}`, unpriced. A stream
that raises mid-way is recorded failed with that error; one closed (`close()`, the end of its
`with` block), dropped, or still unread when the run ends, before its last event came, is
recorded failed with `StreamClosedEarly`: both with `requestLeft` true, as the provider answered
and may bill what it generated, so the server counts a call of unknown cost. A stream closed after
its last event (Anthropic's `message_stop`, the Responses API's `response.completed`, every chat
choice's finish reason and the usage chunk asked for) is recorded answered. After a restart a
streamed call the log answered is streamed again from the record, as the SDK's own chunk and
event types (`ChatCompletionChunk`, the Responses API's events, Anthropic's
`RawMessageStreamEvent`s): the text in one delta, each tool call whole, the usage last.

OpenAI's `chat.completions.stream(...)` and `responses.stream(...)` helpers call their resource's
`create(stream=True)`: run on the wrapped resource, they call the recorded one, so they are
recorded and replayed alike (closed early, they close the HTTP response under the wrapped stream,
so such a call is recorded when the stream is dropped or the run ends). Anthropic's
`messages.stream(...)` posts its request itself, never through `create`: it is not recorded; use
`create(stream=True)`.

The SDKs are imported only when a recorded answer is rebuilt: this module needs neither to be
installed.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import threading
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Protocol, TypeVar

from .sync import ModelCall, _jsonable, current_run, current_session

log = logging.getLogger("runledger.client")
T = TypeVar("T")


def wrap_openai(client: T) -> T:
    """`client` (an `openai.OpenAI` or `AsyncOpenAI`) with its chat completions and responses recorded."""
    return _Wrapped(client, (), _OPENAI)  # type: ignore[return-value]


def wrap_anthropic(client: T) -> T:
    """`client` (an `anthropic.Anthropic` or `AsyncAnthropic`) with its messages recorded."""
    return _Wrapped(client, (), _ANTHROPIC)  # type: ignore[return-value]


class _Kind:
    """How one SDK method's calls are recorded: its provider name, how its answer reads, how it is
    rebuilt for a replay, and for a stream how its chunks add up to that answer and how a recorded
    answer is streamed again (None: its streams pass through unrecorded). A `parse` method's
    arguments become the request the SDK sends (`request`), its answer is recorded as the provider
    sent it, without what the SDK parsed (`unparse`), and rebuilt it is parsed again with the
    call's own arguments (`reparse`); a `with_raw_response` method's answer is the SDK's
    raw response (`raw`: "legacy", OpenAI's, whose `parse()` is never awaited, or "api",
    Anthropic's, awaited on its asyncio client)."""

    def __init__(
        self,
        provider: str,
        read: Callable[[dict[str, Any]], tuple[str | None, list[dict[str, Any]], dict[str, int]]],
        rebuild: Callable[[dict[str, Any]], Any],
        accumulate: Callable[[dict[str, Any]], _Accumulator] | None,
        replay_stream: Callable[[dict[str, Any]], list[Any]] | None,
        *,
        request: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        unparse: Callable[[Any], dict[str, Any]] | None = None,
        reparse: Callable[[Any, dict[str, Any]], Any] | None = None,
        raw: str | None = None,
    ) -> None:
        self.provider, self.read, self.rebuild = provider, read, rebuild
        self.accumulate, self.replay_stream = accumulate, replay_stream
        self.request, self.unparse, self.reparse, self.raw = request, unparse, reparse, raw

    def raw_response(self, raw: str) -> _Kind:
        """The same method under `with_raw_response`."""
        return _Kind(
            self.provider,
            self.read,
            self.rebuild,
            self.accumulate,
            self.replay_stream,
            request=self.request,
            unparse=self.unparse,
            reparse=self.reparse,
            raw=raw,
        )


class _Wrapped:
    """The wrapped object at `path` (("chat", "completions"), ...): attributes pass through, the
    recorded methods are replaced."""

    def __init__(self, target: Any, path: tuple[str, ...], kinds: Mapping[tuple[str, ...], _Kind]) -> None:
        self._target, self._path, self._kinds = target, path, kinds

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        path = (*self._path, name)
        kind = self._kinds.get(path)
        if kind is not None and callable(value):
            return _recorded(value, kind)
        if name == "stream" and (*self._path, "create") in self._kinds and path in _HELPERS:
            # OpenAI's stream() helpers call their resource's `create(stream=True)`: run on this
            # wrapped resource, they call the recorded one.
            helper = getattr(type(self._target), name, None)
            if inspect.isfunction(helper):
                return types.MethodType(helper, self)
        if any(p[: len(path)] == path for p in self._kinds):
            return _Wrapped(value, path, self._kinds)
        return value

    def __repr__(self) -> str:
        return f"recorded({self._target!r})"


def _recorded(method: Callable[..., Any], kind: _Kind) -> Callable[..., Any]:
    # AsyncOpenAI's and AsyncAnthropic's `create` is the SDKs' argument-checking decorator, a plain
    # function returning the coroutine: what it wraps says whether the answer must be awaited.
    if inspect.iscoroutinefunction(method) or inspect.iscoroutinefunction(inspect.unwrap(method)):

        @functools.wraps(method)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            kwargs = _settled(kwargs)
            streamed = bool(kwargs.get("stream"))
            model_call = None if streamed and kind.accumulate is None else _model_call(kind, kwargs)
            if model_call is None:
                return await method(*args, **kwargs)
            if streamed:
                with _Opening(kind, model_call, asynchronous=True) as opening:
                    if opening.replay is None:
                        opening.stream = await method(*args, **kwargs)
                return opening.result
            with model_call as call:
                if call.replayed:
                    return _replayed(kind, call, kwargs, asynchronous=True)
                try:
                    answer = await method(*args, **kwargs)
                except TypeError:
                    call.request_left = False  # the SDK refused its arguments: no request was built
                    raise
                read = answer.parse() if kind.raw else answer  # cached in the raw response for the user
                _respond(kind, call, await read if inspect.isawaitable(read) else read)
            return answer

        return call_async

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs = _settled(kwargs)
        streamed = bool(kwargs.get("stream"))
        model_call = None if streamed and kind.accumulate is None else _model_call(kind, kwargs)
        if model_call is None:
            return method(*args, **kwargs)
        if streamed:
            with _Opening(kind, model_call, asynchronous=False) as opening:
                if opening.replay is None:
                    opening.stream = method(*args, **kwargs)
            return opening.result
        with model_call as recorded:
            if recorded.replayed:
                return _replayed(kind, recorded, kwargs, asynchronous=False)
            try:
                answer = method(*args, **kwargs)
            except TypeError:
                recorded.request_left = False  # the SDK refused its arguments: no request was built
                raise
            _respond(kind, recorded, answer.parse() if kind.raw else answer)  # cached for the user
        return answer

    return call


# OpenAI's stream() helpers (`chat.completions.stream`, `responses.stream`), which call `create`.
_HELPERS = frozenset(
    {("chat", "completions", "stream"), ("beta", "chat", "completions", "stream"), ("responses", "stream")}
)
# The SDKs' markers of an argument not given (the stream() helpers pass every one): left out.
_NOT_GIVEN = frozenset({"Omit", "NotGiven"})


def _settled(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments with each one-shot iterator (a generator or `map(...)` of messages or tools,
    which the SDKs take as any iterable) read into a list: recorded as what was sent, and sent whole
    (the record must not name it by its type, nor read it and leave the SDK an empty one)."""
    if not any(isinstance(value, Iterator) for value in kwargs.values()):
        return kwargs
    return {key: list(value) if isinstance(value, Iterator) else value for key, value in kwargs.items()}


def _model_call(kind: _Kind, kwargs: dict[str, Any]) -> ModelCall | None:
    given = {key: value for key, value in kwargs.items() if type(value).__name__ not in _NOT_GIVEN}
    if kind.request is not None:
        try:
            given = kind.request(given)
        except Exception:  # noqa: BLE001 - arguments the SDK refuses too: recorded as given, failed by it
            pass
    request = _jsonable(given)
    model = str(kwargs.get("model") or "unknown")
    session = current_session()
    if session is not None:
        return session.model_call(request, provider=kind.provider, model_id=model)
    run = current_run()
    return run.model_call(request, provider=kind.provider, model_id=model) if run is not None else None


def _respond(kind: _Kind, call: ModelCall, answer: Any) -> None:
    raw = _jsonable(answer if kind.unparse is None else kind.unparse(answer))
    if not isinstance(raw, dict):
        call.respond(None, usage={})
        return
    text, tool_calls, usage = kind.read(raw)
    model = raw.get("model")
    choices = raw.get("choices")
    # Several choices (OpenAI's `n`): the text and tool calls are the first's, every one a message.
    several = (
        {"messages": [_chat_message(c) for c in choices]} if isinstance(choices, list) and len(choices) > 1 else {}
    )
    call.respond(
        text,
        tool_calls=tool_calls or None,
        usage=usage,
        model_id=model if isinstance(model, str) and model else None,
        raw=raw,
        **several,
    )


def _replayed(kind: _Kind, call: ModelCall, kwargs: dict[str, Any], *, asynchronous: bool) -> Any:
    answer = kind.rebuild(_recorded_raw(call))
    if kind.reparse is not None:
        answer = kind.reparse(answer, kwargs)
    if kind.raw is None:
        return answer
    return (_AsyncReplayedResponse if asynchronous and kind.raw == "api" else _ReplayedResponse)(answer)


class _ReplayedResponse:
    """A `with_raw_response` call's answer replayed after a restart: no HTTP request was made, so
    there is no HTTP response (`http_response` is None) and no header (`headers` is empty);
    `parse()` gives the recorded answer, rebuilt as the SDK's own type."""

    def __init__(self, answer: Any) -> None:
        self._answer = answer
        self.headers: Mapping[str, str] = types.MappingProxyType({})
        self.http_response = None
        self.request_id = None

    def parse(self) -> Any:
        return self._answer

    def __repr__(self) -> str:
        return f"<replayed response: {type(self._answer).__name__}>"


class _AsyncReplayedResponse(_ReplayedResponse):
    """`_ReplayedResponse` for Anthropic's asyncio client, whose raw response's `parse()` is awaited."""

    async def parse(self) -> Any:
        return self._answer


def _recorded_raw(call: ModelCall) -> dict[str, Any]:
    raw = (call.response or {}).get("raw")
    if not isinstance(raw, dict):
        raise RuntimeError(f"model call {call.call_id} was recorded without the SDK's answer; it cannot be replayed")
    return raw


# --- streams ---------------------------------------------------------------------------------


class StreamClosedEarly(Exception):
    """What a streamed call not read to its end is recorded failed with (never raised): its stream
    was closed, dropped, or left open when the run ended, so its answer and usage are unknown."""


class _Accumulator(Protocol):
    """A stream's chunks (as JSON) in, the answer they add up to out, in the shape the non-streamed
    call answers (so that `_Kind.read` reads it); `complete` once the stream's last chunk came."""

    @property
    def complete(self) -> bool: ...

    def add(self, chunk: dict[str, Any]) -> None: ...

    def answer(self) -> dict[str, Any]: ...


class _Opening:
    """`create(stream=True)` inside: the call is recorded as called on entry; the SDK's stream,
    set in the block, comes out wrapped (`result`) and the call stays open until the stream ends.
    A call the log answered (`replay`) gets its recorded answer streamed again; one the SDK raised
    on is recorded failed at once, as a non-streamed call is."""

    def __init__(self, kind: _Kind, call: ModelCall, *, asynchronous: bool) -> None:
        self.kind, self.call, self.asynchronous = kind, call, asynchronous
        self.replay: _Replayed | _AsyncReplayed | None = None
        self.stream: Any = None
        self.result: Any = None

    def __enter__(self) -> _Opening:
        self.call.__enter__()
        if self.call.replayed:
            try:
                raw = _recorded_raw(self.call)
                assert self.kind.replay_stream is not None  # only a kind that streams is opened
                events = self.kind.replay_stream(raw)
            except BaseException as exc:
                self.call.__exit__(type(exc), exc, exc.__traceback__)
                raise
            self.call.__exit__(None, None, None)
            self.replay = self.result = (_AsyncReplayed if self.asynchronous else _Replayed)(events)
            if self.kind.raw is not None:
                awaited = self.asynchronous and self.kind.raw == "api"
                self.result = (_AsyncReplayedResponse if awaited else _ReplayedResponse)(self.replay)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.replay is not None:
            return
        if exc is not None:
            if isinstance(exc, TypeError):
                self.call.request_left = False  # the SDK refused its arguments: no request was built
            self.call.__exit__(exc_type, exc, tb)
            return
        # The provider answered: whatever happens to the stream now, it may bill the call.
        self.call.request_left = True
        recording = _Recording(self.kind, self.call)
        wrapped = _AsyncStream if self.asynchronous else _Stream
        if self.kind.raw is None:
            self.result = wrapped(self.stream, recording)
        else:  # a raw response, whose `parse()` gives the stream
            awaited = self.asynchronous and self.kind.raw == "api"
            streamed = _AsyncStreamedResponse if awaited else _StreamedResponse
            self.result = streamed(self.stream, functools.partial(wrapped, recording=recording))


class _StreamedResponse:
    """A `with_raw_response` call's raw response with `stream=True`: the SDK's, its `parse()`
    giving the SDK's stream wrapped and recorded as `create(stream=True)`'s is; its other
    attributes the SDK's. Read without `parse()`, the call is recorded when the run ends."""

    def __init__(self, response: Any, wrap: Callable[[Any], Any]) -> None:
        self._response, self._wrap = response, wrap
        self._stream: Any = None

    def __getattr__(self, name: str) -> Any:
        if name in ("_response", "_wrap", "_stream"):  # not set yet
            raise AttributeError(name)
        return getattr(self._response, name)

    def __repr__(self) -> str:
        return f"recorded({self._response!r})"

    def parse(self) -> Any:
        if self._stream is None:
            self._stream = self._wrap(self._response.parse())
        return self._stream


class _AsyncStreamedResponse(_StreamedResponse):
    """`_StreamedResponse` for Anthropic's asyncio client, whose raw response's `parse()` is awaited."""

    async def parse(self) -> Any:
        if self._stream is None:
            self._stream = self._wrap(await self._response.parse())
        return self._stream


class _Recording:
    """A streamed call's record, open from `create` to its stream's end, which ends it once: read
    to its end, responded with what the chunks added up to; raised on, failed with that error;
    closed, dropped or still open when the run ends, responded when its last chunk had come, else
    failed with `StreamClosedEarly` (the provider may bill it: a call of unknown cost)."""

    def __init__(self, kind: _Kind, call: ModelCall) -> None:
        self.kind, self.call = kind, call
        assert kind.accumulate is not None  # only a kind that streams is recorded streaming
        self.accumulator = kind.accumulate(call.request)
        self.broken = False  # a chunk the accumulator could not read: the answer is not recorded
        self._open = True
        self._lock = threading.Lock()
        call.run.unfinished[self] = functools.partial(
            self.abandon, "the run ended before the stream was read to its end"
        )

    def add(self, chunk: Any) -> None:
        if self.broken:
            return
        try:
            self.accumulator.add(_jsonable(chunk))
        except Exception:  # noqa: BLE001 - a chunk we misread must never break the user's stream
            log.exception(
                "model call %s: a streamed chunk could not be read; its answer is not recorded", self.call.call_id
            )
            self.broken = True

    def end(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        self.call.run.unfinished.pop(self, None)
        if exc is None and self.broken:
            exc = RuntimeError("a streamed chunk could not be read")
        if exc is None:
            try:
                _respond(self.kind, self.call, self.accumulator.answer())
            except Exception as error:  # noqa: BLE001 - recorded failed rather than lost
                exc = error
        self.call.__exit__(None if exc is None else type(exc), exc, None if exc is None else exc.__traceback__)

    def abandon(self, why: str) -> None:
        self.end(None if self.accumulator.complete else StreamClosedEarly(why))


class _Wrapping:
    """What `_Stream` and `_AsyncStream` share: the SDK's stream and its record, the stream's other
    attributes passed through, and the record ended when the wrapper is dropped unread."""

    def __init__(self, stream: Any, recording: _Recording) -> None:
        self._stream, self._recording = stream, recording
        self._iterator: Any = None
        # Dropped unread: recorded then. Not at interpreter exit, when the outbox is gone.
        finalizer = weakref.finalize(self, recording.abandon, "the stream was dropped before its end")
        finalizer.atexit = False  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        if name in ("_stream", "_recording", "_iterator"):  # not set yet
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __repr__(self) -> str:
        return f"recorded({self._stream!r})"


class _Stream(_Wrapping):
    """The SDK's stream, its chunks passed on as they come and recorded (`_Recording`): iterate it,
    use it as a context manager, `close()` it; its other attributes are the SDK stream's."""

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self._stream)
        try:
            chunk = next(self._iterator)
        except StopIteration:
            self._recording.end()
            raise
        except BaseException as exc:
            self._recording.end(exc)
            raise
        self._recording.add(chunk)
        return chunk

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._recording.abandon("the stream was closed before its end")
        self._stream.close()


class _AsyncStream(_Wrapping):
    """`_Stream` for the asyncio clients: `async for`, `async with`, `await close()`."""

    def __aiter__(self) -> _AsyncStream:
        return self

    async def __anext__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        try:
            chunk = await self._iterator.__anext__()
        except StopAsyncIteration:
            self._recording.end()
            raise
        except BaseException as exc:
            self._recording.end(exc)
            raise
        self._recording.add(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._recording.abandon("the stream was closed before its end")
        await self._stream.close()


class _NoResponse:
    """A replayed stream's `response`: no HTTP request was made. OpenAI's stream() helpers close
    their stream's response; closing this one does nothing."""

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _Replayed:
    """A recorded answer streamed again (after a restart), as the SDK's own chunk or event types."""

    def __init__(self, events: list[Any]) -> None:
        self._events = iter(events)
        self.response = _NoResponse()

    def __iter__(self) -> _Replayed:
        return self

    def __next__(self) -> Any:
        return next(self._events)

    def __enter__(self) -> _Replayed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._events = iter(())


class _AsyncReplayed:
    """`_Replayed` for the asyncio clients."""

    def __init__(self, events: list[Any]) -> None:
        self._events = iter(events)
        self.response = _NoResponse()

    def __aiter__(self) -> _AsyncReplayed:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._events)
        except StopIteration:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _AsyncReplayed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._events = iter(())


def _typed(construct_type: Callable[..., Any], type_: Any, events: list[dict[str, Any]]) -> list[Any]:
    """`events` as the SDK types what it reads off the wire: its own `construct_type`, which does
    not validate (a field the recorded answer lacks stays unset, as in a live stream)."""
    return [construct_type(type_=type_, value=event) for event in events]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _reported(raw: dict[str, Any], *totals: str) -> dict[str, Any] | None:
    """The answer's usage object when it gives one of its `totals`, else None: a server that
    reports no usage (an OpenAI-compatible one, say) is recorded as `{}`, which the ledger leaves
    unpriced, not as zero tokens, which it would price at $0."""
    usage = raw.get("usage")
    if isinstance(usage, dict) and any(type(usage.get(key)) is int for key in totals):
        return usage
    return None


def _arguments(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


# --- OpenAI ----------------------------------------------------------------------------------


def _read_chat(raw: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], dict[str, int]]:
    """A chat completion: its first choice's text and tool calls; prompt_tokens include the cached
    ones and completion_tokens the reasoning ones, as the ledger's counts do."""
    choices = raw.get("choices") or [{}]
    message = choices[0].get("message") or {}
    calls = _chat_calls(message)
    usage = _reported(raw, "prompt_tokens", "completion_tokens")
    if usage is None:
        return _content(message), calls, {}
    counts = {
        "inputTokens": _count(usage.get("prompt_tokens")),
        "outputTokens": _count(usage.get("completion_tokens")),
        "cachedInputTokens": _count((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
        "reasoningTokens": _count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens")),
    }
    return _content(message), calls, counts


def _chat_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.get("id"),
            "name": (c.get("function") or {}).get("name"),
            "args": _arguments((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]


def _chat_message(choice: Any) -> dict[str, Any]:
    """One choice of a chat completion as the ledger writes a message: role, text, tool calls."""
    message = (choice.get("message") if isinstance(choice, dict) else None) or {}
    calls = _chat_calls(message)
    out: dict[str, Any] = {"role": message.get("role") or "assistant", "content": _content(message)}
    return {**out, "toolCalls": calls} if calls else out


def _content(message: dict[str, Any]) -> str | None:
    content = message.get("content")
    return content if isinstance(content, str) else None


def _read_response(raw: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], dict[str, int]]:
    """A Responses API answer: output_text parts and function calls."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in raw.get("output") or []:
        if item.get("type") == "message":
            texts += [c["text"] for c in item.get("content") or [] if c.get("type") == "output_text"]
        elif item.get("type") == "function_call":
            calls.append(
                {"id": item.get("call_id"), "name": item.get("name"), "args": _arguments(item.get("arguments"))}
            )
    text = "".join(texts) if texts else None
    usage = _reported(raw, "input_tokens", "output_tokens")
    if usage is None:
        return text, calls, {}
    counts = {
        "inputTokens": _count(usage.get("input_tokens")),
        "outputTokens": _count(usage.get("output_tokens")),
        "cachedInputTokens": _count((usage.get("input_tokens_details") or {}).get("cached_tokens")),
        "reasoningTokens": _count((usage.get("output_tokens_details") or {}).get("reasoning_tokens")),
    }
    return text, calls, counts


class _ChatChunks:
    """Chat completion chunks: each choice's text and refusal pieces joined, its tool calls'
    arguments joined by their index, its finish reason; the usage of the last chunk, sent only
    when `stream_options.include_usage` asked for it (never added here: it changes the chunks)."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    @property
    def complete(self) -> bool:
        finished = bool(self.choices) and all(c["finish_reason"] for c in self.choices.values())
        return finished and (self.usage is not None or not self.include_usage)

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model", "system_fingerprint", "service_tier"):
            if chunk.get(key) is not None:
                self.head[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = choice.get("index") or 0
            into = self.choices.setdefault(
                index, {"role": "assistant", "content": [], "refusal": [], "calls": {}, "finish_reason": None}
            )
            delta = choice.get("delta") or {}
            if isinstance(delta.get("role"), str):
                into["role"] = delta["role"]
            for key in ("content", "refusal"):
                if isinstance(delta.get(key), str):
                    into[key].append(delta[key])
            for piece in delta.get("tool_calls") or []:
                call = into["calls"].setdefault(
                    piece.get("index") or 0, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
                )
                for key in ("id", "type"):
                    if piece.get(key):
                        call[key] = piece[key]
                function = piece.get("function") or {}
                for key in ("name", "arguments"):
                    if isinstance(function.get(key), str):
                        call["function"][key] += function[key]
            if choice.get("finish_reason"):
                into["finish_reason"] = choice["finish_reason"]

    def answer(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self.choices):
            into = self.choices[index]
            message: dict[str, Any] = {
                "role": into["role"],
                "content": "".join(into["content"]) or None,
                "refusal": "".join(into["refusal"]) or None,
            }
            if into["calls"]:
                message["tool_calls"] = [into["calls"][i] for i in sorted(into["calls"])]
            choices.append(
                {"index": index, "message": message, "finish_reason": into["finish_reason"], "logprobs": None}
            )
        raw = {"id": "", "created": 0, "model": "", **self.head, "object": "chat.completion", "choices": choices}
        if self.usage is not None:
            raw["usage"] = self.usage
        return raw


def _chat_stream(raw: dict[str, Any]) -> list[Any]:
    """A recorded chat completion as the chunks of its stream: per choice its role and text, each
    tool call whole (its index, id, name and arguments in one piece), its finish reason; then the
    usage alone, when it was recorded."""
    from openai._models import construct_type
    from openai.types.chat import ChatCompletionChunk

    head = {"id": raw.get("id") or "", "created": raw.get("created") or 0, "model": raw.get("model") or ""}
    head |= {key: raw[key] for key in ("system_fingerprint", "service_tier") if raw.get(key) is not None}
    head["object"] = "chat.completion.chunk"

    def chunk(index: int, delta: dict[str, Any], finish: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    chunks = []
    for choice in raw.get("choices") or []:
        index, message = choice.get("index") or 0, choice.get("message") or {}
        delta = {"role": message.get("role") or "assistant", "content": message.get("content")}
        if message.get("refusal") is not None:
            delta["refusal"] = message["refusal"]
        chunks.append(chunk(index, delta))
        for i, call in enumerate(message.get("tool_calls") or []):
            chunks.append(chunk(index, {"tool_calls": [{"index": i, **call}]}))
        chunks.append(chunk(index, {}, choice.get("finish_reason")))
    if isinstance(raw.get("usage"), dict):
        chunks.append({**head, "choices": [], "usage": raw["usage"]})
    return _typed(construct_type, ChatCompletionChunk, chunks)


class _ResponseEvents:
    """Responses API stream events: the response as its last event (`response.completed`, or
    `.incomplete` / `.failed`) gives it whole; before that, the one `response.created` gave and
    the output items done so far."""

    _LAST = frozenset({"response.completed", "response.incomplete", "response.failed"})

    def __init__(self, request: dict[str, Any]) -> None:
        self.complete = False
        self.response: dict[str, Any] = {}
        self.items: dict[int, Any] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if isinstance(event.get("response"), dict) and isinstance(kind, str) and kind.startswith("response."):
            self.response = event["response"]
        if kind == "response.output_item.done":
            index = event.get("output_index")
            self.items[index if isinstance(index, int) else len(self.items)] = event.get("item")
        self.complete = self.complete or kind in self._LAST

    def answer(self) -> dict[str, Any]:
        if self.complete or not self.items:
            return self.response
        return {**self.response, "output": [self.items[i] for i in sorted(self.items)]}


def _response_stream(raw: dict[str, Any]) -> list[Any]:
    """A recorded Responses API answer as its stream's events: created, each output item added,
    its text or arguments in one delta and done, the item done, then completed."""
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    events: list[dict[str, Any]] = []

    def event(type_: str, **fields: Any) -> None:
        events.append({"type": type_, "sequence_number": len(events), **fields})

    event("response.created", response={**raw, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(raw.get("output") or []):
        item_id = item.get("id") or f"item_{index}"
        where = {"item_id": item_id, "output_index": index}
        if item.get("type") == "message":
            event(
                "response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []}
            )
            for part_index, part in enumerate(item.get("content") or []):
                at = {**where, "content_index": part_index}
                text = part.get("text") if part.get("type") == "output_text" else None
                event("response.content_part.added", **at, part={**part, "text": ""} if text is not None else part)
                if text is not None:
                    event("response.output_text.delta", **at, delta=text, logprobs=[])
                    event("response.output_text.done", **at, text=text, logprobs=[])
                event("response.content_part.done", **at, part=part)
        elif item.get("type") == "function_call":
            arguments = item.get("arguments") or ""
            event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            event("response.function_call_arguments.delta", **where, delta=arguments)
            event("response.function_call_arguments.done", **where, arguments=arguments)
        else:
            event("response.output_item.added", output_index=index, item=item)
        event("response.output_item.done", output_index=index, item=item)
    status = raw.get("status")
    event(f"response.{status}" if status in ("incomplete", "failed") else "response.completed", response=raw)
    return _typed(construct_type, ResponseStreamEvent, events)


def _chat_completion(raw: dict[str, Any]) -> Any:
    from openai._models import construct_type
    from openai.types.chat import ChatCompletion

    return construct_type(type_=ChatCompletion, value=raw)  # as the SDK reads it off the wire: see `_typed`


def _openai_response(raw: dict[str, Any]) -> Any:
    from openai._models import construct_type
    from openai.types.responses import Response

    return construct_type(type_=Response, value=raw)  # as the SDK reads it off the wire: see `_typed`


def _chat_parse_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`chat.completions.parse(...)`'s arguments as the SDK sends them: `response_format` (a
    pydantic model or dataclass) as its JSON schema. Tools made by `openai.pydantic_function_tool`
    are already their schema."""
    from openai.lib._parsing import type_to_response_format_param

    if "response_format" not in kwargs:
        return kwargs
    return {**kwargs, "response_format": type_to_response_format_param(kwargs["response_format"])}


def _unparsed(answer: Any) -> dict[str, Any]:
    """A `ParsedChatCompletion` or `ParsedResponse` as the provider sent it: without the values the
    SDK parsed (`parsed`, `parsed_arguments`), which a replay parses again from the text. Dumped
    without pydantic's warnings: the parsed fields' declared type is the SDK's placeholder."""
    raw: dict[str, Any] = answer.model_dump(mode="json", warnings=False)
    for choice in raw.get("choices") or []:  # a chat completion
        message = choice.get("message") or {}
        message.pop("parsed", None)
        for call in message.get("tool_calls") or []:
            (call.get("function") or {}).pop("parsed_arguments", None)
    for item in raw.get("output") or []:  # a Responses API answer
        item.pop("parsed_arguments", None)
        for part in item.get("content") or [] if item.get("type") == "message" else []:
            part.pop("parsed", None)
    return raw


def _parsed_chat(answer: Any, kwargs: dict[str, Any]) -> Any:
    """A rebuilt chat completion parsed as `chat.completions.parse(...)` parses it, by the SDK's
    own function, with the call's `response_format` and tools (the user passes them again)."""
    from openai._types import omit
    from openai.lib._parsing import parse_chat_completion, validate_input_tools

    tools = validate_input_tools(kwargs.get("tools", omit))
    return parse_chat_completion(
        response_format=kwargs.get("response_format", omit), input_tools=tools, chat_completion=answer
    )


def _response_parse_request(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`responses.parse(...)`'s arguments as the SDK sends them: `text_format` as the JSON schema
    of `text.format`, `parse_as` (how to read the answer) left out, chat-shaped pydantic tools in
    the Responses API's shape."""
    from openai._types import omit
    from openai.lib._parsing._responses import type_to_text_format_param
    from openai.lib._response_resources import _make_tools

    request = {key: value for key, value in kwargs.items() if key not in ("text_format", "parse_as")}
    if "text_format" in kwargs:
        if "format" in (kwargs.get("text") or {}):
            raise TypeError("Cannot mix and match text.format with text_format")  # as the SDK says
        request["text"] = {**(kwargs.get("text") or {}), "format": type_to_text_format_param(kwargs["text_format"])}
    if "tools" in kwargs:
        request["tools"] = _make_tools(kwargs.get("tools", omit))
    return request


def _parsed_response(answer: Any, kwargs: dict[str, Any]) -> Any:
    """A rebuilt Responses API answer parsed as `responses.parse(...)` parses it, by the SDK's own
    functions, with the call's `text_format` (or `parse_as`) and tools."""
    from openai._types import omit
    from openai.lib._parsing._responses import parse_response
    from openai.lib._response_resources import _make_tools, _output_text_parser

    request = _response_parse_request(kwargs)
    extra = kwargs.get("extra_body")
    text_format = _output_text_parser(
        input=extra.get("input", kwargs.get("input", omit)) if isinstance(extra, dict) else kwargs.get("input", omit),
        text=request.get("text", omit),
        text_format=kwargs.get("text_format", omit),
        parse_as=kwargs.get("parse_as", omit),
    )
    return parse_response(text_format=text_format, input_tools=_make_tools(kwargs.get("tools", omit)), response=answer)


_CHAT = _Kind("openai", _read_chat, _chat_completion, _ChatChunks, _chat_stream)
_CHAT_PARSE = _Kind(
    "openai",
    _read_chat,
    _chat_completion,
    None,
    None,
    request=_chat_parse_request,
    unparse=_unparsed,
    reparse=_parsed_chat,
)
_RESPONSES = _Kind("openai.responses", _read_response, _openai_response, _ResponseEvents, _response_stream)
_RESPONSES_PARSE = _Kind(
    "openai.responses",
    _read_response,
    _openai_response,
    None,
    None,
    request=_response_parse_request,
    unparse=_unparsed,
    reparse=_parsed_response,
)
_OPENAI: dict[tuple[str, ...], _Kind] = {
    ("chat", "completions", "create"): _CHAT,
    ("chat", "completions", "parse"): _CHAT_PARSE,
    ("chat", "completions", "with_raw_response", "create"): _CHAT.raw_response("legacy"),
    ("chat", "completions", "with_raw_response", "parse"): _CHAT_PARSE.raw_response("legacy"),
    ("responses", "create"): _RESPONSES,
    ("responses", "parse"): _RESPONSES_PARSE,
    ("responses", "with_raw_response", "create"): _RESPONSES.raw_response("legacy"),
    ("responses", "with_raw_response", "parse"): _RESPONSES_PARSE.raw_response("legacy"),
}
# `client.beta.chat` is the same chat resource, where `parse` lived before it left the beta.
_OPENAI |= {("beta", *path): kind for path, kind in _OPENAI.items() if path[0] == "chat"}


# --- Anthropic -------------------------------------------------------------------------------


def _read_message(raw: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], dict[str, int]]:
    """A message: its text blocks and tool_use blocks. Anthropic's input_tokens leave out the cache
    reads and writes; the ledger's inputTokens hold them (cachedInputTokens ⊂ inputTokens)."""
    blocks = [b for b in raw.get("content") or [] if isinstance(b, dict)]
    texts = [b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)]
    calls = [
        {"id": b.get("id"), "name": b.get("name"), "args": b.get("input")}
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    text = "".join(texts) if texts else None
    usage = _reported(raw, "input_tokens", "output_tokens")
    if usage is None:
        return text, calls, {}
    cached = _count(usage.get("cache_read_input_tokens"))
    counts = {
        "inputTokens": _count(usage.get("input_tokens")) + cached + _count(usage.get("cache_creation_input_tokens")),
        "outputTokens": _count(usage.get("output_tokens")),
        "cachedInputTokens": cached,
    }
    return text, calls, counts


class _MessageEvents:
    """Anthropic message stream events: the message of `message_start`, each content block of
    `content_block_start` with its deltas joined (a tool_use's `input_json_delta` pieces parsed
    once the block stops), the stop reason and usage of `message_delta` over the start's usage."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.complete = False
        self.message: dict[str, Any] = {"content": []}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind, index = event.get("type"), event.get("index") or 0
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = {**event["message"], "usage": dict(event["message"].get("usage") or {})}
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            self._delta(self.blocks.setdefault(index, {}), index, event.get("delta") or {})
        elif kind == "content_block_stop" and index in self.json:
            self.blocks.get(index, {})["input"] = _arguments("".join(self.json.pop(index)) or "{}")
        elif kind == "message_delta":
            self.message.update({k: v for k, v in (event.get("delta") or {}).items() if k != "container" or v})
            usage = self.message.setdefault("usage", {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.complete = True

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "input_json_delta":
            self.json.setdefault(index, []).append(delta.get("partial_json") or "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))
        else:  # text_delta, thinking_delta, signature_delta: a string added to the block's own key
            key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}.get(str(kind))
            if key is not None and isinstance(delta.get(key), str):
                block[key] = (block.get(key) or "") + delta[key]

    def answer(self) -> dict[str, Any]:
        blocks = {**self.blocks}
        for index, pieces in self.json.items():  # a tool_use block the stream never stopped
            blocks.get(index, {})["input"] = _arguments("".join(pieces) or "{}")
        return {**self.message, "content": [blocks[i] for i in sorted(blocks)]}


def _message_stream(raw: dict[str, Any]) -> list[Any]:
    """A recorded message as its stream's events: message_start (no content yet), each content
    block started empty, its text, thinking or tool input in one delta, stopped; message_delta
    with the stop reason and the usage; message_stop."""
    from anthropic._models import construct_type
    from anthropic.types import RawMessageStreamEvent

    usage = raw.get("usage") or {}
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**raw, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage},
        }
    ]
    for index, block in enumerate(raw.get("content") or []):
        kind, start, delta = block.get("type"), dict(block), None
        if kind == "text":
            start["text"], delta = "", {"type": "text_delta", "text": block.get("text") or ""}
        elif kind == "thinking":
            start["thinking"], start["signature"] = "", ""
            delta = {"type": "thinking_delta", "thinking": block.get("thinking") or ""}
        elif kind in ("tool_use", "server_tool_use"):
            start["input"] = {}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input") or {})}
        events.append({"type": "content_block_start", "index": index, "content_block": start})
        if delta is not None:
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        if kind == "thinking" and block.get("signature"):
            signature = {"type": "signature_delta", "signature": block["signature"]}
            events.append({"type": "content_block_delta", "index": index, "delta": signature})
        events.append({"type": "content_block_stop", "index": index})
    stop = {"stop_reason": raw.get("stop_reason"), "stop_sequence": raw.get("stop_sequence")}
    events += [{"type": "message_delta", "delta": stop, "usage": usage}, {"type": "message_stop"}]
    return _typed(construct_type, RawMessageStreamEvent, events)


def _anthropic_message(raw: dict[str, Any]) -> Any:
    from anthropic._models import construct_type
    from anthropic.types import Message

    return construct_type(type_=Message, value=raw)  # as the SDK reads it off the wire: see `_typed`


_MESSAGES = _Kind("anthropic", _read_message, _anthropic_message, _MessageEvents, _message_stream)
_ANTHROPIC: dict[tuple[str, ...], _Kind] = {
    ("messages", "create"): _MESSAGES,
    ("messages", "with_raw_response", "create"): _MESSAGES.raw_response("api"),
}
