"""Secret redaction, applied before anything is hashed or stored (docs/design.md §3, docs/security.md).

Two kinds of rule, built in and added to per workspace:

- key rules: the whole value of a secret-named key becomes "[REDACTED]", at any depth. Built-in
  names match by word (`openai_api_key`, `X-Amz-Security-Token`, `aws_secret_access_key`);
  a workspace's extra names match the whole name, lower-cased with `-` and `_` removed.
- value rules: a secret-shaped piece of any string (a bearer token in a log line, an `sk-…` key
  pasted into a prompt) is replaced where it stands; the text around it is kept.

`policy(keys, patterns)` hands out one compiled Redactor per distinct rule set, shared by every
append of the workspaces that have it: patterns compile once and key verdicts are remembered.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

REDACTED = "[REDACTED]"

# --- key names ------------------------------------------------------------------------------

# The names docs/design.md §3 lists (lower-cased, `-`/`_` removed); every one stays a secret.
SECRET_KEY_NAMES = frozenset(
    {
        "authorization",
        "proxyauthorization",
        "cookie",
        "setcookie",
        "apikey",
        "xapikey",
        "password",
        "passwd",
        "secret",
        "clientsecret",
        "token",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "privatekey",
        "sessionid",
    }
)

# A word of the key that names a secret wherever it stands, alone or as the end of a word glued
# together (`clientsecret`, `openaiapikey`, `setcookie`).
SECRET_WORD_ENDINGS = (
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "authorization",
    "cookie",
    "cookies",
    "apikey",
    "apikeys",
    "privatekey",
    "accesskey",
    "sessionid",
    "sessionkey",
)
# Two adjacent words that name a secret (`x-api-key`, `private_key_pem`, `aws_access_key_id`).
SECRET_WORD_PAIRS = frozenset(
    {
        ("api", "key"),
        ("api", "keys"),
        ("private", "key"),
        ("access", "key"),
        ("secret", "key"),
        ("signing", "key"),
        ("encryption", "key"),
        ("master", "key"),
        ("session", "id"),
        ("session", "key"),
    }
)
# `token` is a secret only as the key's LAST word and singular: `access_token`, `idToken`,
# `X-Auth-Token`, `csrftoken`. Usage counters never end so (`max_tokens`, `inputTokens`,
# `prompt_tokens`, `tokens`, `token_count`, `totalTokenCount`), and these first halves make a
# token that is a count, a vocabulary entry, a cursor, or Runledger's own lease/fence (docs/design.md).
TOKEN_NOT_SECRET_AFTER = frozenset(
    {
        "max",
        "min",
        "num",
        "total",
        "bos",
        "eos",
        "pad",
        "unk",
        "sep",
        "cls",
        "mask",
        "stop",
        "special",
        "next",
        "page",
        "continuation",
        "lease",
        "fencing",
    }
)

_CAMEL_LOWER_UPPER = re.compile(r"([a-z0-9])([A-Z])")
_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]+")


def normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


def key_words(key: str) -> list[str]:
    """`openaiAPIKey.v2` -> ["openai", "api", "key", "v2"]: snake, kebab, camel case and dots."""
    key = _CAMEL_ACRONYM.sub(r"\1 \2", _CAMEL_LOWER_UPPER.sub(r"\1 \2", key))
    return [w for w in _NOT_ALNUM.split(key.lower()) if w]


def _is_token_word(words: list[str]) -> bool:
    last = words[-1]
    if not last.endswith("token"):
        return False
    first_half = last[: -len("token")] or (words[-2] if len(words) > 1 else "")
    return first_half not in TOKEN_NOT_SECRET_AFTER


def is_builtin_secret_key(key: str) -> bool:
    """Whether a key name is a secret by the built-in rules (docs/security.md lists them)."""
    if normalize_key(key) in SECRET_KEY_NAMES:
        return True
    words = key_words(key)
    if not words:
        return False
    if any(w.endswith(SECRET_WORD_ENDINGS) for w in words):
        return True
    if any(pair in SECRET_WORD_PAIRS for pair in zip(words, words[1:])):
        return True
    return _is_token_word(words)


# --- values ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueRule:
    """A built-in value pattern; `Redactor.scrub` says which substrings a string must hold before
    the regex is run on it at all."""

    name: str
    description: str
    regex: re.Pattern[str]
    replacement: str
    example: str  # a string the rule redacts (docs, the settings page and tests)

    def sub(self, text: str) -> str:
        return self.regex.sub(self.replacement, text)


def _rule(name: str, description: str, pattern: str, replacement: str, example: str, flags: int = 0) -> ValueRule:
    return ValueRule(name, description, re.compile(pattern, flags), replacement, example)


# Substring replacement: the match is replaced where it stands and the rest of the text is kept.
# A scheme or a key name in front of the secret (`Bearer `, `password=`) stays, to show what was there.
BUILTIN_VALUE_RULES: tuple[ValueRule, ...] = (
    _rule(
        "bearer",
        "an HTTP bearer credential: `Bearer ` and 16+ token characters, at least one not a letter",
        r"\b(bearer\s+)(?=[A-Za-z0-9._~+/-]*[0-9._~+/-])[A-Za-z0-9._~+/-]{16,}=*",
        r"\1" + REDACTED,
        "Authorization: Bearer abc123def456ghi789",
        re.IGNORECASE,
    ),
    _rule(
        "openai_anthropic_key",
        "an OpenAI or Anthropic style key: `sk-` then 20+ key characters with a digit (`sk-proj-…`, `sk-ant-api03-…`)",
        r"\bsk-(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}",
        REDACTED,
        "key sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
    ),
    _rule(
        "aws_access_key_id",
        "an AWS access key id: AKIA (long-term) or ASIA (temporary) and 16 of A-Z0-9",
        r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",
        REDACTED,
        "AKIAIOSFODNN7EXAMPLE",
    ),
    _rule(
        "jwt",
        "a JSON Web Token: three base64url segments, the first starting `eyJ`",
        r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
        REDACTED,
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
    ),
    _rule(
        "github_token",
        "a GitHub token: ghp_/gho_/ghu_/ghs_/ghr_ and 36+ characters, or github_pat_",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
        REDACTED,
        "ghp_" + "a1B2" * 9,
    ),
    _rule(
        "slack_token",
        "a Slack token: xoxa-/xoxb-/xoxp-/xoxo-/xoxs-/xoxr-/xoxe- and 10+ characters",
        r"\bxox[abposre]-[A-Za-z0-9-]{10,}",
        REDACTED,
        "xoxb-1234567890-abcdefghij",
    ),
    _rule(
        "private_key_pem",
        "a PEM private key block (RSA, EC, OPENSSH, PKCS#8, PGP…), to its END line or the "
        "end of the text when it was cut off",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)",
        REDACTED,
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        re.DOTALL,
    ),
    _rule(
        "url_password",
        "the password of credentials in a URL (`scheme://user:PASSWORD@host`)",
        r"\b([a-z][a-z0-9+.-]*://[^\s/?#@:]+:)[^\s/?#@]+@",
        r"\1" + REDACTED + "@",
        "postgres://app:hunter2@db.internal:5432/app",
        re.IGNORECASE,
    ),
    _rule(
        "secret_assignment",
        "a secret-named setting assigned in text: `password=…`, `api_key=…`, "
        "`access_token=…`, `OPENAI_API_KEY=…`, `aws_secret_access_key=…`, or a quoted JSON "
        '`"password": "…"` inside a string',
        r"(api[_-]?key|secret[_-]?access[_-]?key|client[_-]?secret|secret|password|passwd"
        r"|(?:access|refresh|id|auth|session)[_-]?token|token)(\s*=\s*|[\"']:\s*[\"'])[^\s\"'&,;<>]+",
        r"\1\2" + REDACTED,
        "GET /cb?code=1&access_token=abc123&state=x",
        re.IGNORECASE,
    ),
)
(_BEARER, _SK_KEY, _AWS_KEY_ID, _JWT, _GITHUB, _SLACK, _PEM, _URL_PASSWORD, _ASSIGNMENT) = BUILTIN_VALUE_RULES


# --- workspace rules ------------------------------------------------------------------------

MAX_EXTRA_KEYS = 100
MAX_KEY_NAME_LENGTH = 200
MAX_EXTRA_PATTERNS = 50
MAX_PATTERN_LENGTH = 500

_sre_parser: Any = importlib.import_module("re._parser")  # the parser `re` compiles with (no public API)


class InvalidRule(ValueError):
    """A workspace redaction rule that cannot be saved; the message says why, for a person."""


def _has_nested_repeat(items: Any, inside_repeat: bool = False) -> bool:
    """Whether a parsed pattern repeats something that itself repeats unboundedly, as `(a+)+` or
    `(\\w*\\s?)*`: the shape of catastrophic backtracking, refused on save."""
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = arg
            unbounded = high == _sre_parser.MAXREPEAT or high > 100
            if unbounded and inside_repeat:
                return True
            if _has_nested_repeat(body, inside_repeat or (unbounded or high > 1)):
                return True
        elif name == "SUBPATTERN":
            if _has_nested_repeat(arg[-1], inside_repeat):
                return True
        elif name == "BRANCH":
            if any(_has_nested_repeat(branch, inside_repeat) for branch in arg[1]):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _has_nested_repeat(arg[1], inside_repeat):
                return True
        elif name == "GROUPREF_EXISTS":
            if any(b is not None and _has_nested_repeat(b, inside_repeat) for b in arg[1:]):
                return True
    return False


def check_pattern(pattern: Any) -> str:
    """The pattern if a workspace may use it; InvalidRule otherwise."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise InvalidRule("a value pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidRule(f"a value pattern is at most {MAX_PATTERN_LENGTH} characters")
    if "\x00" in pattern:
        raise InvalidRule("a value pattern cannot contain a NUL character")
    try:
        compiled = re.compile(pattern)
        parsed = _sre_parser.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise InvalidRule(f"{pattern!r} is not a valid regular expression: {exc}") from None
    if _has_nested_repeat(list(parsed)):
        raise InvalidRule(
            f"{pattern!r} repeats a repetition (like (a+)+), which can take exponential time; "
            "write it without the nested repeat"
        )
    if compiled.fullmatch("") is not None or parsed.getwidth()[0] == 0:
        raise InvalidRule(f"{pattern!r} matches the empty string, so it would redact between every character")
    return pattern


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip():
        raise InvalidRule("a key name must be a non-empty string")
    key = key.strip()
    if len(key) > MAX_KEY_NAME_LENGTH:
        raise InvalidRule(f"a key name is at most {MAX_KEY_NAME_LENGTH} characters")
    if "\x00" in key or not normalize_key(key):
        raise InvalidRule(f"{key!r} is not a key name")
    return key


def check_rules(keys: Any, patterns: Any) -> tuple[list[str], list[str]]:
    """The workspace's extra key names and value patterns as they will be stored (trimmed,
    de-duplicated, order kept), or InvalidRule naming the first that cannot be."""
    if not isinstance(keys, list) or not isinstance(patterns, list):
        raise InvalidRule("keys and patterns are lists")
    if len(keys) > MAX_EXTRA_KEYS:
        raise InvalidRule(f"at most {MAX_EXTRA_KEYS} extra key names")
    if len(patterns) > MAX_EXTRA_PATTERNS:
        raise InvalidRule(f"at most {MAX_EXTRA_PATTERNS} extra value patterns")
    checked_keys = list(dict.fromkeys(check_key(k) for k in keys))
    checked_patterns = list(dict.fromkeys(check_pattern(p) for p in patterns))
    return checked_keys, checked_patterns


# --- the redactor ---------------------------------------------------------------------------

# Values that redaction never changes.
_KEPT = frozenset({int, float, bool, type(None)})
# Verdicts remembered per Redactor: payloads repeat a few key names thousands of times.
_VERDICTS_KEPT = 4096


def _min_width(pattern: re.Pattern[str]) -> int:
    return int(_sre_parser.parse(pattern.pattern, pattern.flags).getwidth()[0])


class Redactor:
    def __init__(self, extra_keys: Iterable[str] = (), value_patterns: Iterable[str] = ()) -> None:
        self.extra_keys = frozenset(normalize_key(k) for k in extra_keys if isinstance(k, str))
        self.patterns: list[re.Pattern[str]] = []
        self.invalid_patterns: list[str] = []
        for p in value_patterns:
            try:
                self.patterns.append(re.compile(check_pattern(p)))
            except InvalidRule:
                # Saved before rules were checked (the settings page refuses these). An append
                # must not fail for it; the settings page shows it as not applied.
                self.invalid_patterns.append(str(p))
        self._extra_min = min((_min_width(p) for p in self.patterns), default=0)
        self._secret: dict[str, bool] = {}
        self._plain_keys: dict[str, bool] = {}  # exact-str BMP keys seen by `plain`: is_secret

    def is_secret(self, key: str) -> bool:
        verdict = self._secret.get(key)
        if verdict is None:
            if len(self._secret) >= _VERDICTS_KEPT:
                self._secret.clear()
            verdict = self._secret[key] = normalize_key(key) in self.extra_keys or is_builtin_secret_key(key)
        return verdict

    def scrub(self, text: str) -> str:
        """The string with every value rule's matches replaced.

        On the append path for every string of every payload, so each regex runs only on a string
        that holds what all its matches hold (a few memchr-speed `in` scans), and a string shorter
        than a rule's shortest match is not scanned for it: most strings are ruled out in ~0.1 µs.
        """
        # A multi-character `in` scans at ~1.5 ns a character, memchr for one character ~20x
        # faster: rare single characters ("/", "J", "R", "_") gate the longer scans.
        n = len(text)
        if n >= 7:  # `token=x`, the shortest built-in match
            if "=" in text or ":" in text:
                if "/" in text and "://" in text and "@" in text:
                    text = _URL_PASSWORD.sub(text)
                if "=" in text or ('"' in text and '":' in text) or ("'" in text and "':" in text):
                    text = _ASSIGNMENT.sub(text)
            if n >= 15:  # a JWT or a Slack token; every other rule's shortest match is longer
                if "-" in text:
                    if "sk-" in text:
                        text = _SK_KEY.sub(text)
                    if "xox" in text:
                        text = _SLACK.sub(text)
                    if "PRIVATE KEY" in text:
                        text = _PEM.sub(text)
                if "_" in text and ("gh" in text or "github_pat_" in text):
                    text = _GITHUB.sub(text)
                if "J" in text and "eyJ" in text:
                    text = _JWT.sub(text)
                if n >= 20 and "A" in text and "I" in text and ("AKIA" in text or "ASIA" in text):
                    text = _AWS_KEY_ID.sub(text)
                if n >= 23 and ("earer" in text or ("R" in text and "EARER" in text)):
                    text = _BEARER.sub(text)
        if self.patterns and len(text) >= self._extra_min:
            for pattern in self.patterns:
                text = pattern.sub(REDACTED, text)
        return text

    def __call__(self, value: Any) -> Any:
        cls = value.__class__
        if cls is str:
            return self.scrub(value)
        if cls in _KEPT:
            return value
        if isinstance(value, dict):
            is_secret, scrub, kept = self.is_secret, self.scrub, _KEPT
            if self.patterns:
                return {
                    k: REDACTED
                    if is_secret(k)
                    else scrub(v)
                    if v.__class__ is str
                    else v
                    if v.__class__ in kept
                    else self(v)
                    for k, v in value.items()
                }
            # Inlined from `scrub`: a string shorter than 15 characters with no "=" or ":" can
            # hold no built-in match, and most strings of a payload are such (ids, names, models).
            return {
                k: REDACTED
                if is_secret(k)
                else (v if len(v) < 15 and "=" not in v and ":" not in v else scrub(v))
                if v.__class__ is str
                else v
                if v.__class__ in kept
                else self(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            return self.scrub(value)
        return value

    def plain(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`self(payload)` in the same walk that shows the payload is plain, or NotPlain.

        Plain: made only of exact dict / list / str / int within ±(2**53 - 1) / bool / None, its
        keys strings inside the Basic Multilingual Plane, no secret-named key holding an object or
        an array, and no `usage` object holding a `costUsd`. For such a payload the append needs
        no other walk: orjson writes its RFC 8785 bytes (ledger.canonical's fast path, on the
        same conditions) and the vocabulary's recorded-cost rule has nothing to find (a
        secret-named key's value is replaced before that rule could look into it). Anything else
        raises NotPlain, and the append takes its three walks, which decide it as before.
        """
        if payload.__class__ is not dict:
            raise NotPlain
        return self._plain_dict(payload)

    def _plain_key(self, key: Any) -> bool:
        """Whether `key` names a secret; NotPlain unless it is an exact str inside the BMP."""
        if key.__class__ is not str or not (key.isascii() or max(key) <= "\uffff"):
            raise NotPlain
        verdict = self._plain_keys[key] = self.is_secret(key)
        if len(self._plain_keys) > _VERDICTS_KEPT:
            self._plain_keys.clear()
        return verdict

    def _plain_dict(self, value: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        verdicts, scrub, inline = self._plain_keys, self.scrub, not self.patterns
        for k, v in value.items():
            secret = verdicts.get(k)
            if secret is None or k.__class__ is not str:
                secret = self._plain_key(k)
            cls = v.__class__
            if secret:
                if cls is dict or cls is list:
                    raise NotPlain  # the recorded-cost rule reads the value redaction drops
                out[k] = REDACTED
            elif cls is str:
                # As `__call__`: without workspace patterns a string shorter than 15 characters
                # with no "=" or ":" holds no built-in match.
                out[k] = v if inline and len(v) < 15 and "=" not in v and ":" not in v else scrub(v)
            elif cls is int:
                if not -_INT_LIMIT <= v <= _INT_LIMIT:
                    raise NotPlain
                out[k] = v
            elif cls is dict:
                if k == "usage" and "costUsd" in v:
                    raise NotPlain
                out[k] = self._plain_dict(v)
            elif cls is list:
                out[k] = self._plain_list(v)
            elif v is None or cls is bool:
                out[k] = v
            else:
                raise NotPlain
        return out

    def _plain_list(self, value: list[Any]) -> list[Any]:
        out: list[Any] = []
        append = out.append
        for v in value:
            cls = v.__class__
            if cls is str:
                append(self.scrub(v))
            elif cls is int:
                if not -_INT_LIMIT <= v <= _INT_LIMIT:
                    raise NotPlain
                append(v)
            elif cls is dict:
                append(self._plain_dict(v))
            elif cls is list:
                append(self._plain_list(v))
            elif v is None or cls is bool:
                append(v)
            else:
                raise NotPlain
        return out


class NotPlain(Exception):
    """A payload outside `Redactor.plain`'s conditions: the append walks it the long way."""


# RFC 8785's integer range (ledger.canonical._INT_LIMIT).
_INT_LIMIT = 2**53 - 1


@functools.lru_cache(maxsize=256)
def _policy(keys: tuple[str, ...], patterns: tuple[str, ...]) -> Redactor:
    return Redactor(keys, patterns)


def policy(keys: Iterable[Any], patterns: Iterable[Any]) -> Redactor:
    """The shared Redactor of a rule set (a workspace's `redact_keys`, `redact_value_patterns`)."""
    return _policy(tuple(str(k) for k in keys), tuple(str(p) for p in patterns))


DEFAULT_REDACTOR = Redactor()
