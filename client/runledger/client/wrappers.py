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
version such as `gpt-4o-2024-08-06`) and its usage in the ledger's terms. Outside any run, or with
`stream=True`, a call goes through unrecorded. A call the SDK raises on is recorded failed, with
`requestLeft` (whether the provider may bill it, which the server then counts as a call of unknown
cost): false for arguments the SDK refused (a TypeError) and for a connection never made on its
first try; true for an HTTP error, a timeout, a connection lost, or after the SDK's own retries.
After a restart (see `Client.start_run`) a call the log already answered returns the recorded
answer, rebuilt as the SDK's own response type, without calling the provider. The SDKs are imported only when a recorded answer is rebuilt: this
module needs neither to be installed.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

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
    """How one SDK method's calls are recorded: its provider name, and how its answer reads."""

    def __init__(
        self,
        provider: str,
        read: Callable[[dict[str, Any]], tuple[str | None, list[dict[str, Any]], dict[str, int]]],
        rebuild: Callable[[dict[str, Any]], Any],
    ) -> None:
        self.provider, self.read, self.rebuild = provider, read, rebuild


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
            model_call = _model_call(kind, kwargs)
            if model_call is None:
                return await method(*args, **kwargs)
            with model_call as call:
                if call.replayed:
                    return _replayed(kind, call)
                try:
                    answer = await method(*args, **kwargs)
                except TypeError:
                    call.request_left = False  # the SDK refused its arguments: no request was built
                    raise
                _respond(kind, call, answer)
            return answer

        return call_async

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        model_call = _model_call(kind, kwargs)
        if model_call is None:
            return method(*args, **kwargs)
        with model_call as recorded:
            if recorded.replayed:
                return _replayed(kind, recorded)
            try:
                answer = method(*args, **kwargs)
            except TypeError:
                recorded.request_left = False  # the SDK refused its arguments: no request was built
                raise
            _respond(kind, recorded, answer)
        return answer

    return call


def _model_call(kind: _Kind, kwargs: dict[str, Any]) -> ModelCall | None:
    if kwargs.get("stream"):
        log.debug("a streamed %s call is not recorded", kind.provider)
        return None
    request = _jsonable(kwargs)
    model = str(kwargs.get("model") or "unknown")
    session = current_session()
    if session is not None:
        return session.model_call(request, provider=kind.provider, model_id=model)
    run = current_run()
    return run.model_call(request, provider=kind.provider, model_id=model) if run is not None else None


def _respond(kind: _Kind, call: ModelCall, answer: Any) -> None:
    raw = _jsonable(answer)
    if not isinstance(raw, dict):
        call.respond(None, usage={})
        return
    text, tool_calls, usage = kind.read(raw)
    model = raw.get("model")
    call.respond(
        text,
        tool_calls=tool_calls or None,
        usage=usage,
        model_id=model if isinstance(model, str) and model else None,
        raw=raw,
    )


def _replayed(kind: _Kind, call: ModelCall) -> Any:
    raw = (call.response or {}).get("raw")
    if not isinstance(raw, dict):
        raise RuntimeError(f"model call {call.call_id} was recorded without the SDK's answer; it cannot be replayed")
    return kind.rebuild(raw)


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
    calls = [
        {
            "id": c.get("id"),
            "name": (c.get("function") or {}).get("name"),
            "args": _arguments((c.get("function") or {}).get("arguments")),
        }
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
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


def _chat_completion(raw: dict[str, Any]) -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(raw)


def _openai_response(raw: dict[str, Any]) -> Any:
    from openai.types.responses import Response

    return Response.model_validate(raw)


_OPENAI: dict[tuple[str, ...], _Kind] = {
    ("chat", "completions", "create"): _Kind("openai", _read_chat, _chat_completion),
    ("responses", "create"): _Kind("openai.responses", _read_response, _openai_response),
}


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


def _anthropic_message(raw: dict[str, Any]) -> Any:
    from anthropic.types import Message

    return Message.model_validate(raw)


_ANTHROPIC: dict[tuple[str, ...], _Kind] = {
    ("messages", "create"): _Kind("anthropic", _read_message, _anthropic_message)
}
