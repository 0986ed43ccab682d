"""Input limits every transport applies alike (docs/security.md "Input limits").

- **Nesting depth.** JSON nested deeper than MAX_JSON_DEPTH arrays and objects is refused before it
  is parsed: the parsers, the payload validation, redaction and canonical JSON all walk documents
  recursively, and a body of a few kilobytes can nest a thousand levels. The deepest payload of the
  interop vectors and the demo is far below the limit.
- **NUL characters.** PostgreSQL cannot store U+0000 in text or jsonb; SQLite can. A NUL anywhere
  in what would be stored or queried is refused on both, so the two backends answer alike.
- **Calendar edges.** Dates outside FIRST_DAY..LAST_DAY are refused: ranges add and subtract days
  and would leave the calendar (`date(9999, 12, 31) + 1 day` raises).
- **Events per run.** A run holds at most `max_events_per_run(workspace)` events and
  `max_bytes_per_run(workspace)` bytes of payload; its ending (RunCompleted, RunFailed) is accepted
  past them, so a run at the limit can still finish. Each size limit is the deployment's setting
  unless the operator overrode it for the workspace (`SIZE_LIMITS`, `ledger limits`).
- **Duplicate keys.** A JSON object naming a key twice is refused (`DuplicateKey`): parsers keep
  the last one, or the first, so a proxy or validator that read the body another way would have
  approved another document than the one stored.
- **Keyset positions.** A cursor decodes to a (time, row id) only if both are in range.
- **What a person writes.** A reason, a note or a comment (kept in the audit log, shown on pages)
  is at most MAX_TEXT characters after trimming, and present where it is required: `written`,
  called by the services, so every transport refuses alike and only shows the domain's message.
  It comes back redacted by the workspace's policy, so a pasted secret is never stored.
- **Names a tenant chooses** (an API key's, a price override's model, a redaction key name) hold
  no control or invisible formatting character: a bidi override such as U+202E would make a name
  read otherwise than it is written on every page that shows it (`hidden_characters`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from array import array
from dataclasses import dataclass
from datetime import UTC, date, datetime
from itertools import accumulate
from typing import Any

import orjson
from django.conf import settings

from .errors import InvalidRequest, LedgerError
from .redaction import redact_text

MAX_JSON_DEPTH = 64
FIRST_DAY = date(1900, 1, 1)
LAST_DAY = date(9998, 12, 31)
MAX_ROW_ID = 2**63 - 1  # a bigint primary key

NUL = "\x00"
MAX_TEXT = 2000
DEFAULT_MAX_EVENTS_PER_RUN = 50_000
DEFAULT_MAX_BYTES_PER_RUN = 256 * 1024 * 1024
DEFAULT_MAX_EVENTS_PER_MINUTE_PER_KEY = 30_000


@dataclass(frozen=True)
class SizeLimit:
    """One of the size limits a workspace may have overridden by the operator (`ledger limits`):
    its Workspace column (NULL: the setting), the setting that is the deployment's default, the
    built-in default when the setting is absent, and the range an override must lie in (the
    setting's own, console/settings.py)."""

    name: str  # the Workspace column, and the key of `effective` and of the audit entry
    setting: str
    default: int
    low: int
    high: int
    label: str  # as the Settings page and `ledger limits` show it
    unit: str

    def deployment_default(self) -> int:
        return int(getattr(settings, self.setting, self.default))

    def of(self, workspace: Any = None) -> int:
        """The limit in force in `workspace` (None: the deployment's default). The override is a
        column of the workspace row the caller already holds: no query."""
        override = getattr(workspace, self.name, None) if workspace is not None else None
        return int(override) if override is not None else self.deployment_default()


EVENTS_PER_RUN = SizeLimit(
    "max_events_per_run", "LEDGER_MAX_EVENTS_PER_RUN", DEFAULT_MAX_EVENTS_PER_RUN, 1, 10_000_000,
    "Events per run", "events",
)  # fmt: skip
BYTES_PER_RUN = SizeLimit(
    "max_bytes_per_run", "LEDGER_MAX_BYTES_PER_RUN", DEFAULT_MAX_BYTES_PER_RUN, 1024, 2**50,
    "Bytes of event payload per run", "bytes",
)  # fmt: skip
EVENTS_PER_MINUTE_PER_KEY = SizeLimit(
    "max_events_per_minute_per_key", "LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY", DEFAULT_MAX_EVENTS_PER_MINUTE_PER_KEY,
    1, 10_000_000, "Events per minute per API key", "events",
)  # fmt: skip
SIZE_LIMITS = (EVENTS_PER_RUN, BYTES_PER_RUN, EVENTS_PER_MINUTE_PER_KEY)


def max_events_per_run(workspace: Any = None) -> int:
    """How many events one run may hold (LEDGER_MAX_EVENTS_PER_RUN, or the workspace's override):
    a run of a few hundred thousand events makes every view of it, the shared page and the
    evidence heavy for everyone."""
    return EVENTS_PER_RUN.of(workspace)


def max_bytes_per_run(workspace: Any = None) -> int:
    """How many bytes of stored canonical payload one run may hold (LEDGER_MAX_BYTES_PER_RUN, or
    the workspace's override): the events limit alone lets a run of 50,000 events of 256 kB each
    hold 12 GB."""
    return BYTES_PER_RUN.of(workspace)


def max_events_per_minute_per_key(workspace: Any = None) -> int:
    """How many events one API key of `workspace` may append per clock minute
    (LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY, or the workspace's override)."""
    return EVENTS_PER_MINUTE_PER_KEY.of(workspace)


def effective(workspace: Any) -> list[dict[str, Any]]:
    """Every size limit in force in `workspace`: its name, label, unit, value, the deployment's
    default and whether the operator overrode it here (what the Settings page and `ledger limits`
    show)."""
    return [
        {
            "name": limit.name,
            "label": limit.label,
            "unit": limit.unit,
            "value": limit.of(workspace),
            "default": limit.deployment_default(),
            "overridden": getattr(workspace, limit.name, None) is not None,
        }
        for limit in SIZE_LIMITS
    ]


# A JSON string, escapes included (the unrolled form: no backtracking on long strings).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPENERS = b"[{"
# Brackets as +1 / -1, every other byte dropped.
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class TooDeep(ValueError):
    def __init__(self, limit: int = MAX_JSON_DEPTH) -> None:
        super().__init__(f"JSON is nested more than {limit} levels deep")
        self.limit = limit


def json_depth_exceeds(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests arrays and objects more than `limit` deep, without parsing it.

    Brackets inside strings do not count. Malformed text gets an answer too (the parser refuses it
    afterwards); a string left open counts the brackets after its quote, erring towards "too deep".
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:  # the common case: nothing to scan
        return False
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    steps = array("b", brackets.translate(_BRACKETS))
    return max(accumulate(steps), default=0) > limit


class DuplicateKey(ValueError):
    """A JSON object that names `key` twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {json.dumps(key)} appears twice in one object")
        self.key = key


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's `object_pairs_hook`: the object, or DuplicateKey for a key it names twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return value


_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


def may_repeat_a_key(body: bytes, value: Any) -> bool:
    """Whether the UTF-8 JSON `body`, parsed to `value` by a parser that keeps one value of a
    repeated key, may have named a key twice; False means it did not. Cheaper than a hook on every
    object: an encode and two counts, less than half of what orjson takes to parse the body.

    Outside strings, a colon follows each key, and strings keep theirs when `value` is encoded
    again: unless a colon was written as an escape (\\u003a), the body holds as many colons as the
    encoded value only if every key it names is still there. When this says True, parse again
    with `unique_object`."""
    if b"\\" in body and _ESCAPED_COLON.search(body):  # a byte search first: most bodies escape nothing
        return True
    try:
        again = orjson.dumps(value)
    except orjson.JSONEncodeError:  # what only the stdlib reads (a lone surrogate, an integer past 64 bits)
        return True
    return body.count(b":") != again.count(b":")


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, refusing (TooDeep) a document nested deeper than `limit` before parsing it, and
    (DuplicateKey) an object that names a key twice."""
    if json_depth_exceeds(text, limit):
        raise TooDeep(limit)
    return json.loads(text, object_pairs_hook=unique_object)


def nul_path(value: Any) -> list[str | int] | None:
    """The path to the first string (or object key) holding a NUL character, or None.

    Iterative, so any depth the parser produced is walked."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and NUL in key:
                    return [*path, key]
                stack.append(([*path, key], child))
        elif isinstance(item, (list, tuple)):
            stack.extend(([*path, i], child) for i, child in enumerate(item))
    return None


def written(
    value: Any,
    *,
    field: str,
    label: str,
    required: bool = True,
    limit: int = MAX_TEXT,
    error: type[LedgerError] = InvalidRequest,
    workspace: Any = None,
) -> str:
    """A person's free text (a reason, a note, a comment), trimmed and redacted by the
    workspace's policy (the built-ins without one), as it may be stored; `error` (naming `field`)
    when it is required and empty, not text, or over `limit` characters (counted as written)."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise error(f"the {label} must be text", field=field)
    text = value.strip()
    if required and not text:
        raise error(f"say why: the {label} is required", field=field)
    if len(text) > limit:
        raise error(f"the {label} is at most {limit} characters", field=field, limit=limit)
    return redact_text(text, workspace)


# Controls (C0, C1), format characters (bidi embeddings, overrides and isolates, zero widths, the
# byte order mark, soft hyphens), line and paragraph separators, surrogates and private use.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})


# Of ASCII, only the C0 controls and DEL are in those categories: an ASCII text (most names and
# payloads) is searched by one regular expression instead of a category lookup per character.
_ASCII_HIDDEN = re.compile(r"[\x00-\x1f\x7f]")


def hidden_characters(text: str) -> list[str]:
    """The characters of `text` that a page shows as nothing or that reorder what follows them,
    as code points ("U+202E"), each once, in order; empty for a name that reads as written."""
    if text.isascii():
        return [f"U+{ord(ch):04X}" for ch in dict.fromkeys(_ASCII_HIDDEN.findall(text))]
    found = (ch for ch in text if unicodedata.category(ch) in _HIDDEN_CATEGORIES)
    return [f"U+{ord(ch):04X}" for ch in dict.fromkeys(found)]


def plain_name(value: str, *, field: str, label: str, error: type[LedgerError] = InvalidRequest) -> str:
    """`value` when it holds no hidden character; else `error` naming `field` and the characters."""
    hidden = hidden_characters(value)
    if hidden:
        raise error(
            f"a {label} cannot hold control or invisible formatting characters ({', '.join(hidden[:5])})",
            field=field,
            characters=hidden,
        )
    return value


def has_nul(value: Any) -> bool:
    return nul_path(value) is not None


def day_in_range(day: date) -> bool:
    return FIRST_DAY <= day <= LAST_DAY


def keyset_position(value: Any) -> tuple[datetime, int]:
    """A decoded `{"t": ISO time, "id": row id}` cursor as (aware time, id); ValueError when it is
    not one we could have given out (wrong types, NaN, an id past bigint, a time off the calendar)."""
    if not isinstance(value, dict):
        raise ValueError("not an object")
    moment, row = value.get("t"), value.get("id")
    if not isinstance(moment, str) or len(moment) > 40 or isinstance(row, bool) or not isinstance(row, int):
        raise ValueError("wrong types")
    if not 0 <= row <= MAX_ROW_ID:
        raise ValueError("id out of range")
    parsed = datetime.fromisoformat(moment)
    if parsed.tzinfo is None or not day_in_range(parsed.date()):
        raise ValueError("time out of range")
    return parsed.astimezone(UTC), row


def row_id(value: Any) -> int:
    """A cursor's row id: an int (not a bool) within a bigint; ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ROW_ID:
        raise ValueError("not a row id")
    return value
