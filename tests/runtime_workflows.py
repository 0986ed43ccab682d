"""Workflows for tests/test_runtime.py, importable by a `manage.py ledger run` subprocess
(`--module tests.runtime_workflows`). With RUNLEDGER_TEST_INVOCATIONS set, every model and tool
invocation is appended to that file, so a test can count them across a killed process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ledger.runtime.providers import ScriptedProvider, append_invocation
from ledger.runtime.registry import (
    AIGenerate,
    Backoff,
    CodeRun,
    Decision,
    Parallel,
    SubWorkflow,
    Tool,
    ToolCall,
    Workflow,
    register,
)
from ledger.runtime.testing import install_kill_switches

INVOCATIONS_ENV = "RUNLEDGER_TEST_INVOCATIONS"
# A `manage.py ledger run` subprocess or a forked executor that imports this module dies where the
# RUNLEDGER_KILL_* variables say (ledger/runtime/testing.py); unset, nothing changes.
install_kill_switches()


def _log_path() -> Path | None:
    value = os.environ.get(INVOCATIONS_ENV)
    return Path(value) if value else None


def _tool(name: str, answer: Any, effect: str = "read") -> Tool:
    def run(args: Any) -> Any:
        path = _log_path()
        if path is not None:
            append_invocation(path, {"kind": "tool", "tool": name, "args": args})
        return answer(args)

    run.__qualname__ = f"tool_{name}"
    return Tool(name, run, description=f"the {name} tool", parameters={"type": "object"}, effect=effect)


def weather(args: Any) -> dict[str, Any]:
    return {"city": args["city"], "tempC": len(args["city"]) * 3}


def prepare(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"cities": sorted(run_input["cities"])}


def research_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return "Compare the weather in " + ", ".join(outputs["prepare"]["cities"])


def notify_args(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"to": run_input["to"], "text": outputs["research"]}


def summary_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return f"Summarize: {outputs['research']} (sent {outputs['notify']['id']})"


def finish(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"summary": outputs["summarize"], "notified": outputs["notify"]["id"]}


SCRIPT = {
    "research": [
        {
            "toolCalls": [
                {"id": "w1", "name": "weather", "args": {"city": "Oslo"}},
                {"id": "w2", "name": "weather", "args": {"city": "Lisbon"}},
            ],
            "usage": {"inputTokens": 200, "outputTokens": 30},
        },
        {
            "toolCalls": [{"id": "w3", "name": "weather", "args": {"city": "Reykjavik"}}],
            "usage": {"inputTokens": 320, "outputTokens": 18, "cachedInputTokens": 200},
        },
        {"text": "Lisbon is warmest, Oslo coldest.", "usage": {"inputTokens": 400, "outputTokens": 12}},
    ],
    "summarize": [{"text": "Lisbon wins.", "usage": {"inputTokens": 90, "outputTokens": 4}}],
}


def build_drill(
    *,
    weather_description: str = "the weather tool",
    system: str = "You compare weather.",
    provider: ScriptedProvider | None = None,
) -> Workflow:
    tools = {"weather": _tool("weather", weather), "notify": _tool("notify", lambda a: {"id": f"msg-{a['to']}"})}
    tools["weather"] = Tool(
        "weather", tools["weather"].fn, description=weather_description, parameters={"type": "object"}
    )
    return Workflow(
        name="drill",
        steps=(
            CodeRun("prepare", prepare),
            AIGenerate("research", research_prompt, system=system, tools=("weather",)),
            ToolCall("notify", "notify", notify_args),
            AIGenerate("summarize", summary_prompt, system="You summarize."),
            CodeRun("finish", finish),
        ),
        tools=tools,
        models={
            "default": provider or ScriptedProvider(script=SCRIPT, model_id="scripted-1", invocation_log=_log_path())
        },
    )


# --- sub-runs ---------------------------------------------------------------------------------
# `rt_child` is what the parent workflows below start as sub-runs: a model turn with a tool call.

CHILD_SCRIPT = {
    "look": [
        {
            "toolCalls": [{"id": "k1", "name": "weather", "args": {"city": "Bergen"}}],
            "usage": {"inputTokens": 50, "outputTokens": 5},
        },
        {"text": "Bergen is mild.", "usage": {"inputTokens": 70, "outputTokens": 4}},
    ]
}


def child_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    if run_input.get("fail"):
        raise ValueError(f"cannot look up {run_input.get('topic')}")
    return f"Look at {run_input.get('topic')}"


def child_finish(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": run_input.get("topic"), "answer": outputs["look"]}


def build_child(provider: ScriptedProvider | None = None) -> Workflow:
    return Workflow(
        name="rt_child",
        steps=(
            AIGenerate("look", child_prompt, system="You look things up.", tools=("weather",)),
            CodeRun("answer", child_finish),
        ),
        tools={"weather": _tool("weather", weather)},
        models={"default": provider or ScriptedProvider(script=CHILD_SCRIPT, invocation_log=_log_path())},
    )


def pipeline_input(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"topic": outputs["prepare"]["cities"][0]}


def pipeline_finish(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"child": outputs["sub"], "notified": outputs["notify"]["id"]}


def pipeline_notify(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"to": run_input["to"], "text": outputs["sub"]["answer"]}


def build_pipeline() -> Workflow:
    """prepare -> a sub-run of rt_child -> a tool call -> finish."""
    return Workflow(
        name="rt_pipeline",
        steps=(
            CodeRun("prepare", prepare),
            SubWorkflow("sub", "rt_child", pipeline_input),
            ToolCall("notify", "notify", pipeline_notify),
            CodeRun("finish", pipeline_finish),
        ),
        tools={"notify": _tool("notify", lambda a: {"id": f"msg-{a['to']}"})},
    )


def reset_registrations() -> None:
    """Register this module's workflows again, reading the invocation log path from the environment."""
    register(build_drill())
    register(build_child())
    register(build_pipeline())
    register(build_maze())
    register(build_fanout())
    register(build_retry())
    register(build_mailer())


# --- a loop and a fan-out ---------------------------------------------------------------------


def maze_draft(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": outputs.get("draft", {"n": 0})["n"] + 1}


def maze_gate(run_input: Any, outputs: Mapping[str, Any]) -> str | None:
    return "draft" if outputs["draft"]["n"] < 2 else None


def maze_items(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {city.lower(): {"city": city} for city in run_input["cities"]}


def maze_finish(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {"drafts": outputs["draft"]["n"], "temps": {k: v["tempC"] for k, v in outputs["fan"].items()}}


def build_maze() -> Workflow:
    """A two-visit decision loop, then a parallel group of tool calls."""
    return Workflow(
        name="rt_maze",
        steps=(
            CodeRun("draft", maze_draft),
            Decision("gate", maze_gate, max_visits=3, loop_to="draft"),
            # one branch at a time: this sweep compares every kill with one baseline, event by event
            Parallel("fan", maze_items, ToolCall("temp", "weather", lambda item, o: item), max_concurrency=1),
            CodeRun("finish", maze_finish),
        ),
        tools={"weather": _tool("weather", weather)},
    )


# --- a parallel group whose branches run concurrently --------------------------------------------


def fanout_finish(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v["tempC"] for k, v in outputs["fan"].items()}


def build_fanout() -> Workflow:
    """A group of four tool-call branches on four threads, between two code steps."""
    return Workflow(
        name="rt_fanout",
        steps=(
            CodeRun("prepare", prepare),
            Parallel(
                "fan",
                lambda i, o: {c.lower(): {"city": c} for c in o["prepare"]["cities"]},
                ToolCall("temp", "weather", lambda item, o: item),
                max_concurrency=4,
            ),
            CodeRun("finish", fanout_finish),
        ),
        tools={"weather": _tool("weather", weather)},
    )


# --- a retry an hour away ---------------------------------------------------------------------------


def flaky_fetch(args: Any) -> dict[str, Any]:
    """Refuses its first call (the invocation log, written just before, holds one fetch then)."""
    path = _log_path()
    seen = path.read_text().count('"tool": "fetch"') if path is not None and path.exists() else 0
    if seen <= 1:
        raise ConnectionError("the first fetch is refused")
    return {"fetched": args["url"]}


def build_retry() -> Workflow:
    """A tool step whose first call fails and whose retry is due an hour later (no jitter)."""
    return Workflow(
        name="rt_retry",
        steps=(
            ToolCall(
                "fetch",
                "fetch",
                {"url": "https://example.test/report"},
                retries=1,
                backoff=Backoff(initial_s=3600.0, max_s=3600.0, jitter=0.0),
            ),
            CodeRun("done", lambda i, o: o["fetch"]),
        ),
        tools={"fetch": _tool("fetch", flaky_fetch)},
    )


# --- a write tool -----------------------------------------------------------------------------------


def build_mailer() -> Workflow:
    """A code step, then one call of a write tool (a mail that must not leave twice)."""
    return Workflow(
        name="rt_mailer",
        steps=(
            CodeRun("prepare", lambda i, o: {"to": i["to"]}),
            ToolCall("send", "send", lambda i, o: {"to": o["prepare"]["to"]}),
        ),
        tools={"send": _tool("send", lambda a: {"id": f"mail-{a['to']}"}, effect="write")},
    )


reset_registrations()
