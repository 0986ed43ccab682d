"""The usage report: cost by model per day, week or month (ledger.reads.usage.granularity_for the range, or
the reader's choice) as a server-rendered SVG chart, the tables behind it (ledger.reads.usage, the same rows
as the API and its CSV), and drill-downs to the runs list."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.utils import timezone
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_safe

from ledger.limits import FIRST_DAY
from ledger.models import Workspace
from ledger.reads import selectors, usage
from ledger.reads.usage import (
    DAILY_UP_TO,
    WEEKLY_UP_TO,
    PeriodModelCost,
    UsageRow,
    granularity_for,
    periods,
    usage_rows,
)

from ..format import money, written_plain
from ..templatetags.console_format import kept_value, shown_name
from .filters import day_field
from .guard import member_access, switcher
from .runs import runs_url

DEFAULT_DAYS = 30
MAX_DAYS = 366


GRANULARITY_CHOICES = [("", "auto"), ("day", "day"), ("week", "week"), ("month", "month")]
# What the page calls a period of each granularity, in the chart's label and the table's caption.
_PERIOD_WORDS = {
    "day": ("Daily", "day", "Day (UTC)"),
    "week": ("Weekly", "week", "Week (UTC, from Monday)"),
    "month": ("Monthly", "month", "Month (UTC)"),
}


class UsageForm(forms.Form):
    scope = forms.ChoiceField(
        required=False, choices=[("", "workspace"), ("workspace", "workspace"), ("tenant", "tenant")]
    )
    by = forms.ChoiceField(required=False, choices=GRANULARITY_CHOICES, label="By")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, label in (("from", "From"), ("to", "To")):
            self.fields[name] = day_field(label)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if self.errors:
            return data
        end = data.get("to") or timezone.now().date()
        start = data.get("from") or max(end - timedelta(days=DEFAULT_DAYS - 1), FIRST_DAY)
        if start > end:
            self.add_error("from", "From must not be after To.")
        elif (end - start).days + 1 > MAX_DAYS:
            self.add_error("from", f"Choose at most {MAX_DAYS} days.")
        data["from"], data["to"], data["scope"] = start, end, data.get("scope") or "workspace"
        if start <= end:
            data["granularity"] = data.get("by") or granularity_for(start, end)
        return data


# --- the table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TableRow:
    key: str
    href: str | None
    usage: UsageRow

    @property
    def calls(self) -> int:
        return self.usage.priced_calls + self.usage.unpriced_calls

    @property
    def calls_label(self) -> str:
        return f"{self.calls:,} model call{'s' if self.calls != 1 else ''}"

    @property
    def coverage(self) -> str:
        if not self.calls:
            return "—"
        return f"{100 * self.usage.priced_calls / self.calls:.0f}%"

    @property
    def tokens(self) -> list[str]:
        u = self.usage
        return [f"{n:,}" for n in (u.input_tokens, u.cached_input_tokens, u.output_tokens, u.reasoning_tokens)]

    @property
    def html(self) -> SafeString:
        """The row's markup in the table (console/usage/table.html), written here: a year by day is
        hundreds of rows, and the template engine's cost per row was most of the page's."""
        # The key (a model or an API key's name: what a harness or a member wrote) as the console
        # shows any such name: its hidden characters written out, kept exact in data-key.
        key, u = conditional_escape(shown_name(self.key)), self.usage
        head = f'<a class="drill" href="{html.escape(self.href)}">{key}</a>' if self.href else key
        tokens = "".join(f'<td class="num">{n}</td>' for n in self.tokens)
        return mark_safe(
            f'\n  <tr data-key="{conditional_escape(kept_value(self.key))}">\n    <th scope="row" class="mono">{head}</th>\n    {tokens}\n'
            f'    <td class="num cost{" na" if u.cost_usd is None else ""}">{html.escape(money(u.cost_usd))}</td>\n'
            f'    <td class="num">{u.priced_calls:,}</td><td class="num">{u.unpriced_calls:,}</td>'
            f'<td class="num">{self.coverage}</td>\n  </tr>\n  '
        )


# --- the chart -----------------------------------------------------------------------------

# Colour and a pattern per series, so two series differ without colour too (print, colour blindness).
_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#b07aa1",
    "#76b7b2",
    "#edc948",
    "#9c755f",
    "#ff9da7",
    "#8cd17d",
)
_PATTERNS = ("solid", "diagonal", "dots", "horizontal", "cross", "vertical", "checks", "backslash")
_W, _PLOT_H, _LEFT, _RIGHT, _TOP, _AXIS_H = 900, 240, 70, 10, 14, 28
_LEGEND_COL, _LEGEND_ROW, _MAX_BAR = 275, 20, 48


@dataclass(frozen=True)
class Series:
    model: str
    pattern_id: str
    colour: str
    pattern: str
    total: Decimal | None
    calls: int
    x: float = 0.0
    y: float = 0.0

    @property
    def total_label(self) -> str:
        return money(self.total) + ("" if self.total is not None else " (unpriced)")

    @property
    def short(self) -> str:
        return self.model if len(self.model) <= 30 else self.model[:29] + "…"


@dataclass(slots=True)  # not frozen: a year's chart builds thousands, and nothing changes one
class Segment:
    x: float
    y: float
    width: float
    height: float
    series: Series
    href: str
    title: str
    unpriced: bool = False


@dataclass
class Chart:
    noun: str  # day, week or month: what a bar is
    label: str
    height: float
    plot_bottom: float
    ticks: list[tuple[float, str]] = field(default_factory=list)
    days: list[tuple[float, str]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    empty: bool = False
    width: int = _W
    left: int = _LEFT
    right: int = _W - _RIGHT

    @property
    def middle(self) -> float:
        return (self.left + self.right) / 2

    @property
    def bars(self) -> SafeString:
        """The bars' markup, one segment a line: written here, not by a template loop, because a
        year of days times models is thousands of segments (what the template engine took most
        of the page's time for: bench/scale.py). The same markup the loop wrote."""
        return mark_safe("".join(_bar(segment) + "\n    " for segment in self.segments))


_CENT = Decimal("0.01")


def _two_places(value: float) -> str:
    """`value|floatformat:2` as the template wrote it: half up from the shortest repr.

    Formatting the float itself rounds its exact binary value, which gives the same digits unless
    the shortest repr is a tie at the third place (12.345, whose double lies just below it): only
    then is the repr rounded as a Decimal (tests/test_console_usage.py checks both against
    floatformat)."""
    text = repr(value)
    if text[-1] == "5" and text[-4:-3] == ".":
        return f"{Decimal(text).quantize(_CENT, ROUND_HALF_UP):f}"
    return f"{value:.2f}"


def _bar(seg: Segment) -> str:
    # html.escape is what Django's escape (the templates' autoescape) calls, without its lazy wrapper.
    title, series = html.escape(written_plain(seg.title)), seg.series
    return (
        f'<a class="bar{" unpriced" if seg.unpriced else ""}" href="{html.escape(seg.href)}" '
        f'data-model="{conditional_escape(kept_value(series.model))}" aria-label="{title}"><rect x="{_two_places(seg.x)}" '
        f'y="{_two_places(seg.y)}" width="{_two_places(seg.width)}" height="{_two_places(seg.height)}" '
        f'fill="url(#{html.escape(series.pattern_id)})"/><title>{title}</title></a>'
    )


def _nice_step(top: float, ticks: int = 4) -> float:
    raw = top / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude  # pragma: no cover - the loop always returns


def _dollars(value: float, step: float) -> str:
    """A tick label with as many decimals as the step needs ($0.025 steps: three), cents at least
    below whole-dollar steps."""
    exponent = Decimal(repr(round(step, 12))).normalize().as_tuple().exponent
    decimals = max(0, -int(exponent))
    if decimals:
        decimals = max(decimals, 2)
    return f"${value:,.{decimals}f}"


def period_label(first: date, last: date | None, granularity: str) -> str:
    """A period as the page names it: 2026-03-01; 2026-03 for a whole month; else first – last."""
    if last is None or last == first:
        return first.isoformat()
    if granularity == "month" and first.day == 1 and (last + timedelta(days=1)).day == 1:
        return f"{first:%Y-%m}"
    return f"{first} – {last}"


def build_chart(
    cells: list[PeriodModelCost], start: date, end: date, workspace: Workspace, granularity: str = "day"
) -> Chart:
    spans = periods(start, end, granularity)
    days = [first for first, _ in spans]
    lasts = dict(spans)
    adjective, noun, _ = _PERIOD_WORDS[granularity]
    totals: dict[str, Decimal | None] = {}
    calls: dict[str, int] = {}
    day_totals: dict[date, Decimal] = {}
    for c in cells:
        if c.cost_usd is not None:
            totals[c.model] = (totals.get(c.model) or Decimal(0)) + c.cost_usd
            day_totals[c.day] = day_totals.get(c.day, Decimal(0)) + c.cost_usd
        else:
            totals.setdefault(c.model, None)
        calls[c.model] = calls.get(c.model, 0) + c.calls
    order = sorted(totals, key=lambda m: (-(totals[m] or Decimal(-1)), m))
    columns = max(1, (_W - _LEFT) // _LEGEND_COL)
    legend_top = _TOP + _PLOT_H + _AXIS_H + 8
    series = {
        m: Series(
            model=m,
            pattern_id=f"usage-p{i}",
            colour=_COLOURS[i % len(_COLOURS)],
            pattern=_PATTERNS[i % len(_PATTERNS)],
            total=totals[m],
            calls=calls[m],
            x=_LEFT + (i % columns) * _LEGEND_COL,
            y=legend_top + (i // columns) * _LEGEND_ROW,
        )
        for i, m in enumerate(order)
    }
    rows = math.ceil(len(order) / columns)
    peak = float(max(day_totals.values(), default=Decimal(0)))
    step = _nice_step(peak) if peak > 0 else 1.0
    top = step * math.ceil(peak / step) if peak > 0 else 4.0
    bottom = _TOP + _PLOT_H
    total = sum(day_totals.values(), Decimal(0))
    chart = Chart(
        noun=noun,
        label=(
            f"{adjective} cost by model from {start} to {end}: {money(total) if totals else '$0'} in total"
            f" across {len(order)} model{'s' if len(order) != 1 else ''}"
        ),
        height=legend_top + rows * _LEGEND_ROW + 4,
        plot_bottom=bottom,
        empty=not cells,
        series=list(series.values()),
    )
    n = top / step
    chart.ticks = [(bottom - _PLOT_H * i / n, _dollars(step * i, step)) for i in range(int(round(n)) + 1)]
    slot = (_W - _LEFT - _RIGHT) / len(days)
    width = min(max(slot * 0.72, 1.0), _MAX_BAR)
    every = math.ceil(len(days) / 12)
    tick = "%b %Y" if granularity == "month" else "%b %d"
    chart.days = [(_LEFT + slot * (i + 0.5), d.strftime(tick)) for i, d in enumerate(days) if i % every == 0]
    index = {d: i for i, d in enumerate(days)}
    rank = {m: i for i, m in enumerate(order)}
    # runs_url(workspace, model=m, from=day, to=day), its model part encoded once per model.
    drill = {m: runs_url(workspace, model=m) for m in order}
    stacked: dict[date, float] = {}
    on = "on" if granularity == "day" else "in"
    for c in sorted(cells, key=lambda c: (c.day, rank[c.model])):
        x = _LEFT + slot * index[c.day] + (slot - width) / 2
        href = f"{drill[c.model]}&from={c.day}&to={lasts[c.day]}"
        s = series[c.model]
        when = f"{on} {period_label(c.day, lasts[c.day], granularity)}"
        if c.cost_usd is None:
            chart.segments.append(
                Segment(
                    x,
                    bottom - 3,
                    width,
                    3,
                    s,
                    href,
                    unpriced=True,
                    title=f"{c.model} {when}: n/a ({c.calls} unpriced calls)",
                )
            )
            continue
        height = max(float(c.cost_usd) / top * _PLOT_H, 1.0)
        base = stacked.get(c.day, 0.0)
        stacked[c.day] = base + height
        chart.segments.append(
            Segment(
                x,
                bottom - base - height,
                width,
                height,
                s,
                href,
                title=f"{c.model} {when}: {money(c.cost_usd)} ({c.priced_calls} of {c.calls} calls priced)",
            )
        )
    return chart


# --- the view ------------------------------------------------------------------------------


def _csv_url(workspace: Workspace, scope: str, start: date, end: date, group_by: str) -> str:
    params = {"from": start, "to": end, "groupBy": group_by, "format": "csv"}
    if scope == "tenant":
        params.update(scope="tenant", tenant=workspace.tenant.slug)
    else:
        params["workspace"] = f"{workspace.tenant.slug}/{workspace.slug}"
    return "/api/v1/usage?" + urlencode(params)


@login_required
@require_safe
def usage_report(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    member = member_access(request, tenant, workspace)
    ws = member.workspace
    form = UsageForm(request.GET)
    is_admin = member.allows("admin")
    context: dict[str, Any] = {
        "workspace": ws,
        "workspaces": switcher(request),
        "form": form,
        "is_admin": is_admin,
        "from_value": request.GET.get("from", ""),
        "to_value": request.GET.get("to", ""),
        "by_value": request.GET.get("by", ""),
        "daily_up_to": DAILY_UP_TO,
        "weekly_up_to": WEEKLY_UP_TO,
    }
    if not form.is_valid():
        return render(request, "console/usage/report.html", context, status=400)
    start, end, scope = form.cleaned_data["from"], form.cleaned_data["to"], form.cleaned_data["scope"]
    context.update(from_value=start.isoformat(), to_value=end.isoformat())
    if scope == "tenant" and not is_admin:
        context["refused"] = True
        return render(request, "console/usage/report.html", context, status=403)
    where: dict[str, Any] = {"tenant": ws.tenant} if scope == "tenant" else {"workspace": ws}
    granularity = form.cleaned_data["granularity"]
    report = usage.report(start=start, end=end, granularity=granularity, **where)
    rng = {"from": start, "to": end}
    lasts = dict(periods(start, end, granularity))
    _, noun, key_label = _PERIOD_WORDS[granularity]
    period_rows = []
    for r in report.by_period:
        first = date.fromisoformat(r.key or "")
        span = {"from": first, "to": lasts[first]}
        period_rows.append(
            TableRow(period_label(first, lasts[first], granularity), runs_url(ws, model=selectors.ANY_MODEL, **span), r)
        )
    context.update(
        {
            "scope": scope,
            "start": start,
            "end": end,
            "granularity": granularity,
            "period_noun": noun,
            "period_key_label": key_label,
            "period_caption": f"By {noun}",
            "by_value": form.cleaned_data.get("by") or "",
            "chart": build_chart(report.cells, start, end, ws, granularity),
            "models": [TableRow(r.key or "", runs_url(ws, model=r.key or "", **rng), r) for r in report.by_model],
            "days": period_rows,
            "total": TableRow("Total", runs_url(ws, model=selectors.ANY_MODEL, **rng), report.total),
            "csv_url": _csv_url(ws, scope, start, end, "model"),
            "csv_days_url": _csv_url(ws, scope, start, end, granularity),
        }
    )
    if scope == "tenant":
        by_workspace, _ = usage_rows(group_by="workspace", start=start, end=end, tenant=ws.tenant)
        context["workspaces_usage"] = [
            TableRow(r.key or "", f"/w/{r.key}/usage/?" + urlencode(rng), r) for r in by_workspace
        ]
    return render(request, "console/usage/report.html", context)


urlpatterns = [
    path("w/<slug:tenant>/<slug:workspace>/usage/", usage_report, name="usage"),
]
