"""What the WebSocket consumer tests share: a member's session cookie, and a
communicator that presents it (with an Origin the allowed-hosts check accepts)."""

from __future__ import annotations

from typing import Any

from channels.testing import WebsocketCommunicator
from django.test import Client

from console.asgi import application

TIMEOUT_S = 10  # per message; a loaded 2-core machine can stall a read for seconds


def session_id(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def communicator(path: str, session_id: str | None = None, origin: str = "http://testserver") -> WebsocketCommunicator:
    headers = [(b"origin", origin.encode())]
    if session_id:
        headers.append((b"cookie", f"sessionid={session_id}".encode()))
    return WebsocketCommunicator(application, path, headers=headers)
