"""The `ai.generate` step: a harness session running the agent loop (model turn, the tool calls
it asks for, again, until the model answers with text).

Resumable at call granularity: a turn whose `harness.model.responded` is in the log is replayed
from it, a tool call with a terminal event likewise; only a call without one is made again. A
session that is already open must recompute the manifest it recorded, or the resume refuses
with CapabilityDriftError.
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Mapping
from typing import Any

from ..canonical import canonical_bytes, digest
from ..log.envelopes import format_recorded_at
from ..replay.plan import CapabilityDriftError, manifest_drift
from .errors import RuntimeIntegrityError, StepFailure
from .model import request_left
from .providers import ModelReply, ModelRequest
from .record import Record
from .recorder import Recorder
from .registry import AIGenerate, ModelPolicy, Workflow
from .retry import next_try_at, recorded_retry_at, wait_until
from .timeouts import CallTimedOut, call_with_timeout
from .toolcalls import call_tool

HARNESS_ID = "runledger.runtime/1"
ROLE = "worker.ai-generate"
# A provider that raises (a timeout, a 5xx, a refused connection) or outlives its slot's timeout is
# asked again per the slot's ModelPolicy (registry.py; default: 3 tries in all, at once) before the
# step fails; each failure is recorded as harness.model.failed (with willRetry, and retryAt when
# the policy has a backoff).


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


def call_prefix(step_path: str, attempt: int) -> str:
    """What the call ids of one attempt of a step start with (attempt 1 keeps the bare path)."""
    return step_path if attempt == 1 else f"{step_path}:attempt{attempt}"


def model_call_id(prefix: str, turn: int, retry: int = 0) -> str:
    return f"{prefix}:turn{turn}" + (f":retry{retry}" if retry else "")


def run_session(
    *,
    recorder: Recorder,
    record: Record,
    workflow: Workflow,
    step: AIGenerate,
    step_path: str,
    prompt: str,
    attempt: int = 1,
    replay: Any = None,
) -> str:
    """The model's final text. Raises StepFailure when the model loops past max_turns or a model
    call keeps failing."""
    manifest = manifest_for(workflow, step)
    ended = record.failed_sessions.get(step_path)
    if ended is not None and ended.attempt == attempt:
        # This attempt's session already failed (killed before its StepFailed): the same failure.
        error = ended.error if isinstance(ended.error, dict) else {}
        raise StepFailure(str(error.get("message", "session failed")), name=str(error.get("name", "StepError")))
    finished = record.completed_sessions.get(step_path)
    if finished is not None and finished.attempt == attempt:
        return record.session_output(finished)  # killed between the session's end and the step's
    opened = record.open_sessions.get(step_path)
    if opened is not None and opened.attempt == attempt:
        changes = manifest_drift(opened.manifest, manifest)
        if changes or opened.manifest_hash != digest(manifest):
            raise CapabilityDriftError(recorder.run_id, changes or ["$: manifestHash differs"])
    else:  # committed with the session's first model call (or the step's end)
        recorder.defer(
            {
                "type": "harness.session.started",
                "payload": {
                    "role": ROLE,
                    "task": {"kind": "execute_step", "stepPath": step_path},
                    "stepPath": step_path,
                    "manifest": manifest,
                    "manifestHash": digest(manifest),
                    **({"attempt": attempt} if attempt > 1 else {}),
                },
            }
        )

    try:
        return _agent_loop(
            recorder=recorder,
            record=record,
            workflow=workflow,
            step=step,
            step_path=step_path,
            prompt=prompt,
            prefix=call_prefix(step_path, attempt),
            replay=replay,
        )
    except StepFailure as failure:  # committed with the step's failure
        recorder.defer(
            {
                "type": "harness.session.failed",
                "payload": {"stepPath": step_path, "role": ROLE, "error": failure.as_error()},
            }
        )
        raise
    except BaseException:
        _flush_quietly(recorder)
        raise


def _flush_quietly(recorder: Recorder) -> None:
    """Commit what was deferred before an unexpected error ends the session (a response or a
    tool outcome that is already known); if that write fails too, the original error wins."""
    try:
        recorder.flush()
    except Exception:  # noqa: BLE001 - e.g. Fenced again; the error being raised says more
        recorder.discard()


class PromptHasher:
    """digest({"model", "messages", "tools"}) of a conversation that only grows, without
    canonicalizing every earlier message again each turn: RFC 8785 composes (an array of canonical
    values, an object of them in key order, is canonical), so each message is encoded once, and
    hashed once: the hash of the conversation so far is kept open and copied to close it."""

    def __init__(self, model_id: str, specs: list[dict[str, Any]]) -> None:
        self._tail = b'],"model":' + canonical_bytes(model_id) + b',"tools":' + canonical_bytes(specs) + b"}"
        self._start()

    def _start(self) -> None:
        self._messages: list[Any] = []
        self._open = hashlib.sha256(b'{"messages":[')

    def __call__(self, messages: list[Any]) -> str:
        known = len(self._messages)
        # The identity check walks the whole conversation each turn: in C (map), not a generator.
        if len(messages) < known or any(map(operator.is_not, self._messages, messages)):
            self._start()  # not the conversation seen so far
            known = 0
        for message in messages[known:]:
            self._open.update(b"," + canonical_bytes(message) if self._messages else canonical_bytes(message))
            self._messages.append(message)
        closed = self._open.copy()
        closed.update(self._tail)
        return "sha256:" + closed.hexdigest()


def _agent_loop(
    *,
    recorder: Recorder,
    record: Record,
    workflow: Workflow,
    step: AIGenerate,
    step_path: str,
    prompt: str,
    prefix: str,
    replay: Any = None,
) -> str:
    provider = workflow.models[step.model]
    tools = {name: workflow.tools[name] for name in step.tools}
    specs = [tools[name].spec() for name in step.tools]
    messages: list[dict[str, Any]] = []
    if step.system:
        messages.append({"role": "system", "content": step.system})
    messages.append({"role": "user", "content": prompt})
    usage = {"inputTokens": 0, "outputTokens": 0}
    tools_hash = digest(specs)
    hashed = PromptHasher(provider.model_id, specs)
    recorded = 0  # messages an earlier turn's harness.model.called already holds
    for turn in range(1, step.max_turns + 1):
        body = {"model": provider.model_id, "messages": messages, "tools": specs}
        delta = {
            "model": provider.model_id,
            "messagesFrom": recorded,
            "messages": messages[recorded:],
            "toolsHash": tools_hash,
        }
        reply = _model_turn(
            recorder,
            record,
            provider,
            workflow.model_policy(step.model),
            step_path,
            prefix,
            turn,
            body,
            delta,
            hashed(messages),
            replay,
        )
        recorded = len(messages)
        for key in usage:
            usage[key] += int(reply.usage.get(key, 0) or 0)
        messages = [*messages, {"role": "assistant", "content": reply.text, "toolCalls": reply.tool_calls}]
        if not reply.tool_calls:
            text = reply.text or ""
            recorder.defer(
                {
                    "type": "harness.session.completed",
                    "payload": {"stepPath": step_path, "role": ROLE, "output": text, "usage": usage},
                }
            )
            return text
        for request in reply.tool_calls:
            tool = tools.get(request.get("name", ""))
            if tool is None:
                raise StepFailure(
                    f"the model asked for tool {request.get('name')!r}, which step {step_path} does not offer",
                    name="UnknownTool",
                )
            field, value = call_tool(
                recorder=recorder,
                record=record,
                tool=tool,
                args=request.get("args", {}),
                call_id=f"{prefix}:turn{turn}:{request.get('id')}",
                step_path=step_path,
                caller="model",
                turn=turn,
                replay=replay,
            )
            messages.append({"role": "tool", "toolCallId": request.get("id"), field: value})
    raise StepFailure(
        f"step {step_path} reached max_turns={step.max_turns} without a final answer", name="MaxTurnsExceeded"
    )


def _model_turn(
    recorder: Recorder,
    record: Record,
    provider: Any,
    policy: ModelPolicy,
    step_path: str,
    prefix: str,
    turn: int,
    body: dict[str, Any],
    delta: dict[str, Any],
    prompt_hash: str,
    replay: Any = None,
) -> ModelReply:
    """`body` is what the provider gets; the log records `delta` (the messages new since the
    previous turn's record) and `prompt_hash`, digest(body), which a resume recomputes."""
    last_error: Any = None
    tries = policy.retries + 1
    for retry in range(tries):
        if retry and isinstance(last_error, Mapping):  # after a failure: its recorded retryAt, if any
            wait_until(recorded_retry_at(last_error))
        call_id = model_call_id(prefix, turn, retry)
        call = record.model_calls.get(call_id)
        called = call is not None and call.called_sequence is not None
        if call is not None and called and call.prompt_hash != prompt_hash:
            # The fast-forwarded conversation no longer produces the recorded request: replaying
            # recorded answers to a different question would be wrong, so stop.
            raise RuntimeIntegrityError(
                f"step {step_path} turn {turn}: the request differs from the recorded "
                f"one ({call.prompt_hash} -> {prompt_hash})",
                stepPath=step_path,
                turn=turn,
            )
        if call is not None and call.status == "responded":
            response = record.response(call)  # as recorded: a long text is read back from its artifact
            return ModelReply(
                text=response.get("text"),
                tool_calls=list(response.get("toolCalls") or []),
                usage=dict(response.get("usage") or {}),
            )
        if call is not None and call.status == "failed":
            last_error = call.error
            continue
        if replay is not None and not called:
            # A re-execution serving models from its original's record: the answer (or the recorded
            # failure) comes from there, or the call diverged (ReplayDiverged); no provider is asked.
            served = replay.serve_model(
                recorder=recorder,
                step_path=step_path,
                call_id=call_id,
                turn=turn,
                prompt_hash=prompt_hash,
                request=delta,
                body=body,
            )
            if served is not None:
                if isinstance(served, ModelReply):
                    return served
                last_error = served
                continue
        if not called:  # committed before the provider is invoked: a crash leaves it pending
            recorder.append(
                {
                    "type": "harness.model.called",
                    "payload": {
                        "turn": turn,
                        "callId": call_id,
                        "stepPath": step_path,
                        "promptHash": prompt_hash,
                        "request": delta,
                    },
                }
            )
        recorder.flush()  # nothing may wait uncommitted while the request is out
        began = time.monotonic()
        try:
            reply = call_with_timeout(
                provider.generate,
                ModelRequest(step_path=step_path, turn=turn, body=body),
                policy.timeout_s,
                f"model call {call_id}",
            )
        except Exception as exc:  # the provider's failure is the call's recorded error, not the executor's
            last_error = {
                "name": "ModelCallTimeout" if isinstance(exc, CallTimedOut) else type(exc).__name__,
                "message": str(exc),
            }
            will_retry = retry + 1 < tries
            retry_at = next_try_at(policy.backoff, retry + 1) if will_retry else None
            if retry_at is not None:
                last_error["retryAt"] = format_recorded_at(retry_at)
            recorder.append(
                {
                    "type": "harness.model.failed",
                    "payload": {
                        "turn": turn,
                        "callId": call_id,
                        "stepPath": step_path,
                        "error": last_error,
                        "durationMs": round((time.monotonic() - began) * 1000),
                        "willRetry": will_retry,
                        # Whether the provider may have billed it (model.request_left): the fold
                        # counts such a failure as a call of unknown cost.
                        "requestLeft": request_left(exc),
                        **({"retryAt": last_error["retryAt"]} if retry_at is not None else {}),
                        "model": {"provider": provider.name, "modelId": provider.model_id},
                    },
                }
            )
            continue
        # Committed with the next write (the claim of the tool call it asks for, or the session's end).
        recorder.defer(
            {
                "type": "harness.model.responded",
                "payload": {
                    "turn": turn,
                    "callId": call_id,
                    "stepPath": step_path,
                    "model": {"provider": provider.name, "modelId": provider.model_id},
                    "response": reply.response(),
                },
            }
        )
        return reply
    message = last_error.get("message") if isinstance(last_error, dict) else last_error
    raise StepFailure(
        f"step {step_path} turn {turn}: the model call failed {tries} times (last: {message})", name="ModelCallFailed"
    )
