"""What a run's log already holds, indexed the way the executor asks for it.

The log has one reader, the fold (ledger.fold): this module only indexes its RunState for
fast-forwarding — sessions by step path, model calls by call id, a tool call's recorded outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..fold import HarnessSession, ModelCall, ParallelGroup, RunState, StepState, fold
from ..log import artifacts
from ..models import RunStatus, Workspace

ENDED = ("completed", "failed")  # a parallel branch's or group's terminal statuses


class Record:
    """A run's fold state at the moment the executor took its lease."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        # stepPath -> the newest session of the step that is still open / ended this way
        self.open_sessions: dict[str, HarnessSession] = {}
        self.failed_sessions: dict[str, HarnessSession] = {}
        self.completed_sessions: dict[str, HarnessSession] = {}
        for session in state.sessions:
            if session.step_path is None:
                continue
            if session.status == "started":
                self.open_sessions[session.step_path] = session
                continue
            ended = self.failed_sessions if session.status == "failed" else self.completed_sessions
            ended[session.step_path] = session
            self.open_sessions.pop(session.step_path, None)
        # by callId (one per step attempt, turn and retry of the call)
        self.model_calls: dict[str, ModelCall] = {c.call_id: c for c in state.model_calls if c.call_id}

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def last_sequence(self) -> int:
        return self.state.last_sequence

    @property
    def finished(self) -> bool:
        return self.state.status in RunStatus.finished()

    def step(self, path: str) -> StepState | None:
        return self.state.steps.get(path)

    def group(self, path: str) -> ParallelGroup | None:
        return self.state.parallel_groups.get(path)

    def tool_started(self, call_id: str) -> bool:
        call = self.state.tool_calls.get(call_id)
        return call is not None and call.started_sequence is not None

    def tool_outcome(self, call_id: str) -> tuple[str, Any] | None:
        """("result", value) or ("error", value) of a call that ended (or was reconciled)."""
        call = self.state.tool_calls.get(call_id)
        if call is None or call.status not in ("succeeded", "failed"):
            return None
        return ("result", call.result) if call.status == "succeeded" else ("error", call.error)


def read_record(run_id: str, events: Sequence[Mapping[str, Any]]) -> Record:
    return Record(fold(events, run_id=run_id))


def attempt_of(step: StepState) -> int:
    """The newest attempt started (0 before the first)."""
    return step.attempts[-1].attempt if step.attempts else 0


def retriable(step: StepState) -> bool:
    return step.status == "failed" and isinstance(step.error, Mapping) and step.error.get("retriable") is True


def inline_or_ref(workspace: Workspace, value: Any, ref: str | None) -> Any:
    """A recorded value, read back from its artifact (hash re-checked) when it was moved out."""
    if ref is None:
        return value
    return json.loads(artifacts.read_bytes(artifacts.get_by_ref(workspace, ref)))
