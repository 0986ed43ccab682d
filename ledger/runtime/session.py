"""The `ai.generate` step: a harness session running the agent loop (model turn, the tool calls
it asks for, again, until the model answers with text).

Resumable at call granularity: a turn whose `harness.model.responded` is in the log is replayed
from it, a tool call with a terminal event likewise; only a call without one is made again. A
session that is already open must recompute the manifest it recorded, or the resume refuses
with CapabilityDriftError.
"""

from __future__ import annotations

from typing import Any

from ..canonical import digest
from ..replay import CapabilityDriftError, manifest_drift
from .errors import RuntimeIntegrityError, StepFailure
from .providers import ModelReply, ModelRequest
from .record import Record
from .recorder import Recorder
from .registry import AIGenerate, Workflow
from .toolcalls import call_tool

HARNESS_ID = "runledger.runtime/1"
ROLE = "worker.ai-generate"


def manifest_for(workflow: Workflow, step: AIGenerate) -> dict[str, Any]:
    provider = workflow.models[step.model]
    return {
        "harnessId": HARNESS_ID,
        "modelSlot": step.model,
        "model": {"provider": provider.name, "modelId": provider.model_id},
        "systemPromptHash": digest(step.system),
        "toolsHash": digest([workflow.tools[name].spec() for name in step.tools]),
        "workflowDefinitionHash": workflow.version,
    }


def model_call_id(step_path: str, turn: int) -> str:
    return f"{step_path}:turn{turn}"


def run_session(*, recorder: Recorder, record: Record, workflow: Workflow, step: AIGenerate, step_path: str,
                prompt: str) -> str:
    """The model's final text. Raises StepFailure when the model loops past max_turns."""
    manifest = manifest_for(workflow, step)
    opened = record.open_sessions.get(step_path)
    if opened is not None:
        changes = manifest_drift(opened.get("manifest"), manifest)
        if changes or opened.get("manifestHash") != digest(manifest):
            raise CapabilityDriftError(recorder.run_id, changes or ["$: manifestHash differs"])
    else:
        recorder.append({"type": "harness.session.started", "payload": {
            "role": ROLE, "task": {"kind": "execute_step", "stepPath": step_path}, "stepPath": step_path,
            "manifest": manifest, "manifestHash": digest(manifest),
        }})

    try:
        return _agent_loop(recorder=recorder, record=record, workflow=workflow, step=step, step_path=step_path,
                           prompt=prompt)
    except StepFailure as failure:
        recorder.append({"type": "harness.session.failed", "payload": {
            "stepPath": step_path, "role": ROLE, "error": failure.as_error()}})
        raise


def _agent_loop(*, recorder: Recorder, record: Record, workflow: Workflow, step: AIGenerate, step_path: str,
                prompt: str) -> str:
    provider = workflow.models[step.model]
    tools = {name: workflow.tools[name] for name in step.tools}
    specs = [tools[name].spec() for name in step.tools]
    messages: list[dict[str, Any]] = []
    if step.system:
        messages.append({"role": "system", "content": step.system})
    messages.append({"role": "user", "content": prompt})
    usage = {"inputTokens": 0, "outputTokens": 0}
    for turn in range(1, step.max_turns + 1):
        reply = _model_turn(recorder, record, provider, step_path, turn,
                            {"model": provider.model_id, "messages": messages, "tools": specs})
        for key in usage:
            usage[key] += int(reply.usage.get(key, 0) or 0)
        messages = [*messages, {"role": "assistant", "content": reply.text, "toolCalls": reply.tool_calls}]
        if not reply.tool_calls:
            text = reply.text or ""
            recorder.append({"type": "harness.session.completed", "payload": {
                "stepPath": step_path, "role": ROLE, "output": text, "usage": usage}})
            return text
        for request in reply.tool_calls:
            tool = tools.get(request.get("name", ""))
            if tool is None:
                raise StepFailure(f"the model asked for tool {request.get('name')!r}, which step {step_path} "
                                  f"does not offer", name="UnknownTool")
            field, value = call_tool(recorder=recorder, record=record, tool=tool, args=request.get("args", {}),
                                     call_id=f"{step_path}:turn{turn}:{request.get('id')}", step_path=step_path,
                                     caller="model", turn=turn)
            messages.append({"role": "tool", "toolCallId": request.get("id"), field: value})
    raise StepFailure(f"step {step_path} reached max_turns={step.max_turns} without a final answer",
                      name="MaxTurnsExceeded")


def _model_turn(recorder: Recorder, record: Record, provider: Any, step_path: str, turn: int,
                body: dict[str, Any]) -> ModelReply:
    key = (step_path, turn)
    prompt_hash = digest(body)
    called = record.model_called.get(key)
    if called is not None and called.get("promptHash") != prompt_hash:
        # The fast-forwarded conversation no longer produces the recorded request: replaying
        # recorded answers to a different question would be wrong, so stop.
        raise RuntimeIntegrityError(f"step {step_path} turn {turn}: the request differs from the recorded one "
                                    f"({called.get('promptHash')} -> {prompt_hash})", stepPath=step_path, turn=turn)
    responded = record.model_responded.get(key)
    if responded is not None:
        response = responded["response"]
        return ModelReply(text=response.get("text"), tool_calls=list(response.get("toolCalls") or []),
                          usage=dict(response.get("usage") or {}))
    call_id = model_call_id(step_path, turn)
    if called is None:  # committed before the provider is invoked: a crash leaves it pending
        recorder.append({"type": "harness.model.called", "payload": {
            "turn": turn, "callId": call_id, "stepPath": step_path, "promptHash": prompt_hash, "request": body}})
    reply = provider.generate(ModelRequest(step_path=step_path, turn=turn, body=body))
    recorder.append({"type": "harness.model.responded", "payload": {
        "turn": turn, "callId": call_id, "stepPath": step_path,
        "model": {"provider": provider.name, "modelId": provider.model_id}, "response": reply.response()}})
    return reply
