"""ASGI entry point: Django for HTTP, Channels for WebSockets (console.routing)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)

from .input_limits import BodyLimit  # noqa: E402
from .routing import websocket_application  # noqa: E402

# BodyLimit: a chunked body meets the same 10 MiB limit as one with a Content-Length.
application = ProtocolTypeRouter({"http": BodyLimit(django_asgi_app), "websocket": websocket_application})
