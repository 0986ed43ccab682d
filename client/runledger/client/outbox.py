"""Background delivery: what `Run.emit` hands over, sent by one thread per client, so that an agent
never waits on the network to record a fact and never sees a transport failure.

Each run's events wait in order in a bounded buffer (`max_buffered` events for the whole client).
The thread sends a run's events in batches of its `batch_size`, when that many wait, when the
oldest has waited `flush_interval` seconds, or when someone flushes; batches of one run go one at
a time, in order, so the log keeps the order they were emitted in. A batch the server cannot take
yet (no answer, a 5xx, a 429) is sent again under the client's retry policy (every event carries
its idempotency key, so a resend is a replay, never a second copy) for as long as the policy allows
(`RetryPolicy.deadline_s`: ten minutes by default). What cannot be delivered (the policy gave up,
the server refused it with a 4xx, the buffer was full, the process exited first) is reported: a log
line on `runledger.client`, the client's `on_undelivered` callback, and, with `spool_dir`, a file
that `Client.deliver_spooled()` sends later. A refusal takes down only what it refuses: the event
the server names (`details.index`: an unknown type, a payload it refuses, past the run's size limit)
is reported alone and the rest of its batch sent again without it; a body over the server's 10 MiB
is sent in halves, a batch over the key's events per minute in parts the limit lets through.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from . import _core
from ._core import Appended
from .errors import ApiError, RunledgerError, TransportError, error_from

if TYPE_CHECKING:
    from .sync import Client, Run

log = logging.getLogger("runledger.client")


class BufferFull(RunledgerError):
    """More events waited to be sent than the client's `max_buffered`."""


class NotDelivered(RunledgerError):
    """The process was exiting (or the client closing) before the server took these events."""


@dataclass
class Undelivered:
    """Events of one run the server did not take, why, and the spool file holding them (if any)."""

    run_id: str
    events: list[dict[str, Any]]
    error: BaseException
    spooled: Path | None = None


@dataclass
class _Waiting:
    """One run's events not yet sent, and the batch on its way."""

    run: Run
    items: deque[dict[str, Any]] = field(default_factory=deque)
    since: float = 0.0  # when the oldest waiting event was emitted (monotonic)
    flush: bool = False  # someone waits for the run to be sent: send without waiting for a full batch
    sending: int = 0  # events of the batch on its way
    collected: Appended | None = None  # what a waiting flush() returns


class Outbox:
    def __init__(
        self,
        client: Client,
        *,
        max_buffered: int,
        on_undelivered: Callable[[Undelivered], None] | None,
        spool_dir: Path | None,
    ) -> None:
        self.client = client
        self.max_buffered = max_buffered
        self.on_undelivered = on_undelivered
        self.spool_dir = spool_dir
        self.buffered = 0
        self._runs: dict[int, _Waiting] = {}  # by id(run): a Run is its own key
        self._cond = threading.Condition()
        self._abandon = threading.Event()  # closing: stop retrying, report what is left
        self._thread: threading.Thread | None = None
        self._closed = False

    def after_fork(self) -> None:
        """In a forked child: what waited is the parent's to send (its thread goes on there); this
        process starts empty, with a lock no thread of the parent may hold and its own thread."""
        self._cond = threading.Condition()
        self._runs = {}
        self.buffered = 0
        self._abandon = threading.Event()
        self._thread = None

    # --- the writers' side ---------------------------------------------------------------------------

    def put(self, run: Run, item: dict[str, Any]) -> None:
        with self._cond:
            if self._closed or self.buffered >= self.max_buffered:
                error: RunledgerError = (
                    NotDelivered("the client is closed")
                    if self._closed
                    else BufferFull(f"{self.buffered} events already wait to be sent (max_buffered)")
                )
                overflow = True
            else:
                overflow = False
                waiting = self._runs.get(id(run))
                if waiting is None:
                    waiting = self._runs[id(run)] = _Waiting(run)
                if not waiting.items:
                    waiting.since = time.monotonic()
                waiting.items.append(item)
                self.buffered += 1
                if len(waiting.items) == 1 or len(waiting.items) >= run.batch_size:
                    self._wake()
        if overflow:
            self.report(run.run_id, [item], error)

    def flush(self, run: Run, timeout: float | None) -> Appended:
        """Wait until every event `run` emitted so far has been sent (or given up on); what was sent."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            waiting = self._runs.get(id(run))
            if waiting is None or (not waiting.items and not waiting.sending):
                return Appended(last_sequence=run.last_sequence or 0)
            waiting.flush = True
            waiting.collected = collected = Appended(last_sequence=run.last_sequence or 0)
            self._wake()
            while waiting.items or waiting.sending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            if waiting.collected is collected:
                waiting.collected = None
            return collected

    def drain(self, timeout: float | None) -> bool:
        """Wait until nothing waits to be sent; False when `timeout` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            for waiting in self._runs.values():
                waiting.flush = True
            self._wake()
            while any(w.items or w.sending for w in self._runs.values()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float | None) -> None:
        """Send what waits (up to `timeout`), then report the rest as not delivered."""
        if not self.drain(timeout):
            self._abandon.set()
        with self._cond:
            self._closed = True
            left = [(w.run.run_id, list(w.items)) for w in self._runs.values() if w.items]
            for waiting in self._runs.values():
                self.buffered -= len(waiting.items)
                waiting.items.clear()
            self._cond.notify_all()
        for run_id, items in left:
            self.report(run_id, items, NotDelivered("the client closed before the server took these events"))
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="runledger-client-outbox", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    # --- the sending thread ---------------------------------------------------------------------------

    def _next(self) -> tuple[_Waiting, list[dict[str, Any]]] | None:
        """The next batch to send, waiting until one is due; None once closed and empty."""
        with self._cond:
            while True:
                now, wake_at = time.monotonic(), None
                for waiting in list(self._runs.values()):
                    if not waiting.items or waiting.sending:
                        if not waiting.items and not waiting.sending:
                            del self._runs[id(waiting.run)]  # nothing of it left: forget the run
                        continue
                    run = waiting.run
                    due = waiting.since + run.flush_interval if run.flush_interval > 0 else None
                    if waiting.flush or len(waiting.items) >= run.batch_size or (due is not None and due <= now):
                        batch = [waiting.items.popleft() for _ in range(min(run.batch_size, len(waiting.items)))]
                        waiting.sending = len(batch)
                        return waiting, batch
                    if due is not None:
                        wake_at = due if wake_at is None else min(wake_at, due)
                if self._closed and not self._runs:
                    return None
                self._cond.wait(None if wake_at is None else max(wake_at - now, 0.001))

    def _loop(self) -> None:
        while (next_batch := self._next()) is not None:
            waiting, batch = next_batch
            sent = self._deliver(waiting.run, batch)
            with self._cond:
                waiting.sending = 0
                self.buffered -= len(batch)
                if waiting.collected is not None:
                    waiting.collected.extend_with(sent)
                if not waiting.items:
                    waiting.flush = False
                else:
                    waiting.since = time.monotonic()
                self._cond.notify_all()

    def _deliver(self, run: Run, batch: list[dict[str, Any]]) -> Appended:
        """Send the batch; what the server refuses is reported, and only that: the events of the
        batch it did not refuse are sent again without it (`_core.refused_parts`). What was sent."""
        sent = Appended(last_sequence=run.last_sequence or 0)
        parts = [batch]
        while parts:
            part = parts.pop(0)
            try:
                sent.extend_with(self._send(run, part))
            except ApiError as exc:
                split = (
                    None
                    if exc.retryable and exc.code != "rate_limited"
                    else _core.refused_parts(part, exc.code, exc.details)
                )
                if split is None:
                    self.report(run.run_id, part, exc)
                    continue
                before, refused, after = split
                if refused:
                    self.report(run.run_id, refused, exc)
                parts[:0] = [p for p in (before, after) if p]
            except (TypeError, ValueError) as exc:
                # An event JSON cannot hold (a datetime, NaN) is reported alone, the rest sent.
                bad = _core.unencodable(part)
                if not bad:
                    self.report(run.run_id, part, exc)
                    continue
                for item, error in bad:
                    self.report(run.run_id, [item], error)
                rest = [item for item in part if all(item is not b for b, _ in bad)]
                parts[:0] = [rest] if rest else []
            except BaseException as exc:  # noqa: BLE001 - whatever happens, the agent is told by report, not by a raise
                self.report(run.run_id, [event for p in (part, *parts) for event in p], exc)
                if isinstance(exc, TransportError):
                    self._give_up_on_everything(exc)
                break
        return sent

    def _give_up_on_everything(self, error: TransportError) -> None:
        """The policy gave up on the server: what waits behind the batch would wait as long again."""
        with self._cond:
            left = [(w.run.run_id, list(w.items)) for w in self._runs.values() if w.items]
            for waiting in self._runs.values():
                self.buffered -= len(waiting.items)
                waiting.items.clear()
            self._cond.notify_all()
        for run_id, items in left:
            self.report(run_id, items, error)

    def _send(self, run: Run, batch: list[dict[str, Any]]) -> Appended:
        """POST the batch, again and again under the retry policy; the envelopes."""
        body: dict[str, Any] = {"events": batch}
        if run.fencing_token is not None:
            body["fencingToken"] = run.fencing_token
        policy = self.client.retry
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            if run.check_sequence:
                body["expectedSequence"] = run.last_sequence
            failure: Exception
            retry_after = None
            try:
                response = self.client.post_events(run.run_id, body)
            except httpx.UnsupportedProtocol:
                raise
            except httpx.TransportError as exc:
                failure = exc
            else:
                if response.status_code < 400:
                    done = Appended.from_body(response.json())
                    run.last_sequence = done.last_sequence
                    return done
                error = error_from(response.status_code, response.content, response.headers.get("Retry-After"))
                if not error.retryable or _core.over_the_rate(error.code, error.details, body):
                    raise error
                failure, retry_after = error, error.retry_after
            wait = policy.delay(attempt, retry_after, time.monotonic() - started)
            if wait is None or self._abandon.is_set():
                if isinstance(failure, ApiError):
                    raise failure
                raise TransportError(f"POST events of {run.run_id}: {failure!r} after {attempt} tries") from failure
            log.warning(
                "sending %d event(s) of %s failed (%r); try %d in %.2fs",
                len(batch),
                run.run_id,
                failure,
                attempt + 1,
                wait,
            )
            if self._abandon.wait(wait):
                raise TransportError(f"POST events of {run.run_id}: {failure!r}; the client closed") from failure

    # --- what could not be delivered -------------------------------------------------------------

    def report(self, run_id: str, events: list[dict[str, Any]], error: BaseException) -> None:
        spooled = spool(self.spool_dir, run_id, events, error) if self.spool_dir is not None else None
        self.tell(Undelivered(run_id, events, error, spooled))

    def tell(self, undelivered: Undelivered) -> None:
        """The log line and the `on_undelivered` callback of events not delivered."""
        log.error(
            "runledger: %d event(s) of %s not delivered: %r%s",
            len(undelivered.events),
            undelivered.run_id,
            undelivered.error,
            f"; kept in {undelivered.spooled}" if undelivered.spooled is not None else "",
        )
        if self.on_undelivered is not None:
            try:
                self.on_undelivered(undelivered)
            except Exception:  # noqa: BLE001 - the agent's callback must not stop delivery of the rest
                log.exception("on_undelivered raised")


def spool(directory: Path, run_id: str, events: list[dict[str, Any]], error: BaseException) -> Path | None:
    """Write the events to `<directory>/<run_id>.<nanoseconds>.json` (None if even that fails)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{run_id}.{time.time_ns()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(_core.encode({"runId": run_id, "events": events, "error": repr(error)}))
        temporary.replace(path)  # a reader never sees half a file
        return path
    except OSError as exc:
        log.error("runledger: could not spool %d event(s) of %s to %s: %r", len(events), run_id, directory, exc)
        return None


def spooled(directory: Path) -> Iterator[tuple[Path, str, list[dict[str, Any]]]]:
    """The spool's files, oldest first: (path, run id, events)."""
    for path in sorted(directory.glob("*.json"), key=lambda p: int(p.name.rsplit(".", 2)[-2])):
        document = json.loads(path.read_bytes())
        yield path, document["runId"], document["events"]
