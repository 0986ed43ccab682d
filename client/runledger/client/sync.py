"""The blocking client: `Client`, a run it writes (`Run`), its tool calls (`ToolCall`), harness
sessions (`Session`, `ModelCall`), steps (`observe`) and `Follow` (a run's events over SSE).

Recording never hurts the agent: `emit`, and everything built on it (sessions, model calls, steps,
a run's end), hands events to the client's outbox (`outbox.py`), which sends them in the
background, retries for minutes, and reports what it cannot deliver instead of raising it into the
agent's code. What needs the server's answer (`append`, the tool gateway, reads) waits for it and
raises.

The run, session and step being recorded follow the code through contextvars (`current_run()`,
`current_session()`, `current_step()`), across threads started with a copied context and asyncio
tasks: a run started inside another run's context is its sub-run, a model call made through a
wrapped SDK client (`wrappers.py`) lands in the session around it.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import itertools
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx

from . import _core
from ._core import Appended, Envelope, KeyMaker, RetryPolicy
from .errors import ApiError, RateLimited, ServerError, ToolCallFailed, ToolCallInProgress, TransportError, error_from
from .outbox import Outbox, Undelivered, spooled

log = logging.getLogger("runledger.client")
F = TypeVar("F", bound=Callable[..., Any])

_current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("runledger_session", default=None)
_current_run: contextvars.ContextVar[Run | None] = contextvars.ContextVar("runledger_run", default=None)
_current_step: contextvars.ContextVar[tuple[Run, str] | None] = contextvars.ContextVar("runledger_step", default=None)
_entered = itertools.count(1)  # the order runs and sessions were entered: the innermost wins


def current_session() -> Session | None:
    """The innermost `Session` open in this context (what a decorated function records into)."""
    return _current_session.get()


def current_run() -> Run | None:
    """The run being recorded in this context: the innermost `with run:` or open session's run."""
    session, run = _current_session.get(), _current_run.get()
    if session is not None and (run is None or session._entered > run._entered):
        return session.run
    return run


def current_step() -> str | None:
    """The step path of the innermost `@observe`d call of the current run, if any."""
    step, run = _current_step.get(), current_run()
    return step[1] if step is not None and step[0] is run else None


class Client:
    """A workspace API key's view of one Runledger server.

    Every request is retried by `retry` on network errors, 5xx and 429 (honouring Retry-After),
    never on another 4xx, which raises the `ApiError` subclass of its code at once. Emitted events
    go through the outbox: `max_buffered` events may wait (past that, new ones are reported rather
    than held), `on_undelivered(Undelivered)` hears of every batch the server did not take,
    `spool_dir` keeps such batches on disk for `deliver_spooled()`, and at interpreter exit what
    waits is sent for up to `exit_timeout` seconds (`close()` waits as long as the retry policy).
    """

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        workspace: str | None = None,
        transport: httpx.BaseTransport | None = None,
        max_buffered: int = 100_000,
        on_undelivered: Callable[[Undelivered], None] | None = None,
        spool_dir: str | Path | None = None,
        exit_timeout: float = 30.0,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.owner = _core.new_owner()
        self.exit_timeout = exit_timeout
        self._params = {"workspace": workspace} if workspace else {}
        self._connect = functools.partial(
            httpx.Client,
            base_url=_core.base_url(base_url),
            timeout=timeout,
            transport=transport,
            headers={"Authorization": f"Bearer {key}", "User-Agent": _core.USER_AGENT, "Accept": "application/json"},
        )
        self._http = self._connect()
        self.spool_dir = Path(spool_dir) if spool_dir is not None else None
        self.outbox = Outbox(self, max_buffered=max_buffered, on_undelivered=on_undelivered, spool_dir=self.spool_dir)
        self._closed = False
        # At exit, what waits is sent: a weak reference, so an atexit entry never keeps a client alive.
        reference = weakref.ref(self)
        self._at_exit = lambda: _close_at_exit(reference)
        atexit.register(self._at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: _start_over_after_fork(reference))

    def _after_fork(self) -> None:
        """In a forked child: the parent's sending thread and connections are not this process's
        (the thread is gone, the sockets are shared): start with an empty outbox and a new pool."""
        self.owner = _core.new_owner()
        self._http = self._connect()
        self.outbox.after_fork()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every emitted event has been sent or reported; False if `timeout` passed first."""
        return self.outbox.drain(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Send what waits (for up to `timeout` seconds; by default as long as the retry policy
        allows), report the rest as not delivered, and close the connections."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self.outbox.close(self.retry.deadline_s if timeout is None else timeout)
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def deliver_spooled(self) -> int:
        """Send the batches `spool_dir` kept (oldest first, each a replay if it had arrived after
        all); each file is removed once the server took it. Returns how many events were sent.
        Events the server refuses (a 4xx: it never will take them) do not stop the rest: they are
        reported as not delivered (the log line, `on_undelivered`) and kept in `<file>.refused`,
        never sent again, and the rest of their batch is sent. A server that cannot take them yet
        (no answer, a 5xx, a 429 past the retry policy) raises, the files left for a later call."""
        if self.spool_dir is None or not self.spool_dir.exists():
            return 0
        sent = 0
        for path, run_id, events in spooled(self.spool_dir):
            refused: list[dict[str, Any]] = []
            error: ApiError | None = None
            parts = [events]
            while parts:
                part = parts.pop(0)
                try:
                    self.append(run_id, part)
                except ApiError as exc:
                    if exc.retryable and exc.code != "rate_limited":
                        raise
                    split = _core.refused_parts(part, exc.code, exc.details)
                    if split is None and exc.retryable:
                        raise
                    before, bad, after = split or ([], part, [])
                    refused.extend(bad)
                    error = error or exc
                    parts[:0] = [p for p in (before, after) if p]
                else:
                    sent += len(part)
            if refused and error is not None:
                kept = path.with_name(path.name + ".refused")
                kept.write_bytes(_core.encode({"runId": run_id, "events": refused, "error": repr(error)}))
                self.outbox.tell(Undelivered(run_id, refused, error, kept))
            path.unlink()
        return sent

    # --- requests --------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        retry: bool | RetryPolicy = True,
    ) -> httpx.Response:
        """One API call, retried per the policy when `retry`; an answer >= 400 raises its ApiError."""
        content = None if body is None else _core.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else {}
        policy = retry if isinstance(retry, RetryPolicy) else self.retry if retry else _core.NO_RETRY
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            failure: Exception
            try:
                response = self._http.request(
                    method, path, content=content, headers=headers, params={**self._params, **(params or {})}
                )
            except httpx.UnsupportedProtocol:
                raise  # a base_url without http(s): no retry can fix it
            except httpx.TransportError as exc:
                failure, retry_after = exc, None
            else:
                if response.status_code < 400:
                    return response
                error = error_from(response.status_code, response.content, response.headers.get("Retry-After"))
                if not error.retryable or _core.over_the_rate(error.code, error.details, body):
                    raise error
                failure, retry_after = error, error.retry_after
            wait = policy.delay(attempt, retry_after, time.monotonic() - started)
            if wait is None:
                if isinstance(failure, ApiError):
                    raise failure
                raise TransportError(f"{method} {path}: {failure!r} after {attempt} tries") from failure
            log.warning("%s %s failed (%r); try %d in %.2fs", method, path, failure, attempt + 1, wait)
            time.sleep(wait)

    def post_events(self, run_id: str, body: Mapping[str, Any]) -> httpx.Response:
        """One POST of an append body, no retry, no raise for its status (the outbox decides)."""
        return self._http.post(
            _core.run_path(run_id, "events"),
            content=_core.encode(body),
            headers={"Content-Type": "application/json"},
            params=self._params,
        )

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    # --- the log -----------------------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        events: Iterable[Mapping[str, Any]],
        expected_sequence: int | None = None,
        *,
        fencing_token: str | int | None = None,
        retry: bool | RetryPolicy = True,
    ) -> Appended:
        """POST the batch as given, one transaction; the envelopes in batch order (`replayed` on
        each) and `.last_sequence`. Retried only when every event carries an idempotencyKey (a
        retry is then a replay); otherwise a lost answer raises rather than risk a second copy."""
        items = [_core.check_item(e) for e in events]
        body: dict[str, Any] = {"events": items}
        if expected_sequence is not None:
            body["expectedSequence"] = expected_sequence
        if fencing_token is not None:
            body["fencingToken"] = fencing_token
        keyed = all("idempotencyKey" in item for item in items)
        return Appended.from_body(
            self._json("POST", _core.run_path(run_id, "events"), body=body, retry=retry if keyed else False)
        )

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self._json("GET", _core.run_path(run_id))

    def events(self, run_id: str, *, after: int = 0, page_size: int = 500) -> Iterator[Envelope]:
        """Every envelope after `after`, in sequence order, page by page."""
        while True:
            page = self._json("GET", _core.run_path(run_id, "events"), params={"after": after, "limit": page_size})
            yield from page["events"]
            if page.get("next") is None:
                return
            after = page["next"]

    def follow(self, run_id: str, after: int = 0, *, read_timeout: float = 60.0) -> Follow:
        """The run's events after `after` over SSE, then live ones, until the run ends."""
        return Follow(self, run_id, after, read_timeout)

    # --- runs ----------------------------------------------------------------------------------

    def start_run(
        self,
        workflow_version_id: str,
        *,
        run_id: str | None = None,
        input: Any = None,
        writer: str = "main",
        batch_size: int = 100,
        flush_interval: float = 1.0,
        fencing_token: str | int | None = None,
        check_sequence: bool = False,
        start_timeout: float = 10.0,
        **payload: Any,
    ) -> Run:
        """Append RunStarted (key `<writer>:0`) and return the `Run` to write the rest with.

        Started inside another run's context (its `with`, a session of it, an `@observe`d step),
        the new run is that run's sub-run: `parentRunId` is set unless given. Starting a run id
        that is already started with the same payload is a replay: the harness was restarted, and
        its model calls are answered from the log (`ModelCall.replayed`) as the gateway answers
        its tool calls. The start waits up to `start_timeout` seconds for the server to say which;
        past that (no answer, or a 5xx or 429 for that long) the RunStarted goes to the outbox like
        any event and the run is taken as new.
        """
        run = Run(
            self,
            run_id or _core.new_run_id(),
            writer=writer,
            batch_size=batch_size,
            flush_interval=flush_interval,
            fencing_token=fencing_token,
            check_sequence=check_sequence,
        )
        started = {"workflowVersionId": workflow_version_id, **payload}
        if input is not None:
            started["input"] = input
        parent = current_run()
        if parent is not None and "parentRunId" not in started and parent.run_id != run.run_id:
            started["parentRunId"] = parent.run_id
        item = run.keys.keyed(_core.event_item("RunStarted", started))
        policy = RetryPolicy(
            backoff_s=self.retry.backoff_s,
            max_backoff_s=self.retry.max_backoff_s,
            deadline_s=min(start_timeout, self.retry.deadline_s),
        )
        try:
            done = self.append(run.run_id, [item], fencing_token=fencing_token, retry=policy)
        except (TransportError, ServerError, RateLimited) as exc:  # it may take them later: never the agent's failure
            log.warning("the server did not start %s yet (%r); its events wait in the outbox", run.run_id, exc)
            self.outbox.put(run, item)
        else:
            run.last_sequence = done.last_sequence
            run.restarted = bool(done and done[0].get("replayed"))
        return run

    def run(
        self,
        run_id: str,
        *,
        writer: str = "main",
        batch_size: int = 100,
        flush_interval: float = 1.0,
        fencing_token: str | int | None = None,
        check_sequence: bool = False,
        next_key: int = 1,
    ) -> Run:
        """A `Run` writing to a run already started (by `start_run` elsewhere, or another writer);
        its model calls recorded before are answered from the log, as after a restart."""
        run = Run(
            self,
            run_id,
            writer=writer,
            batch_size=batch_size,
            flush_interval=flush_interval,
            fencing_token=fencing_token,
            check_sequence=check_sequence,
            next_key=next_key,
        )
        run.restarted = True
        run._sync_sequence()
        return run


def _start_over_after_fork(reference: weakref.ref[Client]) -> None:
    client = reference()
    if client is not None and not client._closed:
        client._after_fork()


def _close_at_exit(reference: weakref.ref[Client]) -> None:
    client = reference()
    if client is not None:
        client.close(client.exit_timeout)


class Run:
    """Writes one run: `append` now (and wait), or `emit` into the client's outbox, which sends a
    batch when `batch_size` events wait, `flush_interval` seconds after the first of them (0: only
    by size or flush), or on `flush()`. Every event gets a deterministic idempotency key
    (`KeyMaker`), so retries never write twice. With `check_sequence`, each batch carries
    `expectedSequence` (the last sequence this writer saw): another writer's event in between is a
    `SequenceConflict`. `fencing_token` goes with every write while the run is leased to this
    executor.

    As a context manager it is the current run of the code inside, and it ends the run on exit:
    RunCompleted (with `output`) or, on an exception, RunFailed; then it waits for the outbox to
    deliver the run's events (never raising: what cannot be delivered is reported).
    """

    def __init__(
        self,
        client: Client,
        run_id: str,
        *,
        writer: str = "main",
        batch_size: int = 100,
        flush_interval: float = 1.0,
        fencing_token: str | int | None = None,
        check_sequence: bool = False,
        next_key: int = 0,
    ) -> None:
        if not 1 <= batch_size <= _core.MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{_core.MAX_BATCH}")
        self.client, self.run_id = client, run_id
        self.batch_size, self.flush_interval = batch_size, flush_interval
        self.fencing_token, self.check_sequence = fencing_token, check_sequence
        self.keys = KeyMaker(writer, next_key)
        self.last_sequence: int | None = None
        self.output: Any = None
        self.finished = False
        self.restarted = False  # the run was in the log already: recorded model calls are replayed
        self._recorded: dict[str, tuple[dict[str, Any], dict[str, Any]]] | None = None
        self._turns: dict[str | None, int] = {}  # model calls outside a session, by step path
        self._visits: dict[str, int] = {}  # @observe'd steps, by path
        # What must be recorded before the run ends: a streamed model call (`wrappers`) not read
        # to its end yet, which ends failed (its stream was never finished) rather than after.
        self.unfinished: dict[object, Callable[[], None]] = {}
        self._entered = 0
        self._tokens: list[contextvars.Token[Run | None]] = []
        self._keying = threading.RLock()  # threads emitting into one run: keys in the order of the queue

    # --- writing -------------------------------------------------------------------------------

    def append(self, events: Iterable[Mapping[str, Any]]) -> Appended:
        """Send what was emitted and then `events`, and wait for the server: their envelopes.
        Raises what the server answers (the one way in that does)."""
        self.flush()
        with self._keying:
            items = [self.keys.keyed(_core.check_item(e)) for e in events]
        sent = Appended(last_sequence=self.last_sequence or 0)
        for start in range(0, len(items), self.batch_size):
            expected = self.last_sequence if self.check_sequence else None
            done = self.client.append(
                self.run_id, items[start : start + self.batch_size], expected, fencing_token=self.fencing_token
            )
            self.last_sequence = done.last_sequence
            sent.extend_with(done)
        return sent

    def emit(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        occurrence_id: str | None = None,
    ) -> None:
        """Hand one event to the outbox: it returns at once, whatever the network does."""
        item = _core.event_item(type_, payload, idempotency_key=idempotency_key, occurrence_id=occurrence_id)
        with self._keying:
            self.client.outbox.put(self, self.keys.keyed(item))

    def flush(self, timeout: float | None = None) -> Appended:
        """Wait until what this run emitted has been sent (or reported); the envelopes sent meanwhile."""
        return self.client.outbox.flush(self, timeout)

    def _sync_sequence(self) -> None:
        """After the gateway appended for us: learn where the log ends (for expectedSequence)."""
        if self.check_sequence:
            self.last_sequence = int(self.client.get_run(self.run_id)["lastSequence"])

    # --- ending ----------------------------------------------------------------------------------

    def complete(self, output: Any = None) -> Appended:
        """RunCompleted, then wait for the run's events to be delivered (never raising)."""
        self._end_unfinished()
        self.emit("RunCompleted", {} if output is None else {"output": output})
        self.finished = True
        return self.flush()

    def fail(self, error: Any) -> Appended:
        if isinstance(error, BaseException):
            error = _core.error_payload(error)
        self._end_unfinished()
        self.emit("RunFailed", {"error": error})
        self.finished = True
        return self.flush()

    def _end_unfinished(self) -> None:
        for end in list(self.unfinished.values()):
            end()

    def close(self) -> None:
        """Send what is buffered; the run stays open (see the context manager to end it)."""
        self.flush()

    def __enter__(self) -> Run:
        self._entered = next(_entered)
        self._tokens.append(_current_run.set(self))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tokens:
            _current_run.reset(self._tokens.pop())
        if self.finished:
            self.flush()
        elif exc is None:
            self.complete(self.output)
        else:
            self.fail(exc)

    # --- tools, sessions, model calls ------------------------------------------------------------

    def tool_call(
        self,
        tool_name: str,
        args: Any,
        *,
        effect: str = "write",
        call_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
        turn: int | None = None,
        step_path: str | None = None,
        caller: str | None = None,
    ) -> ToolCall:
        """A gateway call as a context manager: claimed on entry (or its recorded outcome replayed),
        marked outbound as the body starts, completed with `call.result` or the body's exception."""
        return ToolCall(
            self,
            tool_name,
            args,
            effect=effect,
            call_id=call_id or self.keys.name("tool"),
            idempotency_key=idempotency_key,
            timeout_s=timeout_s,
            turn=turn,
            step_path=step_path if step_path is not None else current_step(),
            caller=caller,
        )

    def call_tool(self, tool_name: str, args: Any, fn: Callable[[], Any], **options: Any) -> Any:
        """`fn()` through the gateway: its result, or the recorded one without calling it when
        the gateway replays; a recorded failure raises ToolCallFailed."""
        with self.tool_call(tool_name, args, **options) as call:
            if not call.replayed:
                call.result = fn()
        if call.status == "failed":
            raise ToolCallFailed(call.call_id, call.error)
        return call.result

    def session(
        self,
        role: str = "agent",
        *,
        task: Any = None,
        step_path: str | None = None,
        manifest: Mapping[str, Any] | None = None,
    ) -> Session:
        return Session(self, role=role, task=task, step_path=step_path, manifest=manifest)

    def model_call(
        self, request: Mapping[str, Any], *, provider: str, model_id: str, step_path: str | None = None
    ) -> ModelCall:
        """A model call outside any session (see `Session.model_call`), in the current step."""
        path = step_path if step_path is not None else current_step()
        self._turns[path] = turn = self._turns.get(path, 0) + 1
        return ModelCall(self, turn, f"{path or 'run'}:turn{turn}", path, dict(request), provider, model_id)

    def recorded_model_call(self, call_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(called, responded) payloads of the model call `call_id` if the log holds its answer:
        read from the server once, the first time a restarted run asks."""
        if not self.restarted:
            return None
        if self._recorded is None:
            self.flush()
            called: dict[str, dict[str, Any]] = {}
            self._recorded = {}
            try:
                for envelope in self.client.events(self.run_id):
                    payload = envelope["payload"]
                    key = payload.get("callId")
                    if envelope["type"] == "harness.model.called" and isinstance(key, str):
                        called[key] = payload
                    elif envelope["type"] == "harness.model.responded" and key in called:
                        self._recorded[key] = (called[key], payload)
            except (TransportError, ApiError) as exc:
                log.warning("could not read %s's recorded model calls (%r): they are made again", self.run_id, exc)
        return self._recorded.get(call_id)

    def step_path(self, name: str) -> str:
        """The path of the next call of the step `name` under the current step: `name`, then
        `name.visit[1]`, `name.visit[2]`, ... for the same step run again."""
        parent = current_step()
        path = f"{parent}.{name}" if parent else name
        visits = self._visits.get(path, 0)
        self._visits[path] = visits + 1
        return path if visits == 0 else f"{path}.visit[{visits}]"


class Session:
    """A harness session recorded around user code: harness.session.started on entry,
    harness.session.completed (with `output`) or .failed on exit; model calls (`model_call`) and
    tool calls (`tool_call`) inside it carry its turn and step path. As a decorator it opens a
    new session around every call of the function; `current_session()` finds it there."""

    def __init__(
        self, run: Run, *, role: str, task: Any, step_path: str | None, manifest: Mapping[str, Any] | None
    ) -> None:
        self.run, self.role = run, role
        self.step_path = step_path if step_path is not None else current_step()
        self.task = (
            task
            if task is not None
            else {"kind": "session", **({"stepPath": self.step_path} if self.step_path else {})}
        )
        self.manifest = dict(manifest or {})
        self.turn = 0
        self.output: Any = None
        self._explicit_step = step_path
        self._entered = 0
        self._token: contextvars.Token[Session | None] | None = None

    def _payload(self, **fields: Any) -> dict[str, Any]:
        payload = {"role": self.role, **fields}
        if self.step_path is not None:
            payload["stepPath"] = self.step_path
        return payload

    def __enter__(self) -> Session:
        self.run.emit(
            "harness.session.started",
            self._payload(task=self.task, manifest=self.manifest, manifestHash=_core.canonical_digest(self.manifest)),
        )
        self._entered = next(_entered)
        self._token = _current_session.set(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            _current_session.reset(self._token)
            self._token = None
        if exc is None:
            extra = {} if self.output is None else {"output": self.output}
            self.run.emit("harness.session.completed", self._payload(**extra))
        else:
            self.run.emit("harness.session.failed", self._payload(error=_core.error_payload(exc)))

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            with Session(
                self.run, role=self.role, task=self.task, step_path=self._explicit_step, manifest=self.manifest
            ) as session:
                session.output = fn(*args, **kwargs)
                return session.output

        return recorded  # type: ignore[return-value]

    def model_call(self, request: Mapping[str, Any], *, provider: str, model_id: str) -> ModelCall:
        """The next turn's model call, a context manager: harness.model.called on entry,
        `call.respond(...)` in the block records harness.model.responded, an exception
        harness.model.failed (with `requestLeft`, whether the provider may have billed it: set
        `call.request_left` in the block when you know, else it is read from the exception,
        `_core.request_left`). When the run was restarted and the log holds this call's answer
        for the same request, `call.replayed` is True and `call.response` is that answer: the
        block must not call the model again (a non-deterministic model would answer otherwise)."""
        self.turn += 1
        call_id = f"{self.step_path or self.role}:turn{self.turn}"
        return ModelCall(self.run, self.turn, call_id, self.step_path, dict(request), provider, model_id)

    def tool_call(self, tool_name: str, args: Any, **options: Any) -> ToolCall:
        options.setdefault("turn", self.turn or None)
        options.setdefault("step_path", self.step_path)
        options.setdefault("caller", self.role)
        return self.run.tool_call(tool_name, args, **options)


class ModelCall:
    """One model call (see `Session.model_call`). After the block, `response` is what was recorded:
    `{text?, toolCalls?, usage, ...}` as given to `respond`, or the log's answer when `replayed`."""

    def __init__(
        self,
        run: Run,
        turn: int,
        call_id: str,
        step_path: str | None,
        request: dict[str, Any],
        provider: str,
        model_id: str,
    ) -> None:
        self.run, self.turn, self.call_id, self.step_path = run, turn, call_id, step_path
        self.request, self.provider, self.model_id = request, provider, model_id
        self.response: dict[str, Any] | None = None
        self.replayed = False
        # Whether the request left, when the block knows it better than what it raises says
        # (`_core.request_left`): False before it raises for a call it never made, True after.
        self.request_left: bool | None = None
        self._recorded: dict[str, Any] | None = None

    def respond(
        self,
        text: str | None = None,
        *,
        tool_calls: list[Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        model_id: str | None = None,
        **extra: Any,
    ) -> None:
        """The model's answer; `usage` as the ledger counts it: inputTokens, outputTokens,
        cachedInputTokens, reasoningTokens (never a cost: the server prices calls itself).
        `model_id`: the model that answered, when it differs from the one asked (a dated version)."""
        if self.replayed:
            return  # the recorded answer stands
        if model_id is not None:
            self.model_id = model_id
        self.response = _core.response_body(text, tool_calls, usage, extra)

    def _payload(self, **fields: Any) -> dict[str, Any]:
        payload = {"turn": self.turn, "callId": self.call_id, **fields}
        if self.step_path is not None:
            payload["stepPath"] = self.step_path
        return payload

    def __enter__(self) -> ModelCall:
        prompt_hash = _core.canonical_digest(self.request)
        recorded = self.run.recorded_model_call(self.call_id)
        if recorded is not None and recorded[0].get("promptHash") == prompt_hash:
            self.replayed, self._recorded = True, recorded[1]
            self.response = dict(recorded[1].get("response") or {})
            model = recorded[1].get("model") or {}
            self.provider, self.model_id = model.get("provider", self.provider), model.get("modelId", self.model_id)
        elif recorded is not None:
            log.warning(
                "model call %s of %s: the request differs from the recorded one; calling the model",
                self.call_id,
                self.run.run_id,
            )
        self.run.emit("harness.model.called", self._payload(promptHash=prompt_hash, request=self.request))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._recorded is not None and exc is None:
            self.run.emit("harness.model.responded", self._recorded)  # the same event: the server replays it
            return
        if exc is None and self.response is None:
            exc = RuntimeError(f"model call {self.call_id} ended without respond()")
            self._failed(exc)
            raise exc
        if exc is not None:
            self._failed(exc)
            return
        assert self.response is not None
        self.run.emit(
            "harness.model.responded",
            _core.model_responded(
                turn=self.turn,
                call_id=self.call_id,
                step_path=self.step_path,
                provider=self.provider,
                model_id=self.model_id,
                response=self.response,
            ),
        )

    def _failed(self, exc: BaseException) -> None:
        """harness.model.failed, with `requestLeft`: whether the provider may have billed the call
        (`request_left`, else read from `exc`; never for a call answered from the log)."""
        model = {"provider": self.provider, "modelId": self.model_id}
        left = False if self.replayed else self.request_left
        self.run.emit(
            "harness.model.failed",
            self._payload(
                error=_core.error_payload(exc),
                requestLeft=_core.request_left(exc) if left is None else left,
                model=model,
            ),
        )


# --- steps --------------------------------------------------------------------------------------


@overload
def observe(fn: F, /) -> F: ...


@overload
def observe(*, name: str | None = None, capture_input: bool = True) -> Callable[[F], F]: ...


def observe(fn: Any = None, /, *, name: str | None = None, capture_input: bool = True) -> Any:
    """Record each call of the decorated function (sync or async) as a step of the current run:
    StepScheduled (with its `input` unless `capture_input=False`) and StepAttemptStarted before,
    StepCompleted with its `output` (or StepFailed with the exception, which is raised on) after.
    Steps nest: a step observed inside another is `outer.inner`; calling a step again gives
    `inner.visit[1]`, `inner.visit[2]`, ... Model and tool calls made inside carry the step's path.
    Outside any run the function is called as it is, unrecorded."""

    def decorate(function: Any) -> Any:
        step_name = name or function.__name__

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Run, str] | None:
            run = current_run()
            if run is None:
                return None
            path = run.step_path(step_name)
            scheduled: dict[str, Any] = {"stepPath": path, "stepId": step_name}
            if capture_input:
                scheduled["input"] = _jsonable({"args": list(args), "kwargs": kwargs})
            run.emit("StepScheduled", scheduled)
            run.emit("StepAttemptStarted", {"stepPath": path, "attempt": 1})
            return run, path

        def end(step: tuple[Run, str], output: Any, error: BaseException | None) -> None:
            run, path = step
            if error is None:
                run.emit("StepCompleted", {"stepPath": path, "attempt": 1, "output": _jsonable(output)})
            else:
                run.emit("StepFailed", {"stepPath": path, "attempt": 1, "error": _core.error_payload(error)})

        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def observed_async(*args: Any, **kwargs: Any) -> Any:
                step = begin(args, kwargs)
                if step is None:
                    return await function(*args, **kwargs)
                token = _current_step.set(step)
                try:
                    output = await function(*args, **kwargs)
                except BaseException as exc:
                    end(step, None, exc)
                    raise
                finally:
                    _current_step.reset(token)
                end(step, output, None)
                return output

            return observed_async

        @functools.wraps(function)
        def observed(*args: Any, **kwargs: Any) -> Any:
            step = begin(args, kwargs)
            if step is None:
                return function(*args, **kwargs)
            token = _current_step.set(step)
            try:
                output = function(*args, **kwargs)
            except BaseException as exc:
                end(step, None, exc)
                raise
            finally:
                _current_step.reset(token)
            end(step, output, None)
            return output

        return observed

    return decorate(fn) if fn is not None else decorate


def _jsonable(value: Any) -> Any:
    """`value` as JSON can hold it: what JSON cannot is named by its type (never by its address,
    which would differ on a restart and turn a replay into an idempotency conflict)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)  # pydantic models (the SDKs' own types)
    if callable(dump):
        try:
            return _jsonable(dump(mode="json"))
        except Exception:  # noqa: BLE001 - anything else is named by its type
            pass
    return f"<{type(value).__name__}>"


class ToolCall:
    """One tool call under the gateway's lease (see `Run.tool_call`). After the block:
    `status` is "succeeded" or "failed", `result` or `error` what was recorded; `replayed` says
    the gateway answered from its record (`idempotentReplay`) and the body must not act."""

    def __init__(
        self,
        run: Run,
        tool_name: str,
        args: Any,
        *,
        effect: str,
        call_id: str,
        idempotency_key: str | None,
        timeout_s: float | None,
        turn: int | None,
        step_path: str | None,
        caller: str | None,
    ) -> None:
        self.run, self.tool_name, self.args, self.effect, self.call_id = run, tool_name, args, effect, call_id
        self.idempotency_key, self.timeout_s, self.turn, self.step_path, self.caller = (
            idempotency_key,
            timeout_s,
            turn,
            step_path,
            caller,
        )
        self.replayed = False
        self.status: str | None = None
        self.result: Any = None
        self.error: Any = None
        self.attempt: int | None = None
        self.lease_token: str | None = None

    def _post(self, suffix: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.run.fencing_token is not None:
            body["fencingToken"] = self.run.fencing_token
        path = _core.run_path(self.run.run_id, "tool-calls", *([self.call_id, suffix] if suffix else []))
        return self.run.client._json("POST", path, body=body)

    def claim(self) -> None:
        self.run.flush()  # what the harness emitted before the call is logged before it
        body: dict[str, Any] = {
            "callId": self.call_id,
            "toolName": self.tool_name,
            "args": self.args,
            "effect": self.effect,
            "owner": self.run.client.owner,
        }
        for field, value in (
            ("idempotencyKey", self.idempotency_key),
            ("timeoutS", self.timeout_s),
            ("turn", self.turn),
            ("stepPath", self.step_path),
            ("caller", self.caller),
        ):
            if value is not None:
                body[field] = value
        started = time.monotonic()
        while True:
            try:
                answer = self._post("", body)
                break
            except ToolCallInProgress as exc:  # e.g. held by the harness that crashed before this restart
                wait = _core.lease_wait(exc.details, time.monotonic() - started, self.run.client.retry)
                if wait is None:
                    raise
                log.warning("tool call %s is leased to another owner: claiming it again in %.1fs", self.call_id, wait)
                time.sleep(wait)
        self.call_id, self.attempt = answer.get("callId", self.call_id), answer.get("attempt")
        if answer.get("status") == "claimed":
            self.lease_token = answer["leaseToken"]
        else:
            self._finished(answer)

    def outbound(self) -> None:
        self._post("outbound", {"leaseToken": self.lease_token})

    def complete(self, *, result: Any = None, error: Any = None) -> None:
        outcome = {"error": error} if error is not None else {"result": result}
        self._finished(self._post("complete", {"leaseToken": self.lease_token, **outcome}))
        self.run._sync_sequence()

    def _finished(self, answer: Mapping[str, Any]) -> None:
        self.status = answer["status"]
        self.replayed = bool(answer.get("idempotentReplay")) and self.lease_token is None
        self.result, self.error = answer.get("result"), answer.get("error")

    def __enter__(self) -> ToolCall:
        self.claim()
        if not self.replayed:
            self.outbound()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.replayed:
            return
        if exc is not None:
            self.complete(error=_core.error_payload(exc))
        else:
            self.complete(result=self.result)


class Follow:
    """Iterates a run's envelopes over SSE: every event after `after` once, in order, then live
    ones, reconnecting with Last-Event-ID when the connection drops (network error, server
    restart, a stream that ends without `end`); stops at `end`, whose status is `status`."""

    def __init__(self, client: Client, run_id: str, after: int, read_timeout: float) -> None:
        self.client, self.run_id, self.position, self.read_timeout = client, run_id, after, read_timeout
        self.status: str | None = None
        self.reconnects = 0

    def __iter__(self) -> Iterator[Envelope]:
        http = self.client._http
        timeout = httpx.Timeout(self.client._http.timeout.connect, read=self.read_timeout)
        started, attempt = time.monotonic(), 0
        first = True
        while True:
            headers = {"Accept": "text/event-stream"}
            if not first:
                headers["Last-Event-ID"] = str(self.position)
            params: dict[str, str | int] = {**self.client._params, "after": self.position}
            failure: Exception
            retry_after = None
            try:
                with http.stream(
                    "GET", _core.run_path(self.run_id, "stream"), params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        error = error_from(response.status_code, response.read(), response.headers.get("Retry-After"))
                        if not error.retryable:
                            raise error
                        failure, retry_after = error, error.retry_after
                    else:
                        started, attempt = time.monotonic(), 0  # connected: the policy starts over
                        parser = _core.SseParser()
                        for line in response.iter_lines():
                            message = parser.feed(line)
                            if message is None:
                                continue
                            if message.event == "ledger.event":
                                envelope = json.loads(message.data)
                                if envelope["sequence"] <= self.position:
                                    continue
                                self.position = envelope["sequence"]
                                yield envelope
                            elif message.event == "end":
                                self.status = json.loads(message.data).get("status")
                                return
                        failure = TransportError("the stream closed before its end")
            except httpx.TransportError as exc:
                failure = exc
            first = False
            attempt += 1
            wait = self.client.retry.delay(attempt, retry_after, time.monotonic() - started)
            if wait is None:
                if isinstance(failure, ApiError):
                    raise failure
                raise TransportError(f"following {self.run_id}: {failure!r}") from failure
            self.reconnects += 1
            log.warning(
                "stream of %s dropped at %d (%r); reconnecting in %.2fs", self.run_id, self.position, failure, wait
            )
            time.sleep(wait)
