"""Refused requests log one line, never a traceback (docs/security.md "Logs").

Django logs every 4xx response on `django.request`, and with the whole traceback when a view
raised PermissionDenied or Http404: a probe that walks other tenants' URLs would fill the log with
stack traces. This filter turns each such record into one line, `METHOD PATH STATUS CALLER`, the
caller being `key:<prefix>` (the public part of a bearer key, never the secret), the username of a
session, or `anonymous`. 5xx records keep their traceback: those are bugs."""

from __future__ import annotations

import logging
from typing import Any

# ledger.tenancy.services.KEY_PREFIX: not imported, logging is configured before the apps load
# (tests/test_refused_logs.py checks they agree).
KEY_PREFIX = "rl_"


def caller_of(request: Any) -> str:
    header = str(getattr(request, "headers", {}).get("Authorization", ""))
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.startswith(KEY_PREFIX):
        prefix = token[len(KEY_PREFIX) :].partition("_")[0]
        return f"key:{prefix[:12]}" if prefix.isalnum() else "key:?"
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False):
        return str(user.get_username())
    return "anonymous"


class RefusedRequestsOneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        request = getattr(record, "request", None)
        if not isinstance(status, int) or not 400 <= status < 500 or request is None:
            return True
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        record.msg = "refused %s %s %s %s"
        record.args = (request.method, request.path, status, caller_of(request))
        return True
