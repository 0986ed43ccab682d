"""WebSocket routes: every live view's consumer, behind the session and the allowed-hosts check."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from channels.routing import URLRouter

from .live import reexecutions, run, runs

# Any: the stubs want a URL pattern type of their own, which Django's path() (what Channels
# documents for routes) never returns.
routes: list[Any] = [*run.websocket_urlpatterns, *runs.websocket_urlpatterns, *reexecutions.websocket_urlpatterns]

websocket_application = AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(routes)))
