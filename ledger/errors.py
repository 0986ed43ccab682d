"""Domain errors. Each carries the docs/api.md error code and HTTP status; the API's exception
handler turns them into the error body, the CLI into a message and exit code."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    code = "ledger_error"
    status = 400

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def error_body(self) -> dict[str, Any]:
        """The API's error body `{"error": {code, message, details}}` (not an event envelope)."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(LedgerError):
    """A field of a request is missing or out of its limits (`details.field` names it)."""

    code = "invalid_request"


class InvalidRunId(LedgerError):
    code = "invalid_run_id"


class InvalidEvent(LedgerError):
    code = "invalid_event"


class UsageTooLarge(InvalidEvent):
    """The batch's model calls would carry a sum (tokens, dollars) past what the projections' or the
    usage rollups' columns hold (docs/api.md "Token counts"); nothing is written."""


class UnknownEventType(LedgerError):
    code = "unknown_event_type"


class CostNotAllowed(LedgerError):
    code = "cost_not_allowed"


class NotFound(LedgerError):
    code = "not_found"
    status = 404


class Conflict(LedgerError):
    status = 409


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"


class SequenceConflict(Conflict):
    code = "sequence_conflict"


class Fenced(Conflict):
    code = "fenced"


class RunNotStarted(Conflict):
    code = "run_not_started"


class RunAlreadyStarted(Conflict):
    code = "run_already_started"


class RunFinished(Conflict):
    code = "run_finished"


class RunTooLarge(LedgerError):
    """The run already holds the deployment's limit of events (docs/security.md "Size limits")."""

    code = "run_too_large"
    status = 413


class IntegrityFailure(LedgerError):
    """Stored bytes no longer match their hash: never served silently."""

    code = "integrity_failure"
    status = 500
