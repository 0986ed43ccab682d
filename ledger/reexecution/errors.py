"""The refusals of re-execution, with the codes of docs/api.md "Re-execution"."""

from __future__ import annotations

from ..errors import Conflict, LedgerError


class InvalidReexecution(LedgerError):
    code = "invalid_request"


class Forbidden(LedgerError):
    code = "forbidden"
    status = 403


class SelfApprovalForbidden(LedgerError):
    code = "self_approval_forbidden"
    status = 403


class ApprovalExpired(Conflict):
    code = "approval_expired"


class PlanChanged(Conflict):
    code = "plan_changed"


class NotPending(Conflict):
    """Approve or deny of a request that was already decided."""

    code = "reexecution_not_pending"


class LeaseLost(Conflict):
    code = "lease_lost"
