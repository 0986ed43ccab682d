from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from ledger.models import ApiKey


class Authenticated(BasePermission):
    """An API key or a logged-in member; scopes and roles are checked per operation (auth.access_for)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, ApiKey) or bool(request.user and request.user.is_authenticated)
