"""What a model provider is to the runtime: a request in, a reply out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRequest:
    step_path: str
    turn: int
    body: Mapping[str, Any]  # {model, messages, tools}: what harness.model.called records


@dataclass(frozen=True)
class ModelReply:
    text: str | None
    tool_calls: list[dict[str, Any]]  # [{id, name, args}]
    usage: dict[str, Any]

    def response(self) -> dict[str, Any]:
        response: dict[str, Any] = {"toolCalls": self.tool_calls, "usage": self.usage}
        if self.text is not None:
            response["text"] = self.text
        return response


def request_left(exc: BaseException) -> bool:
    """Whether a provider's failure may have come after its request left, so the call may be
    paid for (its cost unknown, never 0): yes, unless the provider says it did not by setting
    `request_left = False` on what it raises (it could not connect, or refused the request itself)."""
    return getattr(exc, "request_left", True) is not False


class ModelProvider(Protocol):
    name: str
    model_id: str

    def generate(self, request: ModelRequest) -> ModelReply: ...
