"""Typed errors. Every refusal of the server is an `ApiError` carrying the error body's `code`,
`message` and `details` (docs/api.md "Conventions"), of the subclass named after its code when there is
one (`SequenceConflict`, `Fenced`, ...), else of the subclass of its HTTP status."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any


class RunledgerError(Exception):
    """Anything this client raises on purpose."""


class TransportError(RunledgerError):
    """The server could not be reached (or answered nothing usable) within the retry policy."""


class ToolCallFailed(RunledgerError):
    """`call_tool` of a call whose recorded outcome is a failure (a replay of it, or the tool's own)."""

    def __init__(self, call_id: str, error: Any) -> None:
        super().__init__(f"tool call {call_id} failed: {error!r}")
        self.call_id = call_id
        self.error = error


class ApiError(RunledgerError):
    """The server answered with the error body. `code` is the API's stable snake_case code."""

    status: int = 0
    code: str = ""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """5xx and 429 may succeed later; every other 4xx is the request's own fault and is final."""
        return self.status >= 500 or self.status == 429


class BadRequest(ApiError):
    """400: the request does not fit the contract (details say where)."""


class Unauthenticated(ApiError):
    """401: no key, or a key the server does not know (revoked)."""


class Forbidden(ApiError):
    """403: the key lacks the scope (`insufficient_scope`), or the role is missing."""


class NotFound(ApiError):
    """404: no such object in the key's workspace."""


class Conflict(ApiError):
    """409: the log's state refuses the request."""


class PayloadTooLarge(ApiError):
    """413: the body is over the server's limit (10 MiB)."""


class RateLimited(ApiError):
    """429 (retried automatically, honouring Retry-After, until the policy gives up)."""


class ServerError(ApiError):
    """5xx (retried automatically until the policy gives up)."""


class InvalidEvent(BadRequest):
    code = "invalid_event"


class UnknownEventType(BadRequest):
    code = "unknown_event_type"


class SequenceConflict(Conflict):
    """`expectedSequence` did not match: `details["expected"]`, `details["actual"]`."""

    code = "sequence_conflict"

    @property
    def actual(self) -> int | None:
        value = self.details.get("actual")
        return value if isinstance(value, int) else None


class IdempotencyConflict(Conflict):
    """An idempotency key (or tool call id) was used before for a different event or call."""

    code = "idempotency_conflict"


class Fenced(Conflict):
    """The run is leased to another executor: a missing or stale fencing token."""

    code = "fenced"


class RunNotStarted(Conflict):
    code = "run_not_started"


class RunAlreadyStarted(Conflict):
    code = "run_already_started"


class RunFinished(Conflict):
    code = "run_finished"


class ToolCallInProgress(Conflict):
    code = "tool_call_in_progress"


class ToolCallInDoubt(Conflict):
    code = "tool_call_in_doubt"


class LeaseLost(Conflict):
    code = "lease_lost"


_BY_CODE: dict[str, type[ApiError]] = {
    cls.code: cls
    for cls in (
        InvalidEvent,
        UnknownEventType,
        SequenceConflict,
        IdempotencyConflict,
        Fenced,
        RunNotStarted,
        RunAlreadyStarted,
        RunFinished,
        ToolCallInProgress,
        ToolCallInDoubt,
        LeaseLost,
    )
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_from(status: int, body: bytes, retry_after: str | None = None) -> ApiError:
    """The typed error of a response `status` >= 400 with `body` (the error body, or anything a proxy sent)."""
    code, message, details = "", "", {}  # type: tuple[str, str, dict[str, Any]]
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        code = str(error.get("code") or "")
        message = str(error.get("message") or "")
        found = error.get("details")
        details = found if isinstance(found, dict) else {}
    if not code:  # not our error body: a proxy's page, a server that died mid-answer
        code = "server_error" if status >= 500 else f"http_{status}"
        message = body[:200].decode("utf-8", "replace")
    cls = _BY_CODE.get(code) or (ServerError if status >= 500 else _BY_STATUS.get(status, ApiError))
    return cls(status, code, message, details, retry_after_seconds(retry_after))
