"""Redaction lives in `ledger.redaction`, below every layer, so that what a person writes (a
reason, a note, an audit entry) is redacted by the same policy as an event; this name stays for
the imports that use it."""

from __future__ import annotations

from ..redaction import (
    BUILTIN_VALUE_RULES,
    DEFAULT_REDACTOR,
    MAX_EXTRA_KEYS,
    MAX_EXTRA_PATTERNS,
    MAX_KEY_NAME_LENGTH,
    MAX_PATTERN_LENGTH,
    REDACTED,
    SECRET_KEY_NAMES,
    SECRET_WORD_ENDINGS,
    SECRET_WORD_PAIRS,
    TOKEN_NOT_SECRET_AFTER,
    InvalidRule,
    NotPlain,
    Redactor,
    ValueRule,
    check_key,
    check_pattern,
    check_rules,
    is_builtin_secret_key,
    key_words,
    normalize_key,
    policy,
)

__all__ = [
    "BUILTIN_VALUE_RULES",
    "DEFAULT_REDACTOR",
    "REDACTED",
    "SECRET_KEY_NAMES",
    "SECRET_WORD_ENDINGS",
    "SECRET_WORD_PAIRS",
    "TOKEN_NOT_SECRET_AFTER",
    "MAX_EXTRA_KEYS",
    "MAX_EXTRA_PATTERNS",
    "MAX_KEY_NAME_LENGTH",
    "MAX_PATTERN_LENGTH",
    "InvalidRule",
    "NotPlain",
    "Redactor",
    "ValueRule",
    "check_key",
    "check_pattern",
    "check_rules",
    "is_builtin_secret_key",
    "key_words",
    "normalize_key",
    "policy",
]
