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
