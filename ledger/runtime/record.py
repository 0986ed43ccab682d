"""What a run's log already holds, indexed the way the executor asks for it.

The fold's RunState keeps what the console needs; fast-forwarding also needs the recorded model
responses and tool outcomes verbatim, so this reads the envelopes directly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import artifacts
from ..models import Workspace


@dataclass
class StepRecord:
    scheduled: bool = False
    attempt: int = 0  # the newest StepAttemptStarted
    status: str = "scheduled"  # scheduled | running | completed | failed
    output: Any = None
    output_ref: str | None = None
    error: Any = None


@dataclass
class Record:
    run_id: str
    started: dict[str, Any] | None = None  # RunStarted payload
    terminal: tuple[str, dict[str, Any]] | None = None  # (RunCompleted | RunFailed, payload)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    open_sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # stepPath -> started payload
    model_called: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    model_responded: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    tool_outcomes: dict[str, tuple[str, Any]] = field(default_factory=dict)  # callId -> (result|error, value)
    last_sequence: int = 0


def read_record(run_id: str, events: Sequence[Mapping[str, Any]]) -> Record:
    record = Record(run_id=run_id)
    for env in events:
        record.last_sequence = env["sequence"]
        kind, p = env["type"], env["payload"]
        path = p.get("stepPath")
        if kind == "RunStarted":
            record.started = dict(p)
        elif kind in ("RunCompleted", "RunFailed"):
            record.terminal = (kind, dict(p))
        elif kind == "StepScheduled":
            record.steps.setdefault(path, StepRecord()).scheduled = True
        elif kind == "StepAttemptStarted":
            step = record.steps.setdefault(path, StepRecord())
            step.attempt, step.status = p["attempt"], "running"
        elif kind == "StepCompleted":
            step = record.steps.setdefault(path, StepRecord())
            step.status, step.output, step.output_ref = "completed", p.get("output"), p.get("outputRef")
        elif kind == "StepFailed":
            step = record.steps.setdefault(path, StepRecord())
            step.status, step.error = "failed", p.get("error")
        elif kind == "harness.session.started":
            record.open_sessions[path] = dict(p)
        elif kind in ("harness.session.completed", "harness.session.failed"):
            record.open_sessions.pop(path, None)
        elif kind == "harness.model.called":
            record.model_called[(path, p["turn"])] = dict(p)
        elif kind == "harness.model.responded":
            record.model_responded[(path, p["turn"])] = dict(p)
        elif kind == "harness.tool_call.succeeded":
            record.tool_outcomes[p["callId"]] = ("result", p.get("result"))
        elif kind == "harness.tool_call.failed":
            record.tool_outcomes[p["callId"]] = ("error", p.get("error"))
        elif kind == "harness.tool_call.reconciled":
            field_ = "result" if p.get("outcome") == "succeeded" else "error"
            record.tool_outcomes[p["callId"]] = (field_, p.get(field_))
    return record


def inline_or_ref(workspace: Workspace, value: Any, ref: str | None) -> Any:
    """A recorded value, read back from its artifact (hash re-checked) when it was moved out."""
    if ref is None:
        return value
    return json.loads(artifacts.read_bytes(artifacts.get_by_ref(workspace, ref)))
