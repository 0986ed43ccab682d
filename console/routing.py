"""WebSocket routes: every live view's consumer, behind the session and the allowed-hosts check."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from channels.routing import URLRouter

from .live import reexecutions, run, runs

# The stubs want their own URL pattern type here, which Django's path() (what Channels documents) never returns.
websocket_application = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter([*run.websocket_urlpatterns, *runs.websocket_urlpatterns,  # type: ignore[list-item]
                                   *reexecutions.websocket_urlpatterns])))
