"""Django's ASGI handler with one thread hop per request for synchronous views.

Django's own ASGIHandler runs the middleware chain in async mode: every async-capable middleware
(MiddlewareMixin) runs its `process_request`/`process_response` through `sync_to_async`, and the
sync-only ones (ours, WhiteNoise) adapt back with `async_to_sync`, so a request to a synchronous
view crossed between the event loop and its thread ~36 times (request_started, each middleware
method, the view, response.close), each crossing a wake-up of the other side, which a loaded
machine schedules late. Here a request whose view is synchronous runs start to end in one call on
its thread: `request_started`, the middleware chain in sync mode (the chain WSGI and Django's test
client run, which the test suite exercises), the view, and, for a response that is not streamed,
`response.close()` (`request_finished`); the body then goes to the server in one message.

Everything else is Django's: the body is read as Django reads it, each request still gets its own
thread (ThreadSensitiveContext), an async view (the SSE stream) takes Django's handler as it is,
and a streamed response from a sync view is sent by Django's `send_response` while a disconnect is
watched for, then closed on the request's thread.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.core import signals
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import connections
from django.http import HttpResponseBase
from django.http.response import FileResponse
from django.urls import Resolver404, get_resolver, set_script_prefix

Scope = dict[str, Any]

# Request threads kept idle for the next request (each with its database connection, which
# CONN_MAX_AGE decides about); past this many idle at once, a finished request's thread ends.
IDLE_THREADS = 8


class _Threads:
    """Single-thread executors handed out one per request and taken back after it, so a request
    runs on a thread that earlier requests ran on (and kept their connection on) instead of a new
    one. Used only from the event loop's thread."""

    def __init__(self, idle: int = IDLE_THREADS) -> None:
        self._idle: list[ThreadPoolExecutor] = []
        self._keep = idle

    def take(self) -> ThreadPoolExecutor:
        return self._idle.pop() if self._idle else ThreadPoolExecutor(1, thread_name_prefix="asgi-request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        if len(self._idle) < self._keep:
            self._idle.append(executor)
            return
        executor.submit(connections.close_all)  # the thread's own connections, before it ends
        executor.shutdown(wait=False)

    def close_connections(self) -> None:
        """Close the idle threads' database connections (each thread's own), as a test does
        before its database is dropped."""
        for executor in list(self._idle):
            executor.submit(connections.close_all).result()


class _SyncChain(base.BaseHandler):
    """The middleware chain in sync mode (what WSGI runs), with ASGI's last-chance handler."""

    def __init__(self, outer: ASGIHandler) -> None:
        super().__init__()
        self._outer = outer
        self.load_middleware(is_async=False)

    def handle_uncaught_exception(self, request: Any, resolver: Any, exc_info: Any) -> Any:
        return self._outer.handle_uncaught_exception(request, resolver, exc_info)


class OneHopASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()
        self._sync_chain = _SyncChain(self)
        self._threads = _Threads()

    def close_connections(self) -> None:
        """The database connections kept by idle request threads, closed (see _Threads)."""
        self._threads.close_connections()

    def _view_is_async(self, path: str) -> bool:
        """Whether the view at `path` is a coroutine function (Django's handler serves it).
        Unknown paths are served here: their 404 comes from the sync chain."""
        try:
            match = get_resolver().resolve(path)
        except Resolver404:
            return False
        return bool(iscoroutinefunction(match.func))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self._threads.take()
        try:
            await self._in_context(executor, scope, receive, send)
        finally:
            self._threads.give_back(executor)

    async def _in_context(self, executor: ThreadPoolExecutor, scope: Scope, receive: Any, send: Any) -> None:
        # Thread-sensitive work of this request (the view, Django's own sync_to_async calls) runs
        # on `executor`'s one thread, as it ran on the one new thread Django's handler made for it.
        async with ThreadSensitiveContext(executor=executor):
            # The path the resolver sees, as ASGIRequest computes it.
            prefix = get_script_prefix(scope)
            path_info = scope["path"].removeprefix(prefix) if prefix else scope["path"]
            if self._view_is_async(path_info):
                await self.handle(scope, receive, send)
            else:
                await self._handle_sync(scope, receive, send)

    async def _handle_sync(self, scope: Scope, receive: Any, send: Any) -> None:
        from django.core.exceptions import RequestAborted

        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response: Any = await sync_to_async(self._serve, thread_sensitive=True)(scope, body_file)
            if not response.streaming:
                await send(
                    {"type": "http.response.start", "status": response.status_code, "headers": _headers(response)}
                )
                await send({"type": "http.response.body", "body": response.content})
                return
            await self._stream(response, receive, send)
        finally:
            body_file.close()

    def _serve(self, scope: Scope, body_file: Any) -> Any:
        """On the request's thread: what Django's handler does between reading the body and
        sending the response, with the chain in sync mode; a response that is not streamed is
        rendered and closed here (request_finished), so nothing is left for another hop."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=ASGIHandler, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        response: Any = error_response if request is None else self._sync_chain.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if not response.streaming:
            _ = response.content
            response.close()
        return response

    async def _stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """A streamed response, as Django's handler sends it: stop when the client disconnects,
        then close it on the request's thread."""
        from django.core.exceptions import RequestAborted

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(self.send_response(response, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except (RequestAborted, asyncio.CancelledError):
                    pass
            else:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, RequestAborted):
                    pass
        await sync_to_async(response.close, thread_sensitive=True)()


def _headers(response: HttpResponseBase) -> list[tuple[bytes, bytes]]:
    headers = [
        (
            name.encode("ascii") if isinstance(name, str) else bytes(name),
            value.encode("latin1") if isinstance(value, str) else bytes(value),
        )
        for name, value in response.items()
    ]
    headers.extend(
        (b"Set-Cookie", cookie.output(header="").encode("ascii").strip()) for cookie in response.cookies.values()
    )
    return headers
