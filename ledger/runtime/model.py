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


class ModelProvider(Protocol):
    name: str
    model_id: str

    def generate(self, request: ModelRequest) -> ModelReply: ...
