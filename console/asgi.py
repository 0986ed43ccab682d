"""ASGI entry point: Django for HTTP, Channels for WebSockets (console.routing)."""

from __future__ import annotations

import os

import django

from .startup import load_settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
load_settings_or_exit()  # Daphne stops with the one line, as manage.py does
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does before its handler

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)

from .asgi_handler import OneHopASGIHandler  # noqa: E402
from .input_limits import BodyLimit  # noqa: E402
from .routing import websocket_application  # noqa: E402

# Django's ASGI handler, one thread hop per request to a sync view (console/asgi_handler.py).
django_asgi_app = OneHopASGIHandler()

# BodyLimit: a chunked body meets the same 10 MiB limit as one with a Content-Length.
application = ProtocolTypeRouter({"http": BodyLimit(django_asgi_app), "websocket": websocket_application})
