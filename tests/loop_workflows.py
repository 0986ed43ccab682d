"""An outer loop's cycle workflow and supervise adapters for tests/test_outer_loop.py and the kill
sweep. With RUNLEDGER_TEST_INVOCATIONS set, every model call, every cycle's `plan` step and every
supervise call is appended to that file, so a test counts them across a killed process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.runtime.outer_loop import SuperviseContext, register_supervisor
from ledger.runtime.providers import ModelRequest, ScriptedProvider, append_invocation
from ledger.runtime.registry import AIGenerate, CodeRun, Workflow, register
from tests import runtime_workflows  # noqa: F401  (installs the kill switches)
from tests.runtime_workflows import _log_path

SUPERVISE_CALLS: list[int] = []  # cycle numbers, in this process


def refine_plan(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
    path = _log_path()
    if path is not None:
        append_invocation(path, {"kind": "tool", "tool": "plan", "args": {"cycle": run_input["cycleNumber"]}})
    return {"cycle": run_input["cycleNumber"], "note": run_input["promptNote"]}


def refine_prompt(run_input: Any, outputs: Mapping[str, Any]) -> str:
    return (
        f"Goal: {run_input['goal']}. Cycle {run_input['cycleNumber']} of {run_input['maxCycles']}. "
        f"Note: {run_input['promptNote'] or 'none'}. Before: {run_input['previousOutput'] or 'nothing'}"
    )


def refine_reply(request: ModelRequest) -> dict[str, Any]:
    prompt = request.body["messages"][-1]["content"]
    cycle = prompt.split("Cycle ")[1].split(" ")[0]
    return {"text": f"draft {cycle}", "usage": {"inputTokens": 1000, "outputTokens": 100}}


def build_refine() -> Workflow:
    provider = ScriptedProvider(script=refine_reply, name="openai", model_id="gpt-4o", invocation_log=_log_path())
    return Workflow(
        name="rt_refine",
        steps=(CodeRun("plan", refine_plan), AIGenerate("draft", refine_prompt)),
        models={"default": provider},
    )


def _logged(ctx: SuperviseContext) -> None:
    SUPERVISE_CALLS.append(ctx.cycle_number)
    path = _log_path()
    if path is not None:
        append_invocation(path, {"kind": "tool", "tool": "supervise", "args": {"cycle": ctx.cycle_number}})


def until_third(ctx: SuperviseContext) -> dict[str, Any]:
    """continue, continue, done."""
    _logged(ctx)
    if ctx.cycle_number < 3:
        return {"kind": "continue", "promptNote": f"sharper than draft {ctx.cycle_number}"}
    return {"kind": "done", "finalOutput": {"text": ctx.output, "cycles": ctx.cycle_number}}


def never_done(ctx: SuperviseContext) -> dict[str, Any]:
    _logged(ctx)
    return {"kind": "continue"}


def reset_loop_registrations() -> None:
    SUPERVISE_CALLS.clear()
    register(build_refine())
    register_supervisor("rt_until_third", until_third)
    register_supervisor("rt_never_done", never_done)


reset_loop_registrations()
