"""How the console shows money, priced coverage, durations, counts (tokens) and byte sizes: one
format each, for every page (docs/operations.md "Words and numbers").

The runs list, the run page, the usage report and the live rows all use these (in Python, or as
the template filters of console/templatetags/console_format.py), so the same run reads the same
everywhere.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from ledger import clock, limits
from ledger.fold.pricing import UNPRICED_WORDS
from ledger.models import UsageColumns

SIGNIFICANT = 4  # digits shown of an amount under a dollar: per-call costs are fractions of a cent
SMALLEST_PLACE = -6  # a millionth of a dollar: below it, "<$0.000001"
SMALLEST = Decimal(1).scaleb(SMALLEST_PLACE)


def money(value: Decimal | float | None) -> str:
    """Dollars for people. NULL (every call unpriced) is "n/a", never $0; $1 and more to the cent;
    less to four significant digits but at least to the cent, so a per-call cost keeps its size
    ($0.000027) and half a dollar reads $0.50."""
    if value is None:
        return "n/a"
    amount = Decimal(value)
    if amount == 0:
        return "$0"
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    if abs(amount) < SMALLEST:
        return f"<${SMALLEST}"
    exponent = amount.adjusted() - SIGNIFICANT + 1  # the place of the last significant digit
    rounded = amount.quantize(Decimal(1).scaleb(max(exponent, SMALLEST_PLACE)), ROUND_HALF_UP)
    text = f"{rounded:f}".rstrip("0")
    whole, _, cents = text.partition(".")
    text = f"{whole}.{cents:0<2}"  # at least to the cent: "$0.50" beside "$5.00", never "$0.5"
    return f"${text}" if amount > 0 else f"-${text.lstrip('-')}"


def call_cost(value: Decimal | float | None, unpriced_reason: str | None) -> str:
    """One model call's dollars: `money`, and for an unpriced call why, "n/a (no price)" or "n/a
    (usage not reported)" (the provider gave no token count: its cost is unknown, never $0)."""
    if value is not None or unpriced_reason not in UNPRICED_WORDS:
        return money(value)
    return f"n/a ({UNPRICED_WORDS[unpriced_reason]})"


def count(value: int | None) -> str:
    """A whole number for people (tokens, events, calls): thousands separated, "113,776"."""
    return "—" if value is None else f"{int(value):,}"


BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_size(value: int | None) -> str:
    """A size in bytes for people, in binary units (as the limits are set: 256 MiB) to one decimal:
    "512 B", "4.2 KiB", "424.7 KiB", "1.1 MiB"; the exact count goes in a title where it matters."""
    if value is None:
        return "—"
    size = float(value)
    unit = 0
    while size >= 1023.95 and unit < len(BYTE_UNITS) - 1:  # 1023.96 KiB would read "1024.0 KiB"
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{size:,.1f} {BYTE_UNITS[unit]}"


STATUS_LABELS = {
    "pending": "pending",
    "running": "running",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "pending_approval": "waiting for approval",
    "in_doubt": "in doubt",
    "shouldrun": "should run",
}


def written_plain(value: Any) -> str:
    """`value` as text with each hidden character (a bidi control, a zero width:
    ledger.limits.hidden_characters) written out in brackets, `[U+202E]`: for a place that holds
    text alone (an attribute a browser shows, an `<option>`, a `<title>`, an SVG `<title>`), where
    the console's marked span (console_format.shown_name) cannot go. Tabs and line breaks stay (a
    tooltip shows them as the breaks they are). Not escaped: the template or format_html that
    places it escapes it."""
    text = "" if value is None else str(value)
    if not limits.hidden_characters(text):
        return text
    return "".join(f"[U+{ord(ch):04X}]" if ch not in "\t\n\r" and limits.hidden_characters(ch) else ch for ch in text)


def character_references(escaped: str) -> str:
    """HTML already escaped with each hidden character as its character reference (`&#x202E;`):
    for a value a page hands back or a script reads (console_format.kept_value), which the
    browser then holds exactly as stored while the page's text holds none of them bare."""
    if not limits.hidden_characters(escaped):
        return escaped
    return "".join(f"&#x{ord(ch):X};" if limits.hidden_characters(ch) else ch for ch in escaped)


def status_label(value: str) -> str:
    """A status or state as words ("pending_approval" reads "waiting for approval")."""
    text = str(value)
    return STATUS_LABELS.get(text.lower(), text.replace("_", " "))


def field_label(value: str) -> str:
    """An API field's name as words, for the pages that list which fields changed
    ("modelOutputs" reads "model outputs", "output_ref" reads "output ref")."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", str(value)).replace("_", " ").lower()


def relative_change(value: float | None) -> str:
    """A relative change (after / before − 1) as a person reads one: "+519 % (×6.19)", "−6.6 %",
    "no change"; "n/a" when there is none to give (nothing before)."""
    if value is None:
        return "n/a"
    percent = 100 * value
    if round(percent, 1) == 0:
        return "no change"
    sign = "+" if percent > 0 else "−"
    digits = f"{abs(percent):,.0f}" if abs(percent) >= 100 else f"{abs(percent):.1f}"
    factor = f" (×{1 + value:,.2f})" if value >= 1 else ""
    return f"{sign}{digits} %{factor}"


def coverage(priced: int, unpriced: int) -> str:
    """Priced coverage: priced calls of all calls (docs/design.md §4)."""
    total = priced + unpriced
    if total == 0:
        return "no model calls"
    return f"{priced:,}/{total:,} priced ({round(100 * priced / total)}%)"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{int(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def elapsed(start: datetime | None, end: datetime | None, *, now: datetime | None = None) -> str:
    """From start to end; without an end, the time so far, marked "…". "—" before a start."""
    if start is None:
        return "—"
    text = duration(max(((end or now or clock.now()) - start).total_seconds(), 0.0))
    return text if end is not None else f"{text}…"


def span(item: Any) -> str:
    """`elapsed` of anything with `started_at` and `finished_at` (a run, a step, a subtree)."""
    return elapsed(item.started_at, item.finished_at)


def priced(item: Any) -> str:
    """`coverage` of anything with `priced_calls` and `unpriced_calls` (a run, a step, usage)."""
    return coverage(item.priced_calls, item.unpriced_calls)


LONG_CHARS = 1500  # a text longer than this (or of more lines) is folded behind "show all"
LONG_LINES = 20
PREVIEW_LINES = 6
PREVIEW_CHARS = 500


def preview(text: str) -> str | None:
    """The beginning shown of a long text (a prompt, a tool result); None when it is short enough
    to show whole."""
    lines = text.splitlines()
    if len(text) <= LONG_CHARS and len(lines) <= LONG_LINES:
        return None
    return "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS]


def utc(value: datetime | str | None, *, milliseconds: bool = False) -> str:
    """A moment as the console writes it everywhere: UTC to the second ("2026-11-30 17:20:13 UTC"),
    or to the millisecond where events a few ms apart must read apart (the timeline); the browser
    adds the reader's local time on hover (static/js/local-time.js)."""
    if value is None or value == "":
        return "—"
    moment = (datetime.fromisoformat(value) if isinstance(value, str) else value).astimezone(UTC)
    if milliseconds:
        return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def tokens(row: UsageColumns) -> dict[str, int]:
    """A row's four token counts, as the usage columns hold them."""
    return {
        "input": row.input_tokens,
        "output": row.output_tokens,
        "cached": row.cached_input_tokens,
        "reasoning": row.reasoning_tokens,
    }
