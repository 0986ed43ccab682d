"""The sockets' session middleware (console/routing.py SocketSessionMiddleware): the session from
the cookie in the scope, as Channels' SessionMiddleware resolves it, and the socket's own `send`
handed on, not Channels' wrapper that checked for a session to save on every frame. The whole
stack (origin check, cookies, session, user, router) is exercised by tests/test_live_run.py and
tests/test_stream_security.py."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.auth import AuthMiddleware
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.conf import settings

from console.routing import SocketSessionMiddleware, websocket_application

SESSION_KEY = "k" * 32


def _handed_on(middleware: type[SessionMiddleware]) -> tuple[dict[str, Any], Any, Any]:
    seen: dict[str, Any] = {}

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(scope=scope, send=send)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent here")

    scope = {"type": "websocket", "path": "/ws/runs/run_x/", "cookies": {settings.SESSION_COOKIE_NAME: SESSION_KEY}}
    async_to_sync(middleware(inner))(scope, receive, send)
    return seen["scope"], seen["send"], send


def test_the_session_comes_from_the_cookie_and_send_is_the_sockets_own() -> None:
    scope, handed_on, send = _handed_on(SocketSessionMiddleware)
    assert scope["session"].session_key == SESSION_KEY
    assert handed_on is send


def test_channels_own_session_middleware_wraps_send() -> None:
    # What SocketSessionMiddleware leaves out: were the stack to use Channels' SessionMiddleware
    # again, every frame would go through its wrapper.
    scope, handed_on, send = _handed_on(SessionMiddleware)
    assert scope["session"].session_key == SESSION_KEY
    assert handed_on is not send


def test_the_console_sockets_are_served_through_it() -> None:
    # The stack of console/routing.py: origin check, cookies, this session middleware, the user.
    cookies = websocket_application.application
    assert isinstance(cookies, CookieMiddleware)
    assert type(cookies.inner) is SocketSessionMiddleware
    assert isinstance(cookies.inner.inner, AuthMiddleware)
