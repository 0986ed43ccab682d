"""The time the ledger reads.

`now()` is what the control services (the tool gateway's leases, run leases) compare against;
tests move time forward by patching it instead of sleeping. `recorded_now()` is what an append
stamps as `recordedAt` and a new run as its creation time: the moment of the write.

One exception, for one caller: `ledger demo` lays out a month of history, so it runs workflows
inside `backdated(at)`, which shifts both clocks back by a fixed offset for the current context
(time still advances inside it). Nothing else uses it; an event's `recordedAt` is never part of
its id or hash, so a backdated log verifies like any other.

And one more: `ledger import-little` appends each event of a Little Workflow log inside
`recorded_at(at)`, which stamps exactly the `recordedAt` the log holds (the moment it was first
written), not the moment of the import.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta

from django.utils import timezone

_OFFSET: ContextVar[timedelta] = ContextVar("ledger_clock_offset", default=timedelta(0))
_RECORDED_AT: ContextVar[datetime | None] = ContextVar("ledger_clock_recorded_at", default=None)


def iso(moment: datetime | None) -> str | None:
    """A moment as the API writes every one: ISO 8601 in UTC with `Z` (`2026-12-06T05:01:05.742910Z`),
    as DRF's own DateTimeField writes it; None stays None."""
    if moment is None:
        return None
    text = moment.astimezone(UTC).isoformat() if moment.tzinfo is not None else moment.isoformat()
    return text.removesuffix("+00:00") + "Z" if text.endswith("+00:00") else text


def now() -> datetime:
    return timezone.now() - _OFFSET.get()


def recorded_now() -> datetime:
    fixed = _RECORDED_AT.get()
    return fixed if fixed is not None else timezone.now() - _OFFSET.get()


@contextmanager
def backdated(at: datetime) -> Iterator[None]:
    """Run the block as if it started at `at` (see the module docstring: the demo's history)."""
    token = _OFFSET.set(timezone.now() - at)
    try:
        yield
    finally:
        _OFFSET.reset(token)


@contextmanager
def recorded_at(at: datetime) -> Iterator[None]:
    """Stamp appends in the block with `at` exactly (see the module docstring: imported logs)."""
    token = _RECORDED_AT.set(at)
    try:
        yield
    finally:
        _RECORDED_AT.reset(token)
