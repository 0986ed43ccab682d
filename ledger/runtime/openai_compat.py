"""The `openai-compatible` model provider: chat completions with tools over HTTP (httpx), for
OpenAI itself and for servers that speak its API (vLLM, Ollama, LiteLLM, ...).

The runtime's conversation (session.py) becomes OpenAI's message format here and the reply comes
back as a ModelReply whose usage carries the ledger's token fields. Every failure, whether the
server is unreachable, slow, answers non-2xx or answers something unreadable, is one exception,
ModelProviderError, with a readable message; what the runtime does with a provider that raises
(record it, ask again, fail the step) is session.py's rule, and this message is what it records.
Its `request_left` is False when nothing was sent (no connection was made, or the request was
refused here): a caller that pays for calls counts only the others (model.request_left).

The API key is sent in the Authorization header and nowhere else: it is not part of the request
body that `harness.model.called` records, and it is masked out of every error message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from ..errors import LedgerError
from .model import ModelReply, ModelRequest

BASE_URL_ENV = "RUNLEDGER_OPENAI_BASE_URL"
API_KEY_ENV = "RUNLEDGER_OPENAI_API_KEY"
MODEL_ENV = "RUNLEDGER_OPENAI_MODEL"
PROVIDER_ENV = "RUNLEDGER_OPENAI_PROVIDER"
TIMEOUT_ENV = "RUNLEDGER_OPENAI_TIMEOUT_S"
DEFAULT_PROVIDER = "openai"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
_SNIPPET = 300  # characters of a server's unreadable body quoted in an error


class ModelProviderError(LedgerError):
    """A model provider could not produce a reply (configuration, transport, HTTP or body)."""

    code = "model_provider_error"
    status = 502
    # False when nothing was sent (model.request_left): such a failure cost nothing.
    request_left = True


def _configured() -> dict[str, str]:
    """The provider's settings that are set, by their environment variable names."""
    values = {
        BASE_URL_ENV: settings.RUNLEDGER_OPENAI_BASE_URL,
        API_KEY_ENV: settings.RUNLEDGER_OPENAI_API_KEY,
        MODEL_ENV: settings.RUNLEDGER_OPENAI_MODEL,
        PROVIDER_ENV: settings.RUNLEDGER_OPENAI_PROVIDER,
        TIMEOUT_ENV: settings.RUNLEDGER_OPENAI_TIMEOUT_S,
    }
    return {name: value for name, value in values.items() if value is not None}


@dataclass
class OpenAICompatibleProvider:
    """POSTs `{base_url}/chat/completions`. `name` is the provider label the ledger prices
    against (`openai/gpt-4o-mini` is in the price table; a local model usually is not, and its
    cost is then n/a, never 0)."""

    base_url: str
    api_key: str
    model: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    name: str = DEFAULT_PROVIDER
    _client: httpx.Client | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.base_url.strip():
            raise ModelProviderError("the openai-compatible provider needs a base URL")
        if not self.model.strip():
            raise ModelProviderError("the openai-compatible provider needs a model")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ModelProviderError(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}, got {self.timeout_s}")
        self.base_url = self.base_url.rstrip("/")

    def __repr__(self) -> str:  # the dataclass repr would print the key
        return f"OpenAICompatibleProvider(base_url={self.base_url!r}, model={self.model!r}, name={self.name!r})"

    @property
    def model_id(self) -> str:
        return self.model

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OpenAICompatibleProvider:
        """From RUNLEDGER_OPENAI_BASE_URL, _API_KEY, _MODEL (all required; an empty key sends no
        Authorization header, for local servers), _PROVIDER (default `openai`) and _TIMEOUT_S: the
        settings of those names (console/settings.py reads them from the environment), or `environ`."""
        env = _configured() if environ is None else environ
        missing = [name for name in (BASE_URL_ENV, API_KEY_ENV, MODEL_ENV) if name not in env]
        missing += [name for name in (BASE_URL_ENV, MODEL_ENV) if name in env and not env[name].strip()]
        if missing:
            raise ModelProviderError(
                f"the openai-compatible provider is not configured: set {', '.join(sorted(missing))} "
                f"(an empty {API_KEY_ENV} is allowed for servers that need no key)",
                missing=sorted(missing),
            )
        raw_timeout = env.get(TIMEOUT_ENV, "").strip()
        try:
            timeout_s = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            raise ModelProviderError(f"{TIMEOUT_ENV} must be a number of seconds, got {raw_timeout!r}") from None
        return cls(
            base_url=env[BASE_URL_ENV],
            api_key=env[API_KEY_ENV],
            model=env[MODEL_ENV],
            timeout_s=timeout_s,
            name=env.get(PROVIDER_ENV, "").strip() or DEFAULT_PROVIDER,
        )

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def generate(self, request: ModelRequest) -> ModelReply:
        try:
            payload = chat_request(self.model, request.body.get("messages") or (), request.body.get("tools") or ())
        except ModelProviderError as exc:
            exc.request_left = False  # refused here: nothing was sent, nothing is owed
            raise
        data = self._post(payload)
        try:
            return parse_reply(data)
        except ModelProviderError as exc:
            raise self._error(f"malformed reply to {request.step_path} turn {request.turn}: {exc.message}") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Accept": "application/json"}
            if self.api_key:
                headers["Authorization"] = f"Bearer {self.api_key}"
            self._client = httpx.Client(timeout=self.timeout_s, headers=headers, follow_redirects=False)
        return self._client

    def _post(self, payload: dict[str, Any]) -> Any:
        try:
            response = self._http().post(self.endpoint, json=payload)
        except httpx.TimeoutException as exc:
            raise self._error(
                f"no answer from {self._where()} within {self.timeout_s:g}s (timeout)", left=not _unsent(exc)
            ) from None
        except httpx.HTTPError as exc:
            raise self._error(
                f"could not reach {self._where()}: {type(exc).__name__}: {exc}", left=not _unsent(exc)
            ) from None
        if not response.is_success:
            raise self._error(
                f"{self._where()} answered HTTP {response.status_code}: {_server_message(response)}",
                httpStatus=response.status_code,
            )
        try:
            return response.json()
        except ValueError:
            raise self._error(
                f"{self._where()} answered HTTP {response.status_code} with a body that is not "
                f"JSON: {_snippet(response.text)!r}"
            ) from None

    def _where(self) -> str:
        url = httpx.URL(self.endpoint)
        return str(url.copy_with(username=None, password=None)) if url.userinfo else str(url)

    def _error(self, message: str, *, left: bool = True, **details: Any) -> ModelProviderError:
        """`left`: the request may have reached the server (model.request_left reads it)."""
        text = f"model provider {self.name}/{self.model}: {message}"
        if self.api_key:  # a server may echo what it was sent
            text = text.replace(self.api_key, "***")
        error = ModelProviderError(text, provider=self.name, model=self.model, **details)
        error.request_left = left
        return error


def _unsent(exc: httpx.HTTPError) -> bool:
    """httpx failed before a byte of the request went out: no connection was made (refused,
    unresolved, timed out connecting or waiting for the pool) or the URL's scheme is not HTTP."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout | httpx.UnsupportedProtocol)


# --- the runtime's conversation as OpenAI chat messages ------------------------------------------


def chat_request(
    model: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The chat completions body for session.py's `{messages, tools}`."""
    body: dict[str, Any] = {"model": model, "messages": [chat_message(m) for m in messages]}
    if tools:
        body["tools"] = [function_tool(t) for t in tools]
    return body


def function_tool(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A Tool.spec() (`{name, description, parameters, effect, timeoutS}`) as an OpenAI function tool;
    effect and timeout are ours, the model does not see them."""
    parameters = dict(spec.get("parameters") or {}) or {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": spec["name"], "parameters": parameters}
    if spec.get("description"):
        function["description"] = spec["description"]
    return {"type": "function", "function": function}


def chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role in ("system", "user"):
        return {"role": role, "content": _text(message.get("content"))}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        calls = message.get("toolCalls") or []
        if calls:
            out["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {"name": c.get("name"), "arguments": json.dumps(c.get("args", {}))},
                }
                for c in calls
            ]
        return out
    if role == "tool":
        # session.py records the outcome under `result` or `error`; the model reads one string.
        content = _text(message["result"]) if "result" in message else json.dumps({"error": message.get("error")})
        return {"role": "tool", "tool_call_id": message.get("toolCallId"), "content": content}
    raise ModelProviderError(f"cannot send a message with role {role!r} to an openai-compatible server")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


# --- the reply ------------------------------------------------------------------------------------


def parse_reply(data: Any) -> ModelReply:
    """A chat completion as a ModelReply; anything it cannot read raises ModelProviderError."""
    if not isinstance(data, Mapping):
        raise ModelProviderError(f"the body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ModelProviderError("the body has no choices[0]")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise ModelProviderError("choices[0] has no message")
    return ModelReply(
        text=_reply_text(message.get("content")),
        tool_calls=[_tool_call(i, c) for i, c in enumerate(message.get("tool_calls") or [])],
        usage=usage_of(data.get("usage")),
    )


def _reply_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers send them
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    raise ModelProviderError(f"message.content is a JSON {type(content).__name__}")


def _tool_call(index: int, call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not call.get("id"):
        raise ModelProviderError(f"tool_calls[{index}] lacks an id or a function name")
    name = function["name"]
    raw = function.get("arguments")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        args: Any = {}
    elif isinstance(raw, str):
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ModelProviderError(
                f"tool call {call['id']} ({name}) has arguments that are not valid JSON "
                f"({exc.msg} at position {exc.pos}): {_snippet(raw)!r}"
            ) from None
    else:
        args = raw
    if not isinstance(args, Mapping):
        raise ModelProviderError(
            f"tool call {call['id']} ({name}) has arguments that are a JSON {type(args).__name__}, not an object"
        )
    return {"id": str(call["id"]), "name": name, "args": dict(args)}


def usage_of(usage: Any) -> dict[str, int]:
    """OpenAI's usage in the ledger's fields; cached tokens are part of input, reasoning part of output."""
    if not isinstance(usage, Mapping):
        return {}
    out: dict[str, int] = {}
    for ours, value in (
        ("inputTokens", usage.get("prompt_tokens")),
        ("outputTokens", usage.get("completion_tokens")),
        ("cachedInputTokens", _detail(usage.get("prompt_tokens_details"), "cached_tokens")),
        ("reasoningTokens", _detail(usage.get("completion_tokens_details"), "reasoning_tokens")),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[ours] = value
    return out


def _detail(details: Any, key: str) -> Any:
    return details.get(key) if isinstance(details, Mapping) else None


def _server_message(response: httpx.Response) -> str:
    """The server's own error message (`{"error": {"message"}}` or `{"error": "..."}`), else a snippet."""
    try:
        body = response.json()
    except ValueError:
        return _snippet(response.text) or response.reason_phrase
    error = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    if isinstance(body, Mapping) and isinstance(body.get("detail"), str):  # FastAPI-style servers
        return body["detail"]
    return _snippet(response.text)


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"
