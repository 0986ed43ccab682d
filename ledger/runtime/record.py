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

    @property
    def retriable(self) -> bool:
        return self.status == "failed" and isinstance(self.error, Mapping) and self.error.get("retriable") is True


@dataclass
class GroupRecord:
    """A parallel group's own events: which were written, so a resume writes only the rest."""

    started: bool = False
    scheduled: set[str] = field(default_factory=set)  # branch paths
    ended: dict[str, str] = field(default_factory=dict)  # branch path -> completed | failed
    finished: bool = False


@dataclass
class Record:
    run_id: str
    started: dict[str, Any] | None = None  # RunStarted payload
    terminal: tuple[str, dict[str, Any]] | None = None  # (RunCompleted | RunFailed, payload)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    open_sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # stepPath -> started payload
    # stepPath -> (sequence, error or output, attempt) of the newest ended session
    failed_sessions: dict[str, tuple[int, Any, int]] = field(default_factory=dict)
    completed_sessions: dict[str, tuple[int, Any, int]] = field(default_factory=dict)
    # by callId (one per step attempt, turn and retry of the call)
    model_called: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_responded: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_failed: dict[str, dict[str, Any]] = field(default_factory=dict)
    tool_started: dict[str, dict[str, Any]] = field(default_factory=dict)  # callId -> started payload
    tool_outcomes: dict[str, tuple[str, Any]] = field(default_factory=dict)  # callId -> (result|error, value)
    groups: dict[str, GroupRecord] = field(default_factory=dict)  # parallel step path -> its events
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
            opened = record.open_sessions.get(path) or {}
            if kind == "harness.session.failed":
                record.failed_sessions[path] = (env["sequence"], p.get("error"), opened.get("attempt", 1))
            else:
                record.completed_sessions[path] = (env["sequence"], p.get("output"), opened.get("attempt", 1))
            record.open_sessions.pop(path, None)
        elif kind == "harness.model.called":
            record.model_called[p.get("callId") or f"{path}:turn{p['turn']}"] = dict(p)
        elif kind == "harness.model.responded":
            record.model_responded[p["callId"]] = dict(p)
        elif kind == "harness.model.failed":
            record.model_failed[p.get("callId") or f"{path}:turn{p['turn']}"] = dict(p)
        elif kind == "harness.tool_call.started":
            record.tool_started[p["callId"]] = dict(p)
        elif kind == "harness.tool_call.succeeded":
            record.tool_outcomes[p["callId"]] = ("result", p.get("result"))
        elif kind == "harness.tool_call.failed":
            record.tool_outcomes[p["callId"]] = ("error", p.get("error"))
        elif kind == "harness.tool_call.reconciled":
            field_ = "result" if p.get("outcome") == "succeeded" else "error"
            record.tool_outcomes[p["callId"]] = (field_, p.get(field_))
        elif kind.startswith("Parallel"):
            _group_event(record.groups.setdefault(path, GroupRecord()), kind, p)
    return record


def _group_event(group: GroupRecord, kind: str, p: Mapping[str, Any]) -> None:
    if kind == "ParallelGroupStarted":
        group.started = True
    elif kind == "ParallelBranchScheduled":
        group.scheduled.add(p["branchPath"])
    elif kind in ("ParallelBranchCompleted", "ParallelBranchFailed"):
        group.ended[p["branchPath"]] = "completed" if kind == "ParallelBranchCompleted" else "failed"
    elif kind in ("ParallelGroupCompleted", "ParallelGroupFailed"):
        group.finished = True


def inline_or_ref(workspace: Workspace, value: Any, ref: str | None) -> Any:
    """A recorded value, read back from its artifact (hash re-checked) when it was moved out."""
    if ref is None:
        return value
    return json.loads(artifacts.read_bytes(artifacts.get_by_ref(workspace, ref)))
