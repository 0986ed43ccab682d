"""The time the ledger reads.

`now()` is what the control services (the tool gateway's leases, run leases) compare against;
tests move time forward by patching it instead of sleeping. `recorded_now()` is what an append
stamps as `recordedAt` and a new run as its creation time: the moment of the write.

One exception, for one caller: `ledger demo` lays out a month of history, so it runs workflows
inside `backdated(at)`, which shifts both clocks back by a fixed offset for the current context
(time still advances inside it). Nothing else uses it; an event's `recordedAt` is never part of
its id or hash, so a backdated log verifies like any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta

from django.utils import timezone

_OFFSET: ContextVar[timedelta] = ContextVar("ledger_clock_offset", default=timedelta(0))


def now() -> datetime:
    return timezone.now() - _OFFSET.get()


def recorded_now() -> datetime:
    return timezone.now() - _OFFSET.get()


@contextmanager
def backdated(at: datetime) -> Iterator[None]:
    """Run the block as if it started at `at` (see the module docstring: the demo's history)."""
    token = _OFFSET.set(timezone.now() - at)
    try:
        yield
    finally:
        _OFFSET.reset(token)
