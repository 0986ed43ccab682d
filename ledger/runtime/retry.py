"""Retry moments: when a retry may start after a failure (registry.Backoff, jittered), recorded as
`retryAt` on the failure (StepFailed's error, harness.model.failed), and the wait for it, which a
resumed run starts from the recorded moment, not from zero."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime

from .. import clock
from .registry import Backoff


def next_try_at(backoff: Backoff | None, failed_attempt: int) -> datetime | None:
    """When the next try may start after try `failed_attempt` (1-based) failed: None (at once)
    without a backoff."""
    if backoff is None:
        return None
    return clock.now() + timedelta(seconds=backoff.delay_s(failed_attempt, random.random()))


def recorded_retry_at(error: Any) -> datetime | None:
    """The `retryAt` a recorded failure's error holds, if any."""
    value = error.get("retryAt") if isinstance(error, Mapping) else None
    return parse_datetime(value) if isinstance(value, str) else None


def wait_until(moment: datetime | None) -> None:
    """Sleep until `moment` (ledger.clock's time); at once when it passed or is None. The run's
    lease is kept meanwhile by the recorder's heartbeat."""
    if moment is None:
        return
    remaining = (moment - clock.now()).total_seconds()
    if remaining > 0:
        time.sleep(remaining)
