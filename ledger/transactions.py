"""Services whose refusals must not roll back what they wrote first."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import transaction

from .errors import LedgerError

P = ParamSpec("P")
T = TypeVar("T")


def atomic_then_refuse(service: Callable[P, T | LedgerError]) -> Callable[P, T]:
    """Run `service` in one transaction; a refusal it *returns* is raised after the commit.

    Some refusals come with a write that must stand: a tool-call lease found expired after the
    request left turns the call in doubt (a row change and an event) *and* refuses the caller; an
    approval that arrives too late marks the request expired *and* refuses the approver. Raising
    inside the transaction would roll the first half back, so these services return their
    refusals, and raise only for bad input.
    """
    atomic_service = transaction.atomic(service)

    @functools.wraps(service)
    def refusing(*args: P.args, **kwargs: P.kwargs) -> T:
        outcome = atomic_service(*args, **kwargs)
        if isinstance(outcome, LedgerError):
            raise outcome
        return outcome

    return refusing
