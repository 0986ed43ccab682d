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


# Values that redaction never changes (strings too, unless the workspace has value patterns).
_KEPT = frozenset({int, float, bool, type(None)})
# Verdicts remembered per Redactor: payloads repeat a few key names thousands of times.
_VERDICTS_KEPT = 4096


class Redactor:
    def __init__(self, extra_keys: Iterable[str] = (), value_patterns: Iterable[str] = ()) -> None:
        self.keys = SECRET_KEY_NAMES | {normalize_key(k) for k in extra_keys}
        self.patterns = [re.compile(p) for p in value_patterns]
        self._kept = _KEPT if self.patterns else _KEPT | {str}
        self._secret: dict[str, bool] = {}

    def is_secret(self, key: str) -> bool:
        verdict = self._secret.get(key)
        if verdict is None:
            if len(self._secret) >= _VERDICTS_KEPT:
                self._secret.clear()
            verdict = self._secret[key] = normalize_key(key) in self.keys
        return verdict

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            kept = self._kept
            return {
                k: REDACTED if self.is_secret(k) else v if v.__class__ in kept else self(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str) and self.patterns:
            for pattern in self.patterns:
                value = pattern.sub(REDACTED, value)
        return value


DEFAULT_REDACTOR = Redactor()
