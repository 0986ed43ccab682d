"""WebSocket routes: every live view's consumer, behind the session and the allowed-hosts check."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_plus

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware
from django.urls import re_path

from ledger.limits import NUL

from .live import reexecutions, run, runs
from .streams import socket_user


class SocketSessionMiddleware(SessionMiddleware):
    """Channels' SessionMiddleware for sockets: the session from the cookie in the scope (which
    AuthMiddleware reads the user from), and the socket's own `send` handed on unwrapped.

    Channels' session middleware also wraps `send`, to save a modified session and set its
    cookie on an `http.response.start`, a message a WebSocket never sends; its check ran on every
    frame all the same, through the session's lazy object and the settings: ~11 µs a frame, a
    tenth of Daphne's CPU for an event with fifty subscribers (bench/README.md, console). The
    console's sockets only read the session: at the handshake (AuthMiddleware) and on the
    keepalive re-check (console/live/watch.py)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        wrapper = InstanceSessionWrapper(scope, send)
        await wrapper.resolve_session()
        inner: Any = self.inner  # an ASGI 3 application (the stubs also allow Channels' old ASGI 2 form)
        return await inner(wrapper.scope, receive, send)  # SessionMiddleware hands on wrapper.send


class SocketAuthMiddleware(AuthMiddleware):
    """Channels' AuthMiddleware with the user read as console/streams.py's `socket_user` reads it:
    a session signed with a key of SECRET_KEY_FALLBACKS is its user's, and nothing is written."""

    async def resolve_scope(self, scope: Any) -> None:
        scope["user"]._wrapped = await database_sync_to_async(socket_user)(scope["session"])


# Any: the stubs want a URL pattern type of their own, which Django's path() (what Channels
# documents for routes) never returns.
routes: list[Any] = [*run.websocket_urlpatterns, *runs.websocket_urlpatterns, *reexecutions.websocket_urlpatterns]

# Every other path: its handshake is refused (403), as any refused socket's is; without it
# Channels' router raises and Daphne answers 500.
no_route: Any = re_path(r"", WebsocketDenier.as_asgi())  # type: ignore[arg-type]  # as the routes above


class RefuseNul:
    """A handshake whose path or query holds a NUL character (`%00`) is refused (403) before any
    consumer looks a run or a workspace up by it: PostgreSQL cannot hold U+0000 in a text
    parameter (a 500 and a traceback), SQLite can. What console.input_limits does for HTTP."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.denier = WebsocketDenier.as_asgi()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if NUL in scope.get("path", "") or NUL in unquote_plus(scope.get("query_string", b"").decode("latin-1")):
            return await self.denier(scope, receive, send)
        return await self.inner(scope, receive, send)


# Channels' AuthMiddlewareStack (cookies, session, user) with the session middleware above; both
# read the session and the user lazily, so nothing is looked up before RefuseNul has looked.
websocket_application = AllowedHostsOriginValidator(
    CookieMiddleware(SocketSessionMiddleware(SocketAuthMiddleware(RefuseNul(URLRouter([*routes, no_route])))))
)
