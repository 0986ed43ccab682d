"""What the sync and the async client share, with no I/O: the retry rule, request bodies, the
deterministic idempotency keys, the server-sent-events parser and the harness payloads."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__version__ = "0.1.0"
USER_AGENT = f"runledger-client/{__version__}"
API = "/api/v1"
MAX_BATCH = 5000  # the server's limit per append (API: invalid_event beyond it)
RUN_ENDINGS = frozenset({"RunCompleted", "RunFailed"})  # what a run at its size limit still takes

Envelope = dict[str, Any]


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed request is sent again: after a network error, a 5xx or a 429 (never another
    4xx), no later than `deadline_s` after the first try (ten minutes by default: an agent outlives
    a server's restart or a load balancer's failover) and, when `attempts` is set, up to that many
    tries in all. The wait doubles from `backoff_s` up to `max_backoff_s`, with jitter (half of it
    random), unless the server said how long in `Retry-After`, which is honoured as given."""

    attempts: int | None = None
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    deadline_s: float = 600.0

    def delay(self, attempt: int, retry_after: float | None, elapsed: float) -> float | None:
        """Seconds to wait before try `attempt + 1`; None when the policy gives up."""
        if self.attempts is not None and attempt >= self.attempts:
            return None
        if retry_after is not None:
            wait = retry_after
        else:
            step = min(self.max_backoff_s, self.backoff_s * 2 ** min(attempt - 1, 60))
            wait = step / 2 + random.uniform(0, step / 2)
        if elapsed + wait > self.deadline_s:
            return None
        return wait


NO_RETRY = RetryPolicy(attempts=1)


def encode(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def base_url(url: str) -> str:
    """The server's address as the clients take it, refused at once (ValueError) unless http(s)
    with a host: a bare `host:port` would fail only at the first request, inside the outbox."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise ValueError(f"base_url must be http://HOST[:PORT] or https://..., not {url!r}")
    return url.rstrip("/")


def unencodable(items: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Exception]]:
    """The events JSON cannot hold (a datetime, a set, NaN in a payload), each with its error."""
    found: list[tuple[dict[str, Any], Exception]] = []
    for item in items:
        try:
            encode(item)
        except (TypeError, ValueError) as exc:
            found.append((item, exc))
    return found


def run_path(run_id: str, *rest: str) -> str:
    return "/".join([f"{API}/runs/{run_id}", *rest])


def new_run_id() -> str:
    return f"run_{uuid.uuid4().hex}"


def new_owner() -> str:
    """Who holds a tool call's lease: this process, unique per client."""
    return f"runledger-client:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Appended(list[Envelope]):
    """The envelopes of an append, in batch order (each with `replayed`), and the run's `last_sequence`."""

    def __init__(self, events: Iterable[Envelope] = (), last_sequence: int = 0) -> None:
        super().__init__(events)
        self.last_sequence = last_sequence

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Appended:
        return cls(body.get("events") or [], int(body.get("lastSequence") or 0))

    def extend_with(self, other: Appended) -> None:
        self.extend(other)
        self.last_sequence = max(self.last_sequence, other.last_sequence)


def event_item(
    type_: str,
    payload: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    occurrence_id: str | None = None,
) -> dict[str, Any]:
    item: dict[str, Any] = {"type": type_, "payload": dict(payload or {})}
    if idempotency_key is not None:
        item["idempotencyKey"] = idempotency_key
    if occurrence_id is not None:
        item["occurrenceId"] = occurrence_id
    return item


def refused_parts(
    batch: list[dict[str, Any]], code: str, details: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]] | None:
    """After the server refused `batch` (all or nothing) with the error `code` and `details`: the
    events to send again first, the ones refused, and those to send again after them; None when
    the refusal is the whole batch's (the key, the run, a fencing token, one event alone). The
    server names the event it refused (`details.index`): the others do not go down with it. A
    body over the server's size limit is halved until it fits or one event is left; a batch over
    the key's events per minute (`rate_limited`, `details.limit`) goes in parts of that size."""
    size, index, limit = len(batch), details.get("index"), details.get("limit")
    if size <= 1:
        return None
    if code == "rate_limited":
        return (batch[:limit], [], batch[limit:]) if isinstance(limit, int) and 0 < limit < size else None
    if code == "payload_too_large":
        return batch[: size // 2], [], batch[size // 2 :]
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < size or code == "run_not_started":
        return None
    if code == "run_too_large":  # the run is full: only its ending is still taken
        rest = batch[index:]
        return (
            batch[:index],
            [e for e in rest if e["type"] not in RUN_ENDINGS],
            [e for e in rest if e["type"] in RUN_ENDINGS],
        )
    return batch[:index], [batch[index]], batch[index + 1 :]


def over_the_rate(code: str, details: Mapping[str, Any], body: Any) -> bool:
    """A 429 for an append of more events than the key may append in a minute (`details.limit`):
    no wait lets it through, so it is not retried (it goes in parts: `refused_parts`)."""
    limit = details.get("limit")
    events = body.get("events") if isinstance(body, Mapping) else None
    return code == "rate_limited" and isinstance(limit, int) and isinstance(events, list) and len(events) > limit


def lease_wait(details: Mapping[str, Any], elapsed: float, policy: RetryPolicy) -> float | None:
    """Seconds until the lease of a `tool_call_in_progress` ends (`details.leaseExpiresAt`), when
    the retry policy lets the claim wait that long; else None. The lease is a crashed harness's
    (a restart from the top claims its calls again) or a live one's: either way, claimed again
    once it ends, the call is answered as the gateway decides (its result, in doubt, or run)."""
    expires = details.get("leaseExpiresAt")
    try:
        until = datetime.fromisoformat(expires).timestamp() if isinstance(expires, str) else None
    except ValueError:
        until = None
    if until is None:
        return None
    wait = max(0.0, until - time.time()) + 0.5  # past the server's expiry, whatever the clocks say
    if elapsed + wait > policy.deadline_s:
        return None
    return wait


def check_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, Mapping) or not isinstance(item.get("type"), str):
        raise TypeError(f"an event is a mapping with a 'type' string, not {item!r}")
    return dict(item)


class KeyMaker:
    """Idempotency keys `<writer>:<n>`, n counting the events this writer has given the run (0 is
    RunStarted's). A retry resends the keys it was given, so it is a replay, never a second event;
    and a harness restarted with the same writer name that appends the same events in the same
    order gets replays too (a different event under a used key is 409 idempotency_conflict)."""

    def __init__(self, writer: str, start: int = 0) -> None:
        if not writer or ":" in writer:
            raise ValueError("writer must be a non-empty name without ':'")
        self.writer = writer
        self.next = start

    def keyed(self, item: dict[str, Any]) -> dict[str, Any]:
        if "idempotencyKey" not in item:
            item["idempotencyKey"] = f"{self.writer}:{self.next}"
        self.next += 1
        return item

    def name(self, kind: str) -> str:
        """A deterministic id for the writer's `kind` objects (tool calls): `<writer>:<kind><n>`."""
        self.next += 1
        return f"{self.writer}:{kind}{self.next - 1}"


def canonical_digest(value: Any) -> str:
    """sha256 of the value's sorted-key, compact JSON ("sha256:<hex>"), as promptHash and manifestHash carry."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def error_payload(exc: BaseException) -> dict[str, str]:
    return {"name": type(exc).__name__, "message": str(exc)}


# A model call's failure and whether its request left (`requestLeft` of harness.model.failed): the
# server counts one that may have left as a call of unknown cost, which the provider may have
# billed (the server's docs/operations.md § Prices). The HTTP libraries name the failures before a
# request goes out alike: httpx, httpx2 (the openai SDK's) and httpcore beneath them.
_TRANSPORTS = frozenset({"httpx", "httpx2", "httpcore"})
_NOT_CONNECTED = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"})
_RETRY_COUNT = "x-stainless-retry-count"  # the openai and anthropic SDKs' try number, on each request


def request_left(exc: BaseException) -> bool:
    """Whether a model call that raised `exc` may have sent its request, so the provider may bill
    it (its cost unknown, never 0). Read from `exc` and the exceptions it was raised from: one that
    says so with a bool `request_left` attribute (the server's runtime providers' convention); else
    the first failure of a connection or an HTTP library, which did not send only when none was made
    (refused, unresolved, timed out connecting) on an SDK's first try (a try before it may have
    left: x-stainless-retry-count); else yes, as a failure nobody explains may come after."""
    chain = _chain(exc)
    for error in chain:
        said = getattr(error, "request_left", None)
        if isinstance(said, bool):
            return said
    for error in chain:  # the outermost failure of the connection decides
        if isinstance(error, ConnectionRefusedError | socket.gaierror):
            return _retried(chain)
        if isinstance(error, ConnectionError | TimeoutError):  # reset, aborted, a broken pipe, timed out
            return True
        if type(error).__module__.partition(".")[0] in _TRANSPORTS:
            return type(error).__name__ not in _NOT_CONNECTED or _retried(chain)
    return True


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it was raised from (its cause, else the exception it was raised while
    handling, as a traceback prints them), outermost first."""
    chain: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and len(chain) < 32 and all(error is not seen for seen in chain):
        chain.append(error)
        error = error.__cause__ if error.__cause__ is not None or error.__suppress_context__ else error.__context__
    return chain


def _retried(chain: list[BaseException]) -> bool:
    """An SDK's request that failed was not its first try (an earlier one may have left)."""
    for error in chain:
        try:
            headers = getattr(getattr(error, "request", None), "headers", None)
        except RuntimeError:  # httpx's `.request` of an error raised without one
            continue
        count = headers.get(_RETRY_COUNT) if headers is not None else None
        if isinstance(count, str):
            return count.strip() != "0"
    return False


# --- server-sent events -------------------------------------------------------------------------


@dataclass
class SseMessage:
    event: str
    data: str
    id: str | None


class SseParser:
    """Lines in, messages out (the WHATWG event-stream rules this server uses: comments ignored,
    `data` lines joined with newlines, a blank line dispatches)."""

    def __init__(self) -> None:
        self._event, self._data, self._id = "", [], None  # type: tuple[str, list[str], str | None]

    def feed(self, line: str) -> SseMessage | None:
        if line == "":
            if not self._data and not self._event:
                return None
            message = SseMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        return None


# --- the harness vocabulary (docs/api.md, ledger/log/vocabulary.py) -------------------------------------


def model_responded(
    *, turn: int, call_id: str, step_path: str | None, provider: str, model_id: str, response: Mapping[str, Any]
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "turn": turn,
        "callId": call_id,
        "model": {"provider": provider, "modelId": model_id},
        "response": dict(response),
    }
    if step_path is not None:
        payload["stepPath"] = step_path
    return payload


def response_body(
    text: str | None, tool_calls: list[Any] | None, usage: Mapping[str, Any] | None, extra: Mapping[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {**extra, "usage": dict(usage or {})}
    if text is not None:
        body["text"] = text
    if tool_calls is not None:
        body["toolCalls"] = list(tool_calls)
    return body
