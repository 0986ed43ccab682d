"""The login's client address, for django-axes' per-username-and-address throttling."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    """The peer address, or behind RUNLEDGER_TRUSTED_PROXIES proxies the address the outermost of
    them saw: X-Forwarded-For's Nth entry from the right. Entries further left are whatever the
    client sent, so they are never used (a client could name any address and dodge the lockout)."""
    hops = settings.RUNLEDGER_TRUSTED_PROXIES
    if hops:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return request.META.get("REMOTE_ADDR")
