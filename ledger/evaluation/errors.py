"""The refusals of evaluations, with the codes of docs/api.md "Evaluations"."""

from __future__ import annotations

from ..errors import LedgerError


class InvalidEvaluation(LedgerError):
    code = "invalid_request"


class EvaluationForbidden(LedgerError):
    code = "forbidden"
    status = 403


class BudgetExhausted(Exception):
    """Raised by the spend guard before a live model call: the call fails, the provider is never
    asked (not a LedgerError: it is the call's recorded error, never an API answer)."""

    request_left = False  # refused before the provider was asked: nothing is owed (model.request_left)
