"""Template filters over console/format.py: `{{ run.cost_usd|money }}`, `{{ run|elapsed }}`,
`{{ step|coverage }}`."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import template

from console import format as fmt

register = template.Library()


@register.filter
def money(value: Decimal | float | None) -> str:
    return fmt.money(value)


@register.filter
def elapsed(item: Any) -> str:
    return fmt.span(item)


@register.filter
def coverage(item: Any) -> str:
    return fmt.priced(item)
