"""What a run's log already holds, indexed the way the executor asks for it.

The log has one reader, the fold (ledger.fold): this module only indexes its RunState for
fast-forwarding — sessions by step path, model calls by call id, a tool call's recorded outcome.
The fold reads no artifact, so what a replay answers with (a model's answer, a tool's outcome, a
session's output) is read back from its event when `externalize` moved part of it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..fold import HarnessSession, ModelCall, ParallelGroup, RunState, StepState, fold
from ..log import artifacts
from ..models import Run, RunStatus

ENDED = ("completed", "failed")  # a parallel branch's or group's terminal statuses


class Record:
    """A run's fold state at the moment the executor took its lease."""

    def __init__(self, state: RunState, *, run: Run | None = None, log: Sequence[Mapping[str, Any]] = ()) -> None:
        self.state = state
        self._run, self._log = run, log  # the run and the envelopes `state` was folded from
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

    def tool_claimed_unfinished(self, call_id: str) -> bool:
        """Claimed at the gateway (`harness.tool_call.started`) by an earlier execution, with no
        outcome since: that execution stopped while the call was out."""
        call = self.state.tool_calls.get(call_id)
        return call is not None and call.status == "started"

    def tool_outcome(self, call_id: str) -> tuple[str, Any] | None:
        """("result", value) or ("error", value) of a call that ended (or was reconciled)."""
        call = self.state.tool_calls.get(call_id)
        if call is None or call.status not in ("succeeded", "failed"):
            return None
        field = "result" if call.status == "succeeded" else "error"
        return field, self.recorded(call.ended_sequence, field, call.result if field == "result" else call.error)

    def response(self, call: ModelCall) -> Mapping[str, Any]:
        """A model call's answer as it was recorded ({} when it has none)."""
        response = self.recorded(call.responded_sequence, "response", call.response)
        return response if isinstance(response, Mapping) else {}

    def session_output(self, session: HarnessSession) -> Any:
        return self.recorded(session.ended_sequence, "output", session.output)

    def recorded(self, sequence: int | None, name: str, folded: Any) -> Any:
        return recorded_field(self._run, self._log, sequence, name, folded)

    def value(self, value: Any, ref: str | None) -> Any:
        """A run-level value of the fold (the run's input or output, a step's output) as recorded:
        inline_or_ref against this record's run."""
        if not ref:
            return value
        if self._run is None:  # never a null in place of the recorded value
            raise ValueError(f"run {self.run_id}'s value {ref} is an artifact; reading it back needs the run")
        return inline_or_ref(self._run, value, ref)


def recorded_field(
    run: Run | None, log: Sequence[Mapping[str, Any]], sequence: int | None, name: str, folded: Any
) -> Any:
    """Field `name` of event `sequence` of `run`'s `log` as it was recorded: `folded` (what the
    fold kept of it) unless the log moved it, or part of it, into an artifact; then the event's
    payload read back through artifacts.as_recorded (each artifact re-hashed)."""
    env = log[sequence - 1] if sequence and 0 < sequence <= len(log) else None
    if env is None or env["sequence"] != sequence:
        return folded
    moved = artifacts.moved_members(env["type"], env["payload"])
    if not any(m == name or m.startswith(f"{name}.") for m in moved):
        return folded
    if run is None:  # never a null in place of the recorded value
        raise ValueError(f"event {sequence}'s {name} is an artifact; reading it back needs the run")
    return artifacts.as_recorded(run, env["type"], env["payload"]).get(name)


def read_record(run_id: str, events: Sequence[Mapping[str, Any]], *, run: Run | None = None) -> Record:
    """The fold of `events`, the log of `run` (which a replay of a value moved into an artifact
    needs: Record.recorded)."""
    return Record(fold(events, run_id=run_id), run=run, log=events)


def attempt_of(step: StepState) -> int:
    """The newest attempt started (0 before the first)."""
    return step.attempts[-1].attempt if step.attempts else 0


def retriable(step: StepState) -> bool:
    return step.status == "failed" and isinstance(step.error, Mapping) and step.error.get("retriable") is True


def inline_or_ref(run: Run, value: Any, ref: str | None) -> Any:
    """A value of `run`'s log as recorded (its input, a step's or the run's output): `value`, or,
    when it was moved out (`inputRef`, `outputRef`), read back from its artifact by
    artifacts.read_ref, the same reading as a replay's (ours or an imported log's ref, re-hashed;
    a missing or changed artifact is an IntegrityFailure)."""
    if not ref:
        return value
    return artifacts.read_ref(run, ref)
