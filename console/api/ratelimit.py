"""Events per minute per API key (LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY, default 30,000, or the
operator's override for the key's workspace, `ledger limits`): one key cannot fill the database
and the write path faster than that, whatever its runs. The minute is the
clock's (ledger.clock, UTC), so tests move a fixed clock instead of waiting. Counters live in the
`limits` cache: Redis when REDIS_URL is set (every process counts together), else this process."""

from __future__ import annotations

from typing import Any

from django.core.cache import caches

from ledger import clock
from ledger.errors import LedgerError
from ledger.limits import max_events_per_minute_per_key
from ledger.models import ApiKey


class RateLimited(LedgerError):
    code = "rate_limited"
    status = 429

    def __init__(self, message: str, *, retry_after: int, **details: Any) -> None:
        super().__init__(message, retryAfter=retry_after, **details)
        self.retry_after = retry_after


def max_events_per_minute(key: ApiKey | None = None) -> int:
    """The limit in force for `key`: its workspace's override, else the setting (the workspace
    was loaded with the key: no query)."""
    return max_events_per_minute_per_key(key.workspace if key is not None else None)


def _counter(key: ApiKey) -> tuple[str, int]:
    second = int(clock.now().timestamp())
    return f"events:{key.prefix}:{second // 60}", second


def refund_events(key: ApiKey, count: int) -> None:
    """Give back what `charge_events` counted for a batch the log then refused."""
    name, _ = _counter(key)
    try:
        caches["limits"].decr(name, count)
    except ValueError:
        pass  # the minute's counter is gone: nothing to give back


def charge_events(key: ApiKey, count: int) -> None:
    """Count `count` events against the key's current minute, or refuse them all (429, nothing
    counted) when they would cross the limit."""
    if count <= 0:
        return
    limit = max_events_per_minute(key)
    name, second = _counter(key)
    counters = caches["limits"]
    counters.add(name, 0, timeout=120)
    used = counters.incr(name, count)
    if used > limit:
        counters.decr(name, count)  # a refused batch does not count
        raise RateLimited(
            f"this API key may append at most {limit} events per minute; try again in the next minute",
            retry_after=60 - second % 60,
            limit=limit,
        )
