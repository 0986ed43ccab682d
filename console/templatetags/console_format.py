"""Template filters over console/format.py: `{{ run.cost_usd|money }}`, `{{ run|elapsed }}`,
`{{ step|coverage }}`, `{{ at|timestamp }}` and `{% long_text text %}`."""

from __future__ import annotations

import html
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from django import template
from django.template.base import Node, Parser, Token
from django.template.context import Context
from django.template.exceptions import TemplateDoesNotExist
from django.template.loader import get_template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe

from console import format as fmt
from ledger import limits

register = template.Library()


@register.filter
def money(value: Decimal | float | None) -> str:
    return fmt.money(value)


@register.filter
def call_cost(value: Decimal | float | None, unpriced_reason: str | None) -> str:
    """`{{ c.costUsd|call_cost:c.unpricedReason }}`: a model call's cost, or why it has none."""
    return fmt.call_cost(value, unpriced_reason)


@register.filter
def relative_change(value: float | None) -> str:
    return fmt.relative_change(value)


@register.filter
def elapsed(item: Any) -> str:
    return fmt.span(item)


@register.filter
def coverage(item: Any) -> str:
    return fmt.priced(item)


@register.filter
def shown_name(value: Any) -> SafeString | str:
    """A name a tenant chose, or one a run's log carries (its label, workflow, step paths, tool and
    model names, call ids), with each control or invisible formatting character (a bidi override,
    a zero width; ledger.limits.hidden_characters) written out as its code point, so the name reads
    as it is stored. New tenant names cannot hold them; ones stored before they were refused, and
    what a harness writes into a log, can."""
    return _written_out(value, keep="")


@register.filter
def shown_text(value: Any) -> SafeString | str:
    """A line of a run's text (a timeline summary, an error's message) as `shown_name` writes a
    name, but for the tabs and line breaks, which the page shows as the spaces they are."""
    return _written_out(value, keep="\t\n\r")


@register.filter
def shown_data(value: Any) -> SafeString | str:
    """A payload's JSON or a long text in a `<pre>`, with each hidden character marked but kept:
    it stays in the page, so the text copied from it is the data as stored, inside a span whose
    stylesheet rule shows its code point (`U+202E`, generated content, which is not copied) and
    isolates it, so a bidi override or isolate cannot reorder what follows it. Tabs and line
    breaks are the layout of the `<pre>` and stay as they are."""
    return _written_out(value, keep="\t\n\r", in_place=True)


@register.filter
def shown_attr(value: Any) -> str:
    """A name or a line of text where a page can hold no markup but shows the text: an attribute
    a browser shows (`title=`, `aria-label=`, `placeholder=`, `hx-confirm=`), an `<option>`'s
    label, the page's `<title>`. Each hidden character is written out in brackets (`[U+202E]`)
    as plain text, which the template's own escaping then escapes as any text."""
    return fmt.written_plain(value)


@register.filter
def kept_value(value: Any) -> SafeString | str:
    """A value the page hands back or a script reads, exactly as stored: a form field's `value=`,
    an `id` a link's `#fragment` names, a `data-` attribute. Escaped, and each hidden character
    written as its character reference (`&#x202E;`), so the page's text holds none of them bare
    (an editor, a view-source or a copy of the HTML shows the reference) while the value the
    browser reads, and posts back, is the stored one."""
    text = "" if value is None else str(value)
    if not limits.hidden_characters(text):
        return text
    return mark_safe(fmt.character_references(str(conditional_escape(text))))  # escaped, then ASCII references


def _written_out(value: Any, *, keep: str, in_place: bool = False) -> SafeString | str:
    text = "" if value is None else str(value)
    hidden = limits.hidden_characters(text)
    if not hidden or all(chr(int(code[2:], 16)) in keep for code in hidden):
        return text
    parts = [
        (
            format_html('<span class="hidden-char" data-code="{}">{}</span>', f"U+{ord(ch):04X}", ch)
            if in_place
            else format_html('<span class="hidden-char">{}</span>', f"U+{ord(ch):04X}")
        )
        if ch not in keep and limits.hidden_characters(ch)
        else conditional_escape(ch)
        for ch in text
    ]
    return mark_safe("".join(parts))  # every part is escaped above


@register.filter
def milliseconds(value: float | None) -> str:
    """A recorded duration in milliseconds (a tool call's durationMs), in the one duration format."""
    return "—" if value is None else fmt.duration(value / 1000)


@register.filter
def timestamp(value: datetime | str | None, precision: str = "") -> SafeString | str:
    """A `<time>` in UTC (`|timestamp:"ms"` to the millisecond); local-time.js puts the reader's
    local time in its title."""
    if value is None or value == "":
        return "—"
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    return format_html(
        '<time datetime="{}">{}</time>', moment.isoformat(), fmt.utc(moment, milliseconds=precision == "ms")
    )


@register.simple_tag
def long_text(text: str) -> SafeString:
    """Text in a <pre>; a long one folded to its beginning with a "show all". Written out here
    (it was an inclusion tag: a template rendered in a context of its own per text, and the
    conversation draws several a turn). `dir="auto"`: a text in Arabic or Hebrew reads right to
    left, its punctuation where its writer put it, inside a left-to-right page."""
    preview = fmt.preview(text)
    if preview is None:
        return mark_safe(f'<pre class="text" dir="auto">{escaped(shown_data(text))}</pre>\n')  # escaped
    return mark_safe(  # every value in it escaped
        f'<div class="fold"><pre class="text preview" dir="auto">{escaped(shown_data(preview))}…</pre><details>'
        f'<summary>Show all {escaped(fmt.count(len(text)))} characters</summary><pre class="text" dir="auto">'
        f"{escaped(shown_data(text))}</pre></details></div>\n"
    )


def escaped(value: Any) -> str:
    """A value as `{{ value }}` writes it, for the rows drawn in Python (console/rows.py,
    console/pages/waterfall.py): escaped unless already safe HTML; `conditional_escape` without
    its lazy-string wrapper, which cost a fifth of a timeline row."""
    return str(value.__html__()) if hasattr(value, "__html__") else html.escape(str(value))


@register.filter
def words(value: str) -> str:
    """A status as words: "in_doubt" reads "in doubt"."""
    return str(value).replace("_", " ")


@register.filter
def count(value: int | None) -> str:
    """Tokens, events, calls: thousands separated."""
    return fmt.count(value)


@register.filter
def byte_size(value: int | None) -> str:
    return fmt.byte_size(value)


@register.filter
def status_label(value: str) -> str:
    return fmt.status_label(value)


@register.filter
def field_label(value: str) -> str:
    return fmt.field_label(value)


@register.filter
def field_labels(values: list[str]) -> str:
    """Field names as words, comma-separated."""
    return ", ".join(fmt.field_label(v) for v in values)


@register.filter
def indent(depth: int) -> int:
    """A nested row's indentation step (console.css has four)."""
    return min(int(depth), 4)


class _OptionalInclude(Node):
    def __init__(self, name: str) -> None:
        self.name = name

    def render(self, context: Context) -> str:
        try:
            included = get_template(self.name)
        except TemplateDoesNotExist:
            return ""
        return included.render(cast(dict[str, Any], context.flatten()))


@register.tag
def optional_include(parser: Parser, token: Token) -> Node:
    """`{% optional_include "path.html" %}`: the template with the current context, or nothing
    while it does not exist (an include point for a part another change provides)."""
    bits = token.split_contents()
    if len(bits) != 2 or bits[1][0] not in "'\"" or bits[1][0] != bits[1][-1]:
        raise template.TemplateSyntaxError("optional_include takes one quoted template name")
    return _OptionalInclude(bits[1][1:-1])
