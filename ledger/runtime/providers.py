"""Model providers by name: `openai-compatible` (ledger/runtime/openai_compat.py) and `scripted`.
`scripted` answers from a script: deterministic, built in, what the demo and
the tests use. It counts its invocations (and can append them to a file, for a test whose
executor is killed) so a test can prove that a committed response is never asked for again."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .model import ModelProvider, ModelReply, ModelRequest
from .openai_compat import OpenAICompatibleProvider


class ScriptExhausted(Exception):
    request_left = False  # the script had nothing to say: no request went anywhere (model.request_left)


Script = Mapping[str, Sequence[Mapping[str, Any]]] | Callable[[ModelRequest], Mapping[str, Any]]


@dataclass
class ScriptedProvider:
    """Replies by step id (the step path up to its first `.` or `[`) and turn: `script[step][turn - 1]` is
    `{text?, toolCalls?: [{id, name, args}], usage?}`; or `script` is a function of the request."""

    script: Script
    model_id: str = "scripted-1"
    name: str = "scripted"
    invocation_log: Path | None = None  # one JSON line per invocation, flushed before returning
    invocations: list[tuple[str, int]] = field(default_factory=list)

    def generate(self, request: ModelRequest) -> ModelReply:
        self.invocations.append((request.step_path, request.turn))
        if self.invocation_log is not None:
            append_invocation(
                self.invocation_log, {"kind": "model", "stepPath": request.step_path, "turn": request.turn}
            )
        if callable(self.script):
            entry = self.script(request)
        else:
            # the step id: a loop's visit suffix and a parallel branch's key are not part of it
            replies = self.script.get(re.split(r"[.\[]", request.step_path)[0], ())
            if request.turn > len(replies):
                raise ScriptExhausted(f"the script has no reply for {request.step_path} turn {request.turn}")
            entry = replies[request.turn - 1]
        usage = dict(entry.get("usage") or {"inputTokens": 100 * request.turn, "outputTokens": 20})
        return ModelReply(text=entry.get("text"), tool_calls=[dict(c) for c in entry.get("toolCalls", ())], usage=usage)


def append_invocation(path: Path, record: Mapping[str, Any]) -> None:
    """Append one line and fsync it: the process may be killed right after."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


# --- the provider registry: what a re-execution's model override names -----------------------
# A model override maps a workflow's model slot to `{provider, model}`; `provider` names an entry
# here. The factory gets the model id and the slot's own provider (so `scripted` can keep the
# slot's script under another model id). Built in: `scripted` and `openai-compatible` (configured
# from RUNLEDGER_OPENAI_* like the runtime's own; the override's model replaces _MODEL). A
# workflow module (RUNLEDGER_WORKFLOW_MODULES) or a test registers more with register_provider.

ProviderFactory = Callable[[str, "ModelProvider"], "ModelProvider"]
_PROVIDERS: dict[str, ProviderFactory] = {}


def register_provider(name: str, factory: ProviderFactory) -> None:
    """Make `name` usable in model overrides; a later registration of the same name replaces it."""
    _PROVIDERS[name] = factory


def unregister_provider(name: str) -> None:
    _PROVIDERS.pop(name, None)


def known_providers() -> list[str]:
    return sorted(_PROVIDERS)


# What wraps every provider `provider_for` hands out in this context (None: nothing): a scorer's
# paid calls are checked against an evaluation's budget and counted this way (ledger/evaluation/
# scorers.py), whichever code of the scorer asks the registry for its model.
_WRAPPER: ContextVar[Callable[[ModelProvider], ModelProvider] | None] = ContextVar("provider_wrapper", default=None)


@contextmanager
def wrapping(wrap: Callable[[ModelProvider], ModelProvider]) -> Iterator[None]:
    """Inside the block (this thread or task), `provider_for` returns `wrap(provider)`."""
    token = _WRAPPER.set(wrap)
    try:
        yield
    finally:
        _WRAPPER.reset(token)


def provider_for(*, provider: str, model: str, current: ModelProvider) -> ModelProvider:
    from .errors import UnknownModelProvider

    factory = _PROVIDERS.get(provider)
    if factory is None:
        raise UnknownModelProvider(
            f"no model provider named {provider!r} is registered (known: {known_providers()})", provider=provider
        )
    made = factory(model, current)
    wrap = _WRAPPER.get()
    return made if wrap is None else wrap(made)


def _scripted(model: str, current: ModelProvider) -> ModelProvider:
    """The slot's own script under another model id (its pricing label kept); a slot that is not
    scripted gets a script that answers every request with one line of text."""
    if isinstance(current, ScriptedProvider):
        return ScriptedProvider(
            script=current.script, model_id=model, name=current.name, invocation_log=current.invocation_log
        )
    return ScriptedProvider(
        script=lambda request: {"text": f"[{model}] {request.step_path} turn {request.turn}"}, model_id=model
    )


def _openai_compatible(model: str, current: ModelProvider) -> ModelProvider:
    provider: Any = replace(OpenAICompatibleProvider.from_env(), model=model)  # model_id is its read-only view
    return provider


register_provider("scripted", _scripted)
register_provider("openai-compatible", _openai_compatible)
