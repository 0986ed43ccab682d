"""The asyncio client: `AsyncClient`, `AsyncRun`, `AsyncToolCall`, `AsyncSession`,
`AsyncModelCall` and `AsyncFollow`, each the awaitable twin of its namesake in `sync`, with the
same requests, retry rule, keys and payloads (`_core`)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx

from . import _core
from ._core import Appended, Envelope, KeyMaker, RetryPolicy
from .errors import ApiError, ToolCallFailed, ToolCallInProgress, TransportError, error_from

log = logging.getLogger("runledger.client")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_current_session: contextvars.ContextVar[AsyncSession | None] = contextvars.ContextVar(
    "runledger_async_session", default=None
)


def current_async_session() -> AsyncSession | None:
    return _current_session.get()


class AsyncClient:
    """`sync.Client`, awaitable."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        workspace: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.owner = _core.new_owner()
        self._params = {"workspace": workspace} if workspace else {}
        self._http = httpx.AsyncClient(
            base_url=_core.base_url(base_url),
            timeout=timeout,
            transport=transport,
            headers={"Authorization": f"Bearer {key}", "User-Agent": _core.USER_AGENT, "Accept": "application/json"},
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None, retry: bool = True
    ) -> httpx.Response:
        content = None if body is None else _core.encode(body)
        headers = {"Content-Type": "application/json"} if content is not None else {}
        policy = self.retry if retry else _core.NO_RETRY
        started, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            failure: Exception
            try:
                response = await self._http.request(
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
            await asyncio.sleep(wait)

    async def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return (await self.request(method, path, **kwargs)).json()

    async def append(
        self,
        run_id: str,
        events: Iterable[Mapping[str, Any]],
        expected_sequence: int | None = None,
        *,
        fencing_token: str | int | None = None,
    ) -> Appended:
        items = [_core.check_item(e) for e in events]
        body: dict[str, Any] = {"events": items}
        if expected_sequence is not None:
            body["expectedSequence"] = expected_sequence
        if fencing_token is not None:
            body["fencingToken"] = fencing_token
        keyed = all("idempotencyKey" in item for item in items)
        return Appended.from_body(await self._json("POST", _core.run_path(run_id, "events"), body=body, retry=keyed))

    async def get_run(self, run_id: str) -> dict[str, Any]:
        return await self._json("GET", _core.run_path(run_id))

    async def events(self, run_id: str, *, after: int = 0, page_size: int = 500) -> AsyncIterator[Envelope]:
        while True:
            page = await self._json(
                "GET", _core.run_path(run_id, "events"), params={"after": after, "limit": page_size}
            )
            for envelope in page["events"]:
                yield envelope
            if page.get("next") is None:
                return
            after = page["next"]

    def follow(self, run_id: str, after: int = 0, *, read_timeout: float = 60.0) -> AsyncFollow:
        return AsyncFollow(self, run_id, after, read_timeout)

    async def start_run(
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
    ) -> AsyncRun:
        run = AsyncRun(
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
        await run.append([_core.event_item("RunStarted", started)])
        return run

    async def run(
        self,
        run_id: str,
        *,
        writer: str = "main",
        batch_size: int = 100,
        flush_interval: float = 1.0,
        fencing_token: str | int | None = None,
        check_sequence: bool = False,
        next_key: int = 1,
    ) -> AsyncRun:
        run = AsyncRun(
            self,
            run_id,
            writer=writer,
            batch_size=batch_size,
            flush_interval=flush_interval,
            fencing_token=fencing_token,
            check_sequence=check_sequence,
            next_key=next_key,
        )
        await run._sync_sequence()
        return run


class AsyncRun:
    """`sync.Run`, awaitable; the time flush is a task of the running loop."""

    def __init__(
        self,
        client: AsyncClient,
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
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None
        self._background_error: BaseException | None = None

    async def append(self, events: Iterable[Mapping[str, Any]]) -> Appended:
        async with self._lock:
            self._buffer.extend(self.keys.keyed(_core.check_item(e)) for e in events)
            return await self._send_buffer()

    async def emit(
        self,
        type_: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        occurrence_id: str | None = None,
    ) -> None:
        item = _core.event_item(type_, payload, idempotency_key=idempotency_key, occurrence_id=occurrence_id)
        async with self._lock:
            self._buffer.append(self.keys.keyed(item))  # kept, whatever a background flush raised
            if len(self._buffer) >= self.batch_size:
                await self._send_buffer()
                return
            if self._timer is None and self.flush_interval > 0:
                self._timer = asyncio.create_task(self._flush_later())
            self._raise_background_error()

    async def flush(self) -> Appended:
        async with self._lock:
            return await self._send_buffer()

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_interval)
        async with self._lock:
            if self._timer is asyncio.current_task():
                self._timer = None
            try:
                await self._send_buffer()
            except Exception as exc:  # raised to the writer at its next emit, flush or close
                log.error("background flush of %s failed: %r", self.run_id, exc)
                self._background_error = exc

    def _raise_background_error(self) -> None:
        error, self._background_error = self._background_error, None
        if error is not None:
            raise error

    async def _send_buffer(self) -> Appended:
        """Send the buffer; then raise what the server refused, or what a background flush raised
        (after sending: an error of the past never holds back what waits, the run's ending included)."""
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()  # it waits for the lock we hold, or sleeps: nothing of it is under way
        self._timer = None
        sent = Appended(last_sequence=self.last_sequence or 0)
        refusal: ApiError | None = None
        unsendable: TypeError | None = None
        while self._buffer:
            batch = self._buffer[: self.batch_size]
            expected = self.last_sequence if self.check_sequence else None
            try:
                done = await self.client.append(self.run_id, batch, expected, fencing_token=self.fencing_token)
            except (TypeError, ValueError):
                bad = _core.unencodable(batch)
                if not bad:
                    raise
                # What JSON cannot hold leaves the buffer (raised, once the rest is sent).
                self._buffer[: len(batch)] = [item for item in batch if all(item is not b for b, _ in bad)]
                log.error("%d event(s) of %s cannot be sent as JSON: %r", len(bad), self.run_id, bad[0][1])
                unsendable = unsendable or TypeError(f"event {bad[0][0]['type']!r} of {self.run_id}: {bad[0][1]}")
                continue
            except ApiError as exc:
                # What the server may take later (a 5xx, a 429) stays for the next flush; what it
                # refused leaves the buffer, and only that: the rest of the batch goes on without it.
                split = (
                    None
                    if exc.retryable and exc.code != "rate_limited"
                    else _core.refused_parts(batch, exc.code, exc.details)
                )
                if split is None:
                    if not exc.retryable:
                        del self._buffer[: len(batch)]
                    raise
                before, refused, after = split
                self._buffer[: len(batch)] = before + after
                if refused:
                    log.error("%d event(s) of %s refused: %r", len(refused), self.run_id, exc)
                    refusal = refusal or exc
                continue
            del self._buffer[: len(batch)]
            self.last_sequence = done.last_sequence
            sent.extend_with(done)
        error: Exception | None = refusal or unsendable
        if error is not None:
            self._background_error = None
            raise error  # the rest was sent: the writer hears of what was not
        self._raise_background_error()
        return sent

    async def _sync_sequence(self) -> None:
        if self.check_sequence:
            self.last_sequence = int((await self.client.get_run(self.run_id))["lastSequence"])

    async def complete(self, output: Any = None) -> Appended:
        done = await self.append([_core.event_item("RunCompleted", {} if output is None else {"output": output})])
        self.finished = True
        return done

    async def fail(self, error: Any) -> Appended:
        if isinstance(error, BaseException):
            error = _core.error_payload(error)
        done = await self.append([_core.event_item("RunFailed", {"error": error})])
        self.finished = True
        return done

    async def aclose(self) -> None:
        await self.flush()

    async def __aenter__(self) -> AsyncRun:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.finished:
            await self.flush()
        elif exc is None:
            await self.complete(self.output)
        else:
            await self.fail(exc)

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
    ) -> AsyncToolCall:
        return AsyncToolCall(
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

    async def call_tool(self, tool_name: str, args: Any, fn: Callable[[], Awaitable[Any]], **options: Any) -> Any:
        async with self.tool_call(tool_name, args, **options) as call:
            if not call.replayed:
                call.result = await fn()
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
    ) -> AsyncSession:
        return AsyncSession(self, role=role, task=task, step_path=step_path, manifest=manifest)


class AsyncToolCall:
    """`sync.ToolCall`, with `async with`."""

    def __init__(
        self,
        run: AsyncRun,
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

    async def _post(self, suffix: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.run.fencing_token is not None:
            body["fencingToken"] = self.run.fencing_token
        path = _core.run_path(self.run.run_id, "tool-calls", *([self.call_id, suffix] if suffix else []))
        return await self.run.client._json("POST", path, body=body)

    async def claim(self) -> None:
        await self.run.flush()
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
                answer = await self._post("", body)
                break
            except ToolCallInProgress as exc:  # e.g. held by the harness that crashed before this restart
                wait = _core.lease_wait(exc.details, time.monotonic() - started, self.run.client.retry)
                if wait is None:
                    raise
                log.warning("tool call %s is leased to another owner: claiming it again in %.1fs", self.call_id, wait)
                await asyncio.sleep(wait)
        self.call_id, self.attempt = answer.get("callId", self.call_id), answer.get("attempt")
        if answer.get("status") == "claimed":
            self.lease_token = answer["leaseToken"]
        else:
            self._finished(answer)

    async def outbound(self) -> None:
        await self._post("outbound", {"leaseToken": self.lease_token})

    async def complete(self, *, result: Any = None, error: Any = None) -> None:
        outcome = {"error": error} if error is not None else {"result": result}
        self._finished(await self._post("complete", {"leaseToken": self.lease_token, **outcome}))
        await self.run._sync_sequence()

    def _finished(self, answer: Mapping[str, Any]) -> None:
        self.status = answer["status"]
        self.replayed = bool(answer.get("idempotentReplay")) and self.lease_token is None
        self.result, self.error = answer.get("result"), answer.get("error")

    async def __aenter__(self) -> AsyncToolCall:
        await self.claim()
        if not self.replayed:
            await self.outbound()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.replayed:
            return
        if exc is not None:
            await self.complete(error=_core.error_payload(exc))
        else:
            await self.complete(result=self.result)


class AsyncSession:
    """`sync.Session`, with `async with`; as a decorator, of coroutine functions."""

    def __init__(
        self, run: AsyncRun, *, role: str, task: Any, step_path: str | None, manifest: Mapping[str, Any] | None
    ) -> None:
        self.run, self.role, self.step_path = run, role, step_path
        self.task = task if task is not None else {"kind": "session", **({"stepPath": step_path} if step_path else {})}
        self.manifest = dict(manifest or {})
        self.turn = 0
        self.output: Any = None
        self._token: contextvars.Token[AsyncSession | None] | None = None

    def _payload(self, **fields: Any) -> dict[str, Any]:
        payload = {"role": self.role, **fields}
        if self.step_path is not None:
            payload["stepPath"] = self.step_path
        return payload

    async def __aenter__(self) -> AsyncSession:
        await self.run.emit(
            "harness.session.started",
            self._payload(task=self.task, manifest=self.manifest, manifestHash=_core.canonical_digest(self.manifest)),
        )
        self._token = _current_session.set(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            _current_session.reset(self._token)
            self._token = None
        if exc is None:
            extra = {} if self.output is None else {"output": self.output}
            await self.run.emit("harness.session.completed", self._payload(**extra))
        else:
            await self.run.emit("harness.session.failed", self._payload(error=_core.error_payload(exc)))
        await self.run.flush()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        async def recorded(*args: Any, **kwargs: Any) -> Any:
            async with AsyncSession(
                self.run, role=self.role, task=self.task, step_path=self.step_path, manifest=self.manifest
            ) as session:
                session.output = await fn(*args, **kwargs)
                return session.output

        return recorded  # type: ignore[return-value]

    def model_call(self, request: Mapping[str, Any], *, provider: str, model_id: str) -> AsyncModelCall:
        self.turn += 1
        return AsyncModelCall(self, self.turn, dict(request), provider, model_id)

    def tool_call(self, tool_name: str, args: Any, **options: Any) -> AsyncToolCall:
        options.setdefault("turn", self.turn or None)
        options.setdefault("step_path", self.step_path)
        options.setdefault("caller", self.role)
        return self.run.tool_call(tool_name, args, **options)


class AsyncModelCall:
    def __init__(self, session: AsyncSession, turn: int, request: dict[str, Any], provider: str, model_id: str) -> None:
        self.session, self.turn, self.request, self.provider, self.model_id = session, turn, request, provider, model_id
        self.call_id = f"{session.step_path or session.role}:turn{turn}"
        self.response: dict[str, Any] | None = None
        self.request_left: bool | None = None  # as sync.ModelCall's: when the block knows

    def respond(
        self,
        text: str | None = None,
        *,
        tool_calls: list[Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self.response = _core.response_body(text, tool_calls, usage, extra)

    async def __aenter__(self) -> AsyncModelCall:
        payload = {
            "turn": self.turn,
            "callId": self.call_id,
            "promptHash": _core.canonical_digest(self.request),
            "request": self.request,
        }
        if self.session.step_path is not None:
            payload["stepPath"] = self.session.step_path
        await self.session.run.emit("harness.model.called", payload)
        await self.session.run.flush()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None and self.response is None:
            exc = RuntimeError(f"model call {self.call_id} ended without respond()")
            await self._failed(exc)
            raise exc
        if exc is not None:
            await self._failed(exc)
            return
        assert self.response is not None
        await self.session.run.emit(
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

    async def _failed(self, exc: BaseException) -> None:
        payload = {
            "turn": self.turn,
            "callId": self.call_id,
            "error": _core.error_payload(exc),
            "requestLeft": _core.request_left(exc) if self.request_left is None else self.request_left,
            "model": {"provider": self.provider, "modelId": self.model_id},
        }
        if self.session.step_path is not None:
            payload["stepPath"] = self.session.step_path
        await self.session.run.emit("harness.model.failed", payload)


class AsyncFollow:
    """`sync.Follow`, as an async iterator."""

    def __init__(self, client: AsyncClient, run_id: str, after: int, read_timeout: float) -> None:
        self.client, self.run_id, self.position, self.read_timeout = client, run_id, after, read_timeout
        self.status: str | None = None
        self.reconnects = 0

    async def __aiter__(self) -> AsyncIterator[Envelope]:
        http = self.client._http
        timeout = httpx.Timeout(http.timeout.connect, read=self.read_timeout)
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
                async with http.stream(
                    "GET", _core.run_path(self.run_id, "stream"), params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        error = error_from(
                            response.status_code, await response.aread(), response.headers.get("Retry-After")
                        )
                        if not error.retryable:
                            raise error
                        failure, retry_after = error, error.retry_after
                    else:
                        started, attempt = time.monotonic(), 0
                        parser = _core.SseParser()
                        async for line in response.aiter_lines():
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
            await asyncio.sleep(wait)
