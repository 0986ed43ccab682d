"""The blocking client: `Client`, a run it writes (`Run`), its tool calls (`ToolCall`), harness
sessions (`Session`, `ModelCall`) and `Follow` (a run's events over SSE)."""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _core
from ._core import Appended, Envelope, KeyMaker, RetryPolicy
from .errors import ApiError, ToolCallFailed, TransportError, error_from

log = logging.getLogger("runledger.client")
F = TypeVar("F", bound=Callable[..., Any])

_current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("runledger_session", default=None)


def current_session() -> Session | None:
    """The innermost `Session` open in this context (what a decorated function records into)."""
    return _current_session.get()


class Client:
    """A workspace API key's view of one Runledger server.

    Every request is retried by `retry` on network errors, 5xx and 429 (honouring Retry-After),
    never on another 4xx, which raises the `ApiError` subclass of its code at once.
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
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.owner = _core.new_owner()
        self._params = {"workspace": workspace} if workspace else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            timeout=timeout,
            transport=transport,
            headers={"Authorization": f"Bearer {key}", "User-Agent": _core.USER_AGENT, "Accept": "application/json"},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- requests --------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None, retry: bool = True
    ) -> httpx.Response:
        """One API call, retried per the policy when `retry`; an answer >= 400 raises its ApiError."""
        content = None if body is None else _core.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else {}
        policy = self.retry if retry else _core.NO_RETRY
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
                if not error.retryable:
                    raise error
                failure, retry_after = error, error.retry_after
            wait = policy.delay(attempt, retry_after, time.monotonic() - started)
            if wait is None:
                if isinstance(failure, ApiError):
                    raise failure
                raise TransportError(f"{method} {path}: {failure!r} after {attempt} tries") from failure
            log.warning("%s %s failed (%r); try %d in %.2fs", method, path, failure, attempt + 1, wait)
            time.sleep(wait)

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
        return Appended.from_body(self._json("POST", _core.run_path(run_id, "events"), body=body, retry=keyed))

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
        **payload: Any,
    ) -> Run:
        """Append RunStarted (key `<writer>:0`; starting the same run id again with the same
        payload is a replay) and return the `Run` to write the rest with."""
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
        run.append([_core.event_item("RunStarted", started)])
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
        """A `Run` writing to a run already started (by `start_run` elsewhere, or another writer)."""
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
        run._sync_sequence()
        return run


class Run:
    """Writes one run: `append` now, or `emit` into a batch sent when it holds `batch_size` events,
    `flush_interval` seconds after its first event, or on `flush()`/`close()`. Every event gets a
    deterministic idempotency key (`KeyMaker`), so retries never write twice. With
    `check_sequence`, each batch carries `expectedSequence` (the last sequence this writer saw):
    another writer's event in between is a `SequenceConflict`. `fencing_token` goes with every
    write while the run is leased to this executor.

    As a context manager it ends the run: RunCompleted (with `output`) or, on an exception, RunFailed.
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
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.RLock()
        self._timer: threading.Timer | None = None
        self._background_error: BaseException | None = None

    # --- writing -------------------------------------------------------------------------------

    def append(self, events: Iterable[Mapping[str, Any]]) -> Appended:
        """Send what is buffered and `events` now (in that order); their envelopes."""
        with self._lock:
            self._buffer.extend(self.keys.keyed(_core.check_item(e)) for e in events)
            return self._send_buffer()

    def emit(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        occurrence_id: str | None = None,
    ) -> None:
        """Buffer one event; sent with its batch (size or time), or by `flush`."""
        item = _core.event_item(type_, payload, idempotency_key=idempotency_key, occurrence_id=occurrence_id)
        with self._lock:
            self._raise_background_error()
            self._buffer.append(self.keys.keyed(item))
            if len(self._buffer) >= self.batch_size:
                self._send_buffer()
            elif self._timer is None and self.flush_interval > 0:
                self._timer = threading.Timer(self.flush_interval, self._flush_in_background)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> Appended:
        with self._lock:
            return self._send_buffer()

    def _flush_in_background(self) -> None:
        with self._lock:
            if self._timer is threading.current_thread():
                self._timer = None
            try:
                self._send_buffer()
            except BaseException as exc:  # raised to the writer at its next emit, flush or close
                log.error("background flush of %s failed: %r", self.run_id, exc)
                self._background_error = exc

    def _raise_background_error(self) -> None:
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error

    def _send_buffer(self) -> Appended:
        self._raise_background_error()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        sent = Appended(last_sequence=self.last_sequence or 0)
        while self._buffer:
            batch = self._buffer[: self.batch_size]
            expected = self.last_sequence if self.check_sequence else None
            done = self.client.append(self.run_id, batch, expected, fencing_token=self.fencing_token)
            del self._buffer[: len(batch)]  # only once the server has them: a failed send keeps them for the next
            self.last_sequence = done.last_sequence
            sent.extend_with(done)
        return sent

    def _sync_sequence(self) -> None:
        """After the gateway appended for us: learn where the log ends (for expectedSequence)."""
        if self.check_sequence:
            self.last_sequence = int(self.client.get_run(self.run_id)["lastSequence"])

    # --- ending ----------------------------------------------------------------------------------

    def complete(self, output: Any = None) -> Appended:
        payload = {} if output is None else {"output": output}
        done = self.append([_core.event_item("RunCompleted", payload)])
        self.finished = True
        return done

    def fail(self, error: Any) -> Appended:
        if isinstance(error, BaseException):
            error = _core.error_payload(error)
        done = self.append([_core.event_item("RunFailed", {"error": error})])
        self.finished = True
        return done

    def close(self) -> None:
        """Send what is buffered; the run stays open (see the context manager to end it)."""
        self.flush()

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.finished:
            self.flush()
        elif exc is None:
            self.complete(self.output)
        else:
            self.fail(exc)

    # --- tools and sessions --------------------------------------------------------------------

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
            step_path=step_path,
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
        answer = self._post("", body)
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


class Session:
    """A harness session recorded around user code: harness.session.started on entry,
    harness.session.completed (with `output`) or .failed on exit; model calls (`model_call`) and
    tool calls (`tool_call`) inside it carry its turn and step path. As a decorator it opens a
    new session around every call of the function; `current_session()` finds it there."""

    def __init__(
        self, run: Run, *, role: str, task: Any, step_path: str | None, manifest: Mapping[str, Any] | None
    ) -> None:
        self.run, self.role, self.step_path = run, role, step_path
        self.task = task if task is not None else {"kind": "session", **({"stepPath": step_path} if step_path else {})}
        self.manifest = dict(manifest or {})
        self.turn = 0
        self.output: Any = None
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
        self.run.flush()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            with Session(
                self.run, role=self.role, task=self.task, step_path=self.step_path, manifest=self.manifest
            ) as session:
                session.output = fn(*args, **kwargs)
                return session.output

        return recorded  # type: ignore[return-value]

    def model_call(self, request: Mapping[str, Any], *, provider: str, model_id: str) -> ModelCall:
        """The next turn's model call: harness.model.called is committed on entry, before the
        request leaves; `call.respond(...)` in the block records harness.model.responded, an
        exception harness.model.failed."""
        self.turn += 1
        return ModelCall(self, self.turn, dict(request), provider, model_id)

    def tool_call(self, tool_name: str, args: Any, **options: Any) -> ToolCall:
        options.setdefault("turn", self.turn or None)
        options.setdefault("step_path", self.step_path)
        options.setdefault("caller", self.role)
        return self.run.tool_call(tool_name, args, **options)


class ModelCall:
    def __init__(self, session: Session, turn: int, request: dict[str, Any], provider: str, model_id: str) -> None:
        self.session, self.turn, self.request, self.provider, self.model_id = session, turn, request, provider, model_id
        self.call_id = f"{session.step_path or session.role}:turn{turn}"
        self.response: dict[str, Any] | None = None

    def respond(
        self,
        text: str | None = None,
        *,
        tool_calls: list[Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        """The model's answer; `usage` as the ledger counts it: inputTokens, outputTokens,
        cachedInputTokens, reasoningTokens (never a cost: the server prices calls itself)."""
        self.response = _core.response_body(text, tool_calls, usage, extra)

    def __enter__(self) -> ModelCall:
        payload = {
            "turn": self.turn,
            "callId": self.call_id,
            "promptHash": _core.canonical_digest(self.request),
            "request": self.request,
        }
        if self.session.step_path is not None:
            payload["stepPath"] = self.session.step_path
        self.session.run.emit("harness.model.called", payload)
        self.session.run.flush()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        run = self.session.run
        if exc is None and self.response is None:
            exc = RuntimeError(f"model call {self.call_id} ended without respond()")
            self._failed(exc)
            raise exc
        if exc is not None:
            self._failed(exc)
            return
        assert self.response is not None
        run.emit(
            "harness.model.responded",
            _core.model_responded(
                turn=self.turn,
                call_id=self.call_id,
                step_path=self.session.step_path,
                provider=self.provider,
                model_id=self.model_id,
                response=self.response,
            ),
        )

    def _failed(self, exc: BaseException) -> None:
        payload = {
            "turn": self.turn,
            "callId": self.call_id,
            "error": _core.error_payload(exc),
            "model": {"provider": self.provider, "modelId": self.model_id},
        }
        if self.session.step_path is not None:
            payload["stepPath"] = self.session.step_path
        self.session.run.emit("harness.model.failed", payload)


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
