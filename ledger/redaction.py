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
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any
from urllib.parse import unquote

import re2

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

# Every value pattern, built in or a workspace's, runs on RE2: time linear in the text whatever
# the pattern, no backtracking. RE2 refuses what it cannot do that way (lookaround, backreferences).
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False

Linear = Any  # a compiled RE2 pattern (google-re2 ships no type information)


def compile_linear(pattern: str) -> Linear:
    """`pattern` compiled by RE2; re2.error when RE2 cannot run it in linear time."""
    return re2.compile(pattern, _RE2_OPTIONS)


@dataclass(frozen=True)
class ValueRule:
    """A built-in value pattern. Group `secret` of a match is what is replaced (the rest of the
    match, a scheme or a setting name, is kept); `check`, when given, must accept that group for the
    match to count (RE2 has no lookahead to say it in the pattern). `Redactor.scrub` says which
    substrings a string must hold before the pattern is run on it at all."""

    name: str
    description: str
    pattern: str
    example: str  # a string the rule redacts (docs, the settings page and tests)
    secret: int = 0
    check: Callable[[str], bool] | None = None

    @functools.cached_property
    def regex(self) -> Linear:
        return compile_linear(self.pattern)

    def _replace(self, m: Any) -> str:
        g = self.secret
        if self.check is not None and not self.check(m.group(g)):
            return str(m.group(0))
        start, end = m.start(), m.end()
        return f"{m.string[start : m.start(g)]}{REDACTED}{m.string[m.end(g) : end]}"

    def sub(self, text: str) -> str:
        return str(self.regex.sub(self._replace, text))

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where the secrets this rule finds in `text` stand."""
        g, check = self.secret, self.check
        return [m.span(g) for m in self.regex.finditer(text) if check is None or check(m.group(g))]


def _has_digit(token: str) -> bool:
    return any(c.isdigit() for c in token)


def _not_only_letters(token: str) -> bool:
    return not token.rstrip("=").isalpha()


# Before a key that may be glued into an identifier (`wfver_AKIA…`, `my_sk-…`): the start of the
# text or anything but a letter or digit, where `\b` would need a non-word character.
_LEAD = r"(?:^|[^A-Za-z0-9])"

# Substring replacement: the match is replaced where it stands and the rest of the text is kept.
# A scheme or a key name in front of the secret (`Bearer `, `password=`) stays, to show what was there.
BUILTIN_VALUE_RULES: tuple[ValueRule, ...] = (
    ValueRule(
        "bearer",
        "an HTTP bearer credential: `Bearer ` and 16+ token characters, at least one not a letter",
        r"(?i)\b(bearer\s+)([A-Za-z0-9._~+/-]{16,}=*)",
        "Authorization: Bearer abc123def456ghi789",
        secret=2,
        check=_not_only_letters,
    ),
    ValueRule(
        "openai_anthropic_key",
        "an OpenAI or Anthropic style key, any case: `sk-` then 20+ key characters with a digit "
        "(`sk-proj-…`, `sk-ant-api03-…`), also glued to an identifier by `_`",
        _LEAD + r"((?i:sk-)[A-Za-z0-9_-]{20,})",
        "key sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
        secret=1,
        check=lambda key: _has_digit(key[3:]),
    ),
    ValueRule(
        "aws_access_key_id",
        "an AWS access key id: AKIA (long-term) or ASIA (temporary) and 16 of A-Z0-9, also glued to "
        "an identifier (`wfver_AKIA…`)",
        _LEAD + r"((?:AKIA|ASIA)[A-Z0-9]{16})",
        "AKIAIOSFODNN7EXAMPLE",
        secret=1,
    ),
    ValueRule(
        "jwt",
        "a JSON Web Token: three base64url segments, the first starting `eyJ`",
        r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
    ),
    ValueRule(
        "github_token",
        "a GitHub token: ghp_/gho_/ghu_/ghs_/ghr_ and 36+ characters, or github_pat_",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
        "ghp_" + "a1B2" * 9,
    ),
    ValueRule(
        "slack_token",
        "a Slack token: xoxa-/xoxb-/xoxp-/xoxo-/xoxs-/xoxr-/xoxe- and 10+ characters",
        r"\bxox[abposre]-[A-Za-z0-9-]{10,}",
        "xoxb-1234567890-abcdefghij",
    ),
    ValueRule(
        "private_key_pem",
        "a PEM private key block (RSA, EC, OPENSSH, PKCS#8, PGP…), to its END line or the "
        "end of the text when it was cut off",
        r"(?s)-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\z)",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    ),
    ValueRule(
        "url_password",
        "the password of credentials in a URL (`scheme://user:PASSWORD@host`)",
        r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/?#@:]+:)([^\s/?#@]+)@",
        "postgres://app:hunter2@db.internal:5432/app",
        secret=2,
    ),
    ValueRule(
        "secret_assignment",
        "a secret-named setting assigned in text: `password=…`, `api_key=…`, "
        "`access_token=…`, `OPENAI_API_KEY=…`, `aws_secret_access_key=…`, or a quoted JSON "
        '`"password": "…"` inside a string',
        r"(?i)(api[_-]?key|secret[_-]?access[_-]?key|client[_-]?secret|secret|password|passwd"
        r"|(?:access|refresh|id|auth|session)[_-]?token|token)(\s*=\s*|[\"']:\s*[\"'])([^\s\"'&,;<>]+)",
        "GET /cb?code=1&access_token=abc123&state=x",
        secret=3,
    ),
)
(_BEARER, _SK_KEY, _AWS_KEY_ID, _JWT, _GITHUB, _SLACK, _PEM, _URL_PASSWORD, _ASSIGNMENT) = BUILTIN_VALUE_RULES

# Characters that render as nothing, pasted inside a key to slip it past the rules (`sk-\u200b…`).
ZERO_WIDTH = "\u00ad\u180e\u200b\u200c\u200d\u2060\ufeff"
_ZERO_WIDTH_TABLE = dict.fromkeys(map(ord, ZERO_WIDTH))
_SURROGATES = re.compile("([\ud800-\udfff]+)")


# A `%XX` that `unquote` decodes; a text with a `%` and none of these (prose: "a 4% discount")
# comes out of `unquote` as it went in, and its split and join cost more than the rest of `scrub`.
_PERCENT_ESCAPE = re.compile("%[0-9A-Fa-f]{2}")


def normalized(text: str) -> str:
    """What the value rules also look at: `text` without zero-width characters and with `%XX`
    decoded once (`sk%2Dproj%2D…`)."""
    if not text.isascii():
        text = text.translate(_ZERO_WIDTH_TABLE)
    if "%" in text and _PERCENT_ESCAPE.search(text) is not None:
        text = unquote(text)
    return text


# --- workspace rules ------------------------------------------------------------------------

MAX_EXTRA_KEYS = 100
MAX_KEY_NAME_LENGTH = 200
MAX_EXTRA_PATTERNS = 50
MAX_PATTERN_LENGTH = 500
# RE2 does at most a constant times its program's size in work per byte of text; these bound it
# per pattern and per workspace (`\pL+\d{4}` is about 1,200, an e-mail pattern about 20).
MAX_PROGRAM_SIZE = 2000
MAX_TOTAL_PROGRAM_SIZE = 20_000
# Texts a pattern is tried on when saved: one that matches the empty string in any of them would
# redact between characters.
_EMPTY_PROBES = ("", "a", "a b", "ab\ncd", "A1_-. x", "é\u200b%")


class InvalidRule(ValueError):
    """A workspace redaction rule that cannot be saved; the message says why, for a person."""


def check_pattern(pattern: Any) -> str:
    """The pattern if a workspace may use it; InvalidRule otherwise. Only RE2 ever compiles it."""
    return _checked(pattern)[0]


def _checked(pattern: Any) -> tuple[str, Linear]:
    if not isinstance(pattern, str) or not pattern.strip():
        raise InvalidRule("a value pattern must be a non-empty string")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidRule(f"a value pattern is at most {MAX_PATTERN_LENGTH} characters")
    if "\x00" in pattern:
        raise InvalidRule("a value pattern cannot contain a NUL character")
    try:
        compiled = compile_linear(pattern)
    except re2.error as exc:
        why = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidRule(
            f"{pattern!r} cannot be used: {why}. Patterns run on RE2, in time linear in the text, "
            "so lookarounds ((?=…), (?!…), (?<=…), (?<!…)), backreferences (\\1) and possessive or "
            "atomic groups are not available"
        ) from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise InvalidRule(
            f"{pattern!r} is too complex: RE2 compiles it to {compiled.programsize} instructions, at most "
            f"{MAX_PROGRAM_SIZE} (a bounded repeat such as {{1,1000}} counts once per repetition)"
        )
    if any(m.start() == m.end() for probe in _EMPTY_PROBES for m in compiled.finditer(probe)):
        raise InvalidRule(f"{pattern!r} matches the empty string, so it would redact between every character")
    return pattern, compiled


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
    checked = {p: compiled for p, compiled in map(_checked, patterns)}
    total = sum(compiled.programsize for compiled in checked.values())
    if total > MAX_TOTAL_PROGRAM_SIZE:
        raise InvalidRule(
            f"the patterns together compile to {total} RE2 instructions, at most {MAX_TOTAL_PROGRAM_SIZE}: "
            "merge or simplify some"
        )
    return checked_keys, list(checked)


def _replace_nonempty(m: Any) -> str:
    # A stored pattern the save-time probes let through may still match empty somewhere: an empty
    # match replaces nothing.
    return REDACTED if m.end() > m.start() else ""


# --- the redactor ---------------------------------------------------------------------------

# Values that redaction never changes.
_KEPT = frozenset({int, float, bool, type(None)})
# Verdicts remembered per Redactor: payloads repeat a few key names thousands of times.
_VERDICTS_KEPT = 4096


class Redactor:
    def __init__(self, extra_keys: Iterable[str] = (), value_patterns: Iterable[str] = ()) -> None:
        self.extra_keys = frozenset(normalize_key(k) for k in extra_keys if isinstance(k, str))
        self.patterns: list[Linear] = []
        self.invalid_patterns: list[str] = []
        valid: list[str] = []
        for p in value_patterns:
            try:
                self.patterns.append(_checked(p)[1])
                valid.append(p)
            except InvalidRule:
                # Saved before rules were checked (the settings page refuses these). An append
                # must not fail for it; the settings page shows it as not applied.
                self.invalid_patterns.append(str(p))
        # One pass for all of them when they combine (each RE2 call converts the text to UTF-8
        # first); two patterns naming the same group do not, and then run one by one.
        self._extras: list[Linear] = list(self.patterns)
        if len(valid) > 1:
            try:
                self._extras = [compile_linear("|".join(f"(?:{p})" for p in valid))]
            except re2.error:
                pass
        self._secret: dict[str, bool] = {}
        self._plain_keys: dict[str, bool] = {}  # exact-str BMP keys seen by `plain`: is_secret
        self._changed_names: dict[str, bool] = {}  # `changes_name`'s verdicts

    def is_secret(self, key: str) -> bool:
        verdict = self._secret.get(key)
        if verdict is None:
            if len(self._secret) >= _VERDICTS_KEPT:
                self._secret.clear()
            verdict = self._secret[key] = normalize_key(key) in self.extra_keys or is_builtin_secret_key(key)
        return verdict

    def changes_name(self, name: str) -> bool:
        """Whether `scrub` would change `name`, a string that recurs (an event's type: a batch
        names a few types hundreds of times), remembered per name."""
        verdict = self._changed_names.get(name)
        if verdict is None:
            if len(self._changed_names) >= _VERDICTS_KEPT:
                self._changed_names.clear()
            verdict = self._changed_names[name] = self.scrub(name) != name
        return verdict

    def scrub(self, text: str) -> str:
        """The string with every value rule's matches replaced; when the string also holds a secret
        once normalised (zero-width characters dropped, `%XX` decoded), the normalised string with
        its secrets replaced."""
        out = self._scrub(text)
        if not text.isascii() or "%" in text:
            norm = normalized(out)
            if norm != out:
                scrubbed = self._scrub(norm)
                if scrubbed != norm:
                    return scrubbed
        return out

    def _rules_for(self, text: str) -> list[ValueRule]:
        """The built-in rules that may match in `text`: each regex runs only on a string that holds
        what all its matches hold (a few memchr-speed `in` scans), and a string shorter than a
        rule's shortest match is not scanned for it, so most strings are ruled out in ~0.1 µs."""
        # A multi-character `in` scans at ~1.5 ns a character, memchr for one character ~20x
        # faster: rare single characters ("/", "J", "R", "_") gate the longer scans.
        rules: list[ValueRule] = []
        n = len(text)
        if n >= 7:  # `token=x`, the shortest built-in match
            if "=" in text or ":" in text:
                if "/" in text and "://" in text and "@" in text:
                    rules.append(_URL_PASSWORD)
                if "=" in text or ('"' in text and '":' in text) or ("'" in text and "':" in text):
                    rules.append(_ASSIGNMENT)
            if n >= 15:  # a JWT or a Slack token; every other rule's shortest match is longer
                if "-" in text:
                    if "k-" in text or "K-" in text:
                        rules.append(_SK_KEY)
                    if "xox" in text:
                        rules.append(_SLACK)
                    if "PRIVATE KEY" in text:
                        rules.append(_PEM)
                if "_" in text and ("gh" in text or "github_pat_" in text):
                    rules.append(_GITHUB)
                if "J" in text and "eyJ" in text:
                    rules.append(_JWT)
                if n >= 20 and "A" in text and "I" in text and ("AKIA" in text or "ASIA" in text):
                    rules.append(_AWS_KEY_ID)
                if n >= 23 and ("earer" in text or ("R" in text and "EARER" in text)):
                    rules.append(_BEARER)
        return rules

    def _scrub(self, text: str) -> str:
        try:
            return self._scrub_utf8(text)
        except UnicodeEncodeError:
            # RE2 reads UTF-8, which a lone surrogate (`"\ud800"` in JSON) cannot be: the pieces
            # between them are scrubbed one by one (a surrogate ends a secret as a space would).
            pieces = _SURROGATES.split(text)
            return "".join(p if i % 2 else self._scrub_utf8(p) for i, p in enumerate(pieces))

    def _scrub_utf8(self, text: str) -> str:
        for rule in self._rules_for(text):
            text = rule.sub(text)
        for extras in self._extras:
            text = extras.sub(_replace_nonempty, text)
        return text

    def _spans(self, text: str) -> list[tuple[int, int]]:
        try:
            return self._spans_utf8(text)
        except UnicodeEncodeError:
            spans: list[tuple[int, int]] = []
            at = 0
            for i, piece in enumerate(_SURROGATES.split(text)):
                if not i % 2:
                    spans.extend((a + at, b + at) for a, b in self._spans_utf8(piece))
                at += len(piece)
            return spans

    def _spans_utf8(self, text: str) -> list[tuple[int, int]]:
        spans = [span for rule in self._rules_for(text) for span in rule.spans(text)]
        spans.extend(m.span() for extras in self._extras for m in extras.finditer(text) if m.end() > m.start())
        return spans

    def _across(self, items: list[Any]) -> list[Any]:
        """`items` (already scrubbed one by one) with the secrets split across neighbouring strings
        (a key streamed in pieces: `["sk-pr", "oj-…"]`) replaced piece by piece, each in its string."""
        out: list[Any] | None = None
        i, n = 0, len(items)
        while i < n:
            if items[i].__class__ is not str:
                i += 1
                continue
            j = i + 1
            while j < n and items[j].__class__ is str:
                j += 1
            if j - i >= 2:
                fixed = self._across_strings(items[i:j])
                if fixed is not None:
                    out = out if out is not None else list(items)
                    out[i:j] = fixed
            i = j
        return items if out is None else out

    def _across_strings(self, pieces: list[str]) -> list[str] | None:
        joined = "".join(pieces)
        if len(joined) < 15:
            return None
        ends = list(accumulate(len(p) for p in pieces))
        starts = [e - len(p) for e, p in zip(ends, pieces)]
        cuts: dict[int, list[tuple[int, int]]] = {}
        for a, b in self._spans(joined):
            for k, (start, end) in enumerate(zip(starts, ends)):
                if start < b and a < end and not (start <= a and b <= end):  # a piece of a split secret
                    cuts.setdefault(k, []).append((max(a, start) - start, min(b, end) - start))
        if not cuts:
            return None
        fixed = list(pieces)
        for k, ranges in cuts.items():
            piece, kept, at = pieces[k], [], 0
            for a, b in sorted(ranges):
                if b <= at:
                    continue
                kept.append(piece[at:a] if a > at else "")
                kept.append(REDACTED)
                at = max(at, b)
            kept.append(piece[at:])
            fixed[k] = "".join(kept)
        return fixed

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
            return self._across([self(v) for v in value])
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
        return self._across(out)


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


def of_workspace(workspace: Any) -> Redactor:
    """The policy of a workspace (its `redact_keys`, `redact_value_patterns`); the built-ins alone
    for None."""
    if workspace is None:
        return DEFAULT_REDACTOR
    return policy(workspace.redact_keys or [], workspace.redact_value_patterns or [])


def redact_text(text: str, workspace: Any = None) -> str:
    """What a person or a key wrote (a reason, a note, a comment, a name) as it may be stored:
    the value rules of the workspace's policy applied, as to every string of an event."""
    return of_workspace(workspace).scrub(text)
