"""Secret redaction, applied before anything is hashed or stored (DESIGN.md §3)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"

# Whole-name matching on purpose: `inputTokens` or `leaseToken` are not secrets.
SECRET_KEY_NAMES = frozenset(
    {
        "authorization", "proxyauthorization", "cookie", "setcookie", "apikey", "xapikey",
        "password", "passwd", "secret", "clientsecret", "token", "accesstoken", "refreshtoken",
        "idtoken", "privatekey", "sessionid",
    }
)


def normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


class Redactor:
    def __init__(self, extra_keys: Iterable[str] = (), value_patterns: Iterable[str] = ()) -> None:
        self.keys = SECRET_KEY_NAMES | {normalize_key(k) for k in extra_keys}
        self.patterns = [re.compile(p) for p in value_patterns]

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: REDACTED if normalize_key(k) in self.keys else self(v) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str) and self.patterns:
            for pattern in self.patterns:
                value = pattern.sub(REDACTED, value)
        return value


DEFAULT_REDACTOR = Redactor()
