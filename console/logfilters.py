"""Refused requests log one line, never a traceback (docs/security.md "Logs").

Django logs every 4xx response on `django.request`, and with the whole traceback when a view
raised PermissionDenied or Http404: a probe that walks other tenants' URLs would fill the log with
stack traces. This filter turns each such record into one line, `METHOD PATH STATUS CALLER`, the
caller being `key:<prefix>` (the public part of a bearer key, never the secret), the username of a
session, or `anonymous`. 5xx records keep their traceback: those are bugs."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.utils.functional import LazyObject, empty

# ledger.tenancy.services.KEY_PREFIX: not imported, logging is configured before the apps load
# (tests/test_refused_logs.py checks they agree).
KEY_PREFIX = "rl_"


def caller_of(request: Any) -> str:
    header = str(getattr(request, "headers", {}).get("Authorization", ""))
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.startswith(KEY_PREFIX):
        prefix = token[len(KEY_PREFIX) :].partition("_")[0]
        return f"key:{prefix[:12]}" if prefix.isalnum() else "key:?"
    # Only a user already loaded: resolving the lazy one reads the session from the database,
    # which an async view (the SSE stream) may not do here.
    user = getattr(request, "__dict__", {}).get("user")
    user = user.__dict__.get("_wrapped", user) if isinstance(user, LazyObject) else user
    if user is not None and user is not empty and getattr(user, "is_authenticated", False):
        return str(user.get_username())
    if user is empty and getattr(request, "COOKIES", {}).get(settings.SESSION_COOKIE_NAME):
        return "session"
    return "anonymous"


class RefusedRequestsOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return self._one_line(record)
        except Exception:  # a log line must never turn a refusal into a 500
            return True

    def _one_line(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        request = getattr(record, "request", None)
        if not isinstance(status, int) or not 400 <= status < 500 or request is None:
            return True
        if getattr(record, "_refusal_line", False):
            return True  # already this line (logging configured twice attaches the filter twice)
        if getattr(request, "_refusal_logged", False):
            return False  # a view and the handler both log some refusals (a 405): one line each
        request._refusal_logged = True
        record._refusal_line = True
        args = (request.method, request.path, status, caller_of(request))
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        record.msg = "refused %s %s %s %s"
        record.args = args
        return True
