"""Errors of the runtime. Integrity errors refuse a run before it writes anything and are never
recorded as RunFailed (Little Workflow's rule): the log is fine, the caller's request is not."""

from __future__ import annotations

from ..errors import Conflict, LedgerError, NotFound


class RuntimeIntegrityError(Conflict):
    code = "runtime_integrity"


class RunInputMismatch(RuntimeIntegrityError):
    code = "run_input_mismatch"


class UnknownWorkflow(NotFound):
    code = "unknown_workflow"


class StepFailure(LedgerError):
    """A step failed: recorded as StepFailed, then RunFailed."""

    code = "step_failed"

    def __init__(self, message: str, *, name: str = "StepError", **details: object) -> None:
        super().__init__(message, **details)
        self.name = name

    def as_error(self) -> dict[str, object]:
        return {"name": self.name, "message": self.message}


class UnknownModelProvider(LedgerError):
    code = "unknown_model_provider"


class UnknownStep(LedgerError):
    code = "unknown_step"


class InvalidReexecution(LedgerError):
    code = "invalid_reexecution"


class ReplayDiverged(StepFailure):
    """A re-execution asked for a call its original's record cannot answer (never made live)."""

    code = "replay_diverged"

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message, name="ReplayDiverged", **details)


WAITING_APPROVAL = "waiting_approval"


class WaitingApproval(Exception):
    """A tool call that needs a human approver has none yet (ledger/replay/toolapproval.py): the run
    stops where it is, its lease is given back, and it continues on resume once decided. Not a
    failure: nothing of it is recorded as StepFailed or RunFailed."""

    def __init__(self, *, run_id: str, call_id: str, tool_name: str, args_digest: str, step_path: str) -> None:
        super().__init__(f"run {run_id} waits for approval of tool call {call_id} ({tool_name})")
        self.run_id, self.call_id, self.tool_name = run_id, call_id, tool_name
        self.args_digest, self.step_path = args_digest, step_path

    def as_error(self) -> dict[str, object]:
        return {
            "name": "WaitingApproval",
            "message": str(self),
            "callId": self.call_id,
            "toolName": self.tool_name,
            "argsDigest": self.args_digest,
            "stepPath": self.step_path,
        }
