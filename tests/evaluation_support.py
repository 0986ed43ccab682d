"""Shared by the evaluation tests: recorded triage runs, counting tools and scripted providers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from ledger.demo import workflows
from ledger.models import Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.model import ModelProvider, ModelRequest
from ledger.runtime.providers import ScriptedProvider, register_provider, unregister_provider

ORDERS = ("A-1", "B-2", "C-3", "D-4")
TICKETS = [
    ("Where is my parcel?", "A-1"),
    ("My order is late.", "B-2"),
    ("Parcel lost, help.", "C-3"),
    ("Delivered to the wrong door.", "D-4"),
    ("Tracking says shipped, nothing came.", "A-1"),
    ("Late again, second time.", "B-2"),
    ("Cannot find the parcel.", "C-3"),
    ("It arrived, thanks, but broken.", "D-4"),
    ("When will it ship?", "A-1"),
    ("Is it still delayed?", "B-2"),
]


def triage_runs(workspace: Workspace, count: int = 10, prefix: str = "run_t") -> list[str]:
    ids = []
    for i, (ticket, order) in enumerate(TICKETS[:count] if count <= len(TICKETS) else TICKETS * (count // 10 + 1)):
        if i >= count:
            break
        run_id = f"{prefix}{i:03d}"
        outcome = start_run(
            workspace=workspace, workflow="support.triage", run_id=run_id, input={"ticket": ticket, "orderId": order}
        )
        assert outcome.status == "completed"
        ids.append(run_id)
    return ids


class CountingOrders(dict[str, Any]):
    """The demo's order table, counting every look-up: the lookup_order tool's real edge."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self.lookups = 0

    def get(self, key: Any, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def count_tool_edge(monkeypatch: pytest.MonkeyPatch) -> CountingOrders:
    orders = CountingOrders(workflows.ORDERS)
    monkeypatch.setattr(workflows, "ORDERS", orders)
    return orders


@dataclass
class Calls:
    """Every invocation of the test's providers: (provider name, step path, turn)."""

    made: list[tuple[str, str, int]] = field(default_factory=list)


def _regressing(current: ModelProvider, calls: Calls, model: str, spoil: tuple[str, ...]) -> ModelProvider:
    inner = current if isinstance(current, ScriptedProvider) else None
    assert inner is not None and callable(inner.script)
    script = inner.script

    def answer(request: ModelRequest) -> Mapping[str, Any]:
        calls.made.append(("regressing", request.step_path, request.turn))
        entry = dict(script(request))
        first = next((m for m in request.body["messages"] if m.get("role") == "user"), {})
        if request.turn == 2 and any(f"order {o})" in str(first.get("content")) for o in spoil):
            entry["text"] = "I cannot help with that."
        return entry

    return ScriptedProvider(script=answer, name=inner.name, model_id=model)


# What a grader's server that reports no usage leaves: no token count (docs/operations.md § Prices).
NO_USAGE = {"inputTokens": None, "outputTokens": None}


def registered_providers() -> Iterator[Calls]:
    """`counting` (the slot's own script, counted), `regressing` (spoils the answers of order
    B-2's tickets: 3 of the 10 runs), `grader` (PASS when the output holds "Answer for", 300
    input and 10 output tokens) and `silent-grader` (the same answers, with no usage reported)."""
    calls = Calls()

    def counting(model: str, current: ModelProvider) -> ModelProvider:
        assert isinstance(current, ScriptedProvider) and callable(current.script)
        script = current.script

        def answer(request: ModelRequest) -> Mapping[str, Any]:
            calls.made.append(("counting", request.step_path, request.turn))
            return script(request)

        return ScriptedProvider(script=answer, name=current.name, model_id=model)

    def grader(name: str, usage: Mapping[str, Any]) -> Callable[[str, ModelProvider], ModelProvider]:
        def factory(model: str, current: ModelProvider) -> ModelProvider:
            def answer(request: ModelRequest) -> Mapping[str, Any]:
                calls.made.append((name, request.step_path, request.turn))
                content = str(request.body["messages"][-1]["content"])
                verdict = (
                    "PASS the reply answers the ticket"
                    if "Output: " in content and "Answer for" in content.split("Output: ")[1]
                    else "FAIL the reply does not answer"
                )
                return {"text": verdict, "usage": dict(usage)}

            return ScriptedProvider(script=answer, name="openai", model_id=model)

        return factory

    register_provider("counting", counting)
    register_provider("regressing", lambda model, current: _regressing(current, calls, model, ("B-2",)))
    register_provider("grader", grader("grader", {"inputTokens": 300, "outputTokens": 10}))
    register_provider("silent-grader", grader("silent-grader", NO_USAGE))
    try:
        yield calls
    finally:
        for name in ("counting", "regressing", "grader", "silent-grader"):
            unregister_provider(name)


def model_change(provider: str, model: str = "gpt-4o-mini") -> dict[str, Any]:
    return {"kind": "model", "modelOverrides": {"default": {"provider": provider, "model": model}}}


@contextmanager
def a_provider_retired_before_its_runs() -> Iterator[dict[str, Any]]:
    """A model change whose provider is registered while the evaluation is asked for (a provider
    this deployment does not know is refused then) and gone once the block ends: the evaluation's
    runs, executed after it, cannot run."""
    register_provider("retired", lambda model, current: current)
    try:
        yield model_change("retired", "m")
    finally:
        unregister_provider("retired")
