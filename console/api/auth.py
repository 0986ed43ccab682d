"""Who is calling: an API key (Bearer, one workspace, scopes) or a console session (member role)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from ledger import audit
from ledger.models import ApiKey
from ledger.tenancy.access import Access, Principal, resolve
from ledger.tenancy.services import authenticate_key


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("Authorization must be 'Bearer <api key>'")
        api_key = authenticate_key(key.strip())
        if api_key is None:
            raise AuthenticationFailed("unknown or revoked API key")
        return AnonymousUser(), api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class CsrfSessionAuthentication(SessionAuthentication):
    """The console's session, with CSRF enforced on unsafe methods (DRF's own behaviour)."""


def principal(request: Request) -> Principal:
    """Who the request acts as: its API key, else the session's user (maybe anonymous)."""
    return request.auth if isinstance(request.auth, ApiKey) else request.user


def principal_name(request: Request) -> str:
    """The caller as the log's door records who started a run (`append(by=...)`) and the audit
    log names actors: `key:<prefix>` for an API key, else the session's username."""
    if isinstance(request.auth, ApiKey):
        return audit.key_actor(request.auth)
    return str(request.user.get_username())


def access_for(request: Request, scope: str, *, run_id: str | None = None, role: str | None = None) -> Access:
    """The caller's workspace (and run) for an operation needing `scope` (and `role`): see
    ledger.tenancy.access. A member names the workspace with ?workspace=TENANT/WORKSPACE; without it, the
    run decides, or the member's only workspace does. Authentication itself is DRF's (401)."""
    return resolve(
        principal(request),
        workspace=request.query_params.get("workspace") or None,
        run_id=run_id,
        scope=scope,
        role=role,
    )
