"""The usage report: tokens, cache hits and dollars per step (Little Workflow's `report`)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from ..canonical import ecma_number
from ..fold import RunState
from ..fold.pricing import UsageTotals

UNATTRIBUTED = "(unattributed)"
_COLUMNS = ("STEP", "IN", "CACHED", "CACHE%", "OUT", "CALLS", "COST (USD)")

# ICU root collation order of printable ASCII, which is what JavaScript's localeCompare uses
# and so what orders Little Workflow's report rows and manifest diff paths: whitespace, then
# punctuation and symbols in this order, then digits, then letters (case ignored at first).
_ICU_ASCII = "\t\n\v\f\r _-,;:!?.'\"()[]{}@*/\\&#%`^+<=>|~$0123456789abcdefghijklmnopqrstuvwxyz"
_RANK = {char: rank for rank, char in enumerate(_ICU_ASCII)}


def locale_sort_key(text: str) -> tuple[tuple[int, ...], tuple[bool, ...], str]:
    """Sort key that orders strings as `a.localeCompare(b)` does in Node (root locale).

    Exact for ASCII; other characters sort after ASCII letters by code point, an
    approximation of the full collation table.
    """
    primary = tuple(_RANK.get(char.lower(), len(_RANK) + ord(char.lower())) for char in text)
    # Lower case before upper case when the letters alone tie ("a" < "A" < "b").
    tertiary = tuple(char.isupper() for char in text)
    return primary, tertiary, text


def usage_report(state: RunState) -> dict[str, Any]:
    steps = sorted(state.steps.values(), key=lambda step: locale_sort_key(step.step_path))
    attributed = UsageTotals()
    for step in steps:
        attributed = attributed.merge(step.usage)
    report: dict[str, Any] = {
        "runId": state.run_id,
        "status": state.status,
        "steps": [_row(step.step_path, step.status, step.usage) for step in steps],
    }
    residual = _residual(state.usage, attributed)
    if residual is not None:
        report["unattributed"] = _row(UNATTRIBUTED, state.status, residual)
    report["total"] = _row("TOTAL", state.status, state.usage)
    report["hasUnpricedCalls"] = state.usage.unpriced_calls > 0
    # Of the unpriced calls, those whose usage gave no token count (never under Little Workflow's
    # rules, so its table stays its own): their cost is unknown whatever the price table says.
    report["usageNotReportedCalls"] = sum(1 for entry in state.cost_entries if not entry.usage_reported)
    return report


def _row(step_path: str, status: str, usage: UsageTotals) -> dict[str, Any]:
    return {
        "stepPath": step_path,
        "status": status,
        "inputTokens": usage.input_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "outputTokens": usage.output_tokens,
        "reasoningTokens": usage.reasoning_tokens,
        "cacheHitShare": usage.cached_input_tokens / usage.input_tokens if usage.input_tokens else 0.0,
        "costUsd": None if usage.cost_usd is None else float(usage.cost_usd),
        "pricedCalls": usage.priced_calls,
        "unpricedCalls": usage.unpriced_calls,
        "calls": usage.calls,
    }


def _residual(total: UsageTotals, attributed: UsageTotals) -> UsageTotals | None:
    """The model calls recorded without a stepPath, so the rows always add up to the total."""
    priced = total.priced_calls - attributed.priced_calls
    unpriced = total.unpriced_calls - attributed.unpriced_calls
    if priced <= 0 and unpriced <= 0:
        return None
    cost: Decimal | None
    if priced == 0:
        cost = None if unpriced else Decimal(0)
    else:
        cost = (total.cost_usd or Decimal(0)) - (attributed.cost_usd or Decimal(0))
    return UsageTotals(
        input_tokens=total.input_tokens - attributed.input_tokens,
        output_tokens=total.output_tokens - attributed.output_tokens,
        cached_input_tokens=total.cached_input_tokens - attributed.cached_input_tokens,
        reasoning_tokens=total.reasoning_tokens - attributed.reasoning_tokens,
        cost_usd=cost,
        priced_calls=priced,
        unpriced_calls=unpriced,
    )


def render_report_table(report: dict[str, Any]) -> str:
    """The fixed-width table of `ledger report --table`, character for character Little Workflow's."""
    rows = list(report["steps"])
    if "unattributed" in report:
        rows.append(report["unattributed"])
    body = [_cells(row) for row in [*rows, report["total"]]]
    widths = [max(len(line[column]) for line in [_COLUMNS, *body]) for column in range(len(_COLUMNS))]
    rule = "  ".join("-" * width for width in widths)

    def line(cells: tuple[str, ...]) -> str:
        padded = [cell.ljust(widths[0]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(cells)]
        return "  ".join(padded).rstrip()

    out = [f"Run {report['runId']} ({report['status']})", "", line(_COLUMNS), rule]
    out.extend(line(cells) for cells in body[:-1])
    if len(body) > 1:
        out.append(rule)
    out.append(line(body[-1]))
    not_reported = report.get("usageNotReportedCalls", 0)
    unpriced = report["total"]["unpricedCalls"] - not_reported
    if unpriced > 0 or not_reported > 0:
        out.append("")
    if unpriced > 0:
        out.append(f"Note: {unpriced} model call(s) had no registry pricing and are excluded from the cost above.")
    if not_reported > 0:
        out.append(f"Note: {not_reported} model call(s) reported no usage and are excluded from the cost above.")
    out.append("")
    return "\n".join(out)


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    calls = str(row["pricedCalls"])
    if row["unpricedCalls"]:
        calls += f"+{row['unpricedCalls']}?"
    return (
        row["stepPath"],
        _number(row["inputTokens"]),
        _number(row["cachedInputTokens"]),
        f"{_to_fixed(row['cacheHitShare'] * 100, 1)}%",
        _number(row["outputTokens"]),
        calls,
        _cost(row["costUsd"]),
    )


def _number(value: int | float) -> str:
    """JavaScript's String(n): a token count Little Workflow recorded as 1000.5 prints so."""
    return str(value) if isinstance(value, int) else ecma_number(value)


def _to_fixed(value: float, places: int) -> str:
    # JavaScript's toFixed rounds the exact binary value half up; Python's format rounds half
    # to even, which differs on exact ties.
    return str(Decimal(value).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def _cost(cost: float | None) -> str:
    if cost is None:
        return "n/a"
    rendered = _to_fixed(cost, 6)
    # Real money below half a micro-dollar must not read like a step that spent nothing.
    return "<0.000001" if cost > 0 and Decimal(rendered) == 0 else rendered
