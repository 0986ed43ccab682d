"""The console's usage report: the SVG chart, the table behind it, CSV, drill-downs, tenant scope."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.template import Context, Template
from django.template.defaultfilters import floatformat
from django.test import Client
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from console.format import money
from console.pages.usage import TableRow, _dollars, _nice_step, _two_places, build_chart
from ledger import clock, log
from ledger.log import rollup
from ledger.models import CostEntry, Run, Tenant, Workspace
from ledger.reads.usage import PeriodModelCost, UsageRow, usage_rows
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

URL = "/w/acme/support/usage/"
DAY1, DAY2 = date(2026, 3, 1), date(2026, 3, 2)
RANGE = "?from=2026-03-01&to=2026-03-02"


def responded(
    call: str, provider: str, model: str, *, inp: int = 1000, out: int = 100, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    usage = {"inputTokens": inp, "outputTokens": out, "cachedInputTokens": cached, "reasoningTokens": reasoning}
    return ev(
        "harness.model.responded",
        turn=1,
        callId=call,
        model={"provider": provider, "modelId": model},
        response={"text": "ok", "usage": usage},
    )


@contextmanager
def on_day(day: date, hour: int = 12) -> Iterator[None]:
    """Appends inside are recorded on `day` at `hour` UTC: their events, cost entries and daily usage."""
    with clock.backdated(datetime.combine(day, time(hour), tzinfo=UTC)):
        yield


@pytest.fixture
def calls(append, workspace: Workspace) -> None:
    """Day 1: gpt-4o-mini (priced) and an unpriced house model; day 2: gpt-4o, and gpt-4o-mini again
    from a run that started on day 1; another workspace of the tenant spends on claude."""
    with on_day(DAY1):
        append(
            "run_a",
            started("wf_a"),
            responded("c1", "openai", "gpt-4o-mini", inp=2000, out=200, cached=1000),
            responded("c2", "acme.chat", "house", inp=500, out=50),
        )
    with on_day(DAY2):
        append("run_b", started("wf_b"), responded("c1", "openai", "gpt-4o", inp=1000, out=100, reasoning=40))
    with on_day(DAY1, hour=23):
        append("run_c", started("wf_b"))
    with on_day(DAY2, hour=0):
        append("run_c", responded("c1", "openai", "gpt-4o-mini", inp=1000, out=100))
    append("run_none", started("wf_a"))
    research = bootstrap(tenant="acme", workspace="research")
    with on_day(DAY2):
        log.append(
            workspace=research,
            run_id="run_r",
            events=[started("wf_r"), responded("c1", "anthropic", "claude-sonnet-4-6")],
        )


def table(html: str, table_id: str) -> dict[str, list[str]]:
    body = re.search(rf'<table class="grid usage-rows" id="{table_id}">(.*?)</table>', html, re.S).group(1)
    rows = {}
    for key, cells in re.findall(r'<tr[^>]* data-key="([^"]+)">(.*?)</tr>', body, re.S):
        rows[key] = [
            unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", cells, re.S)
        ]
    return rows


def svg(html: str) -> str:
    return re.search(r'<svg class="usage-chart".*?</svg>', html, re.S).group(0)


# --- access --------------------------------------------------------------------------------


def test_anonymous_is_sent_to_login(client: Client, workspace: Workspace) -> None:
    for url in (URL, URL + "?scope=tenant"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_outsider_gets_404_for_workspace_and_tenant_scope(client: Client, outsider, calls: None) -> None:
    client.force_login(outsider)
    for url in (URL, URL + RANGE, URL + "?scope=tenant", URL + "?from=nonsense"):
        assert client.get(url).status_code == 404
    assert client.get("/w/globex/main/usage/").status_code == 200


def test_tenant_scope_is_for_admins_only(client: Client, viewer: User, calls: None) -> None:
    client.force_login(viewer)
    mine = client.get(URL + RANGE)
    assert mine.status_code == 200 and 'name="scope"' not in mine.content.decode()
    refused = client.get(URL + RANGE + "&scope=tenant")
    assert refused.status_code == 403 and "for admins" in refused.content.decode()
    assert 'class="usage-chart"' not in refused.content.decode()


# --- the report ----------------------------------------------------------------------------


def test_table_shows_tokens_cost_calls_and_coverage_per_model(browser: Client, calls: None) -> None:
    response = browser.get(URL + RANGE)
    assert response.status_code == 200
    html = response.content.decode()
    rows = table(html, "usage-table")
    assert list(rows) == ["acme.chat/house", "openai/gpt-4o", "openai/gpt-4o-mini", "total"]
    assert rows["acme.chat/house"][1:] == ["500", "0", "50", "0", "n/a", "0", "1", "0%"]
    assert rows["openai/gpt-4o"][1:] == ["1,000", "0", "100", "40", "$0.0035", "1", "0", "100%"]
    # (1000 x 0.15 + 1000 x 0.075 + 200 x 0.6 + 1000 x 0.15 + 100 x 0.6) / 1M
    assert rows["openai/gpt-4o-mini"][1:] == ["3,000", "1,000", "300", "0", "$0.000555", "2", "0", "100%"]
    assert rows["total"][1:] == ["4,500", "1,000", "450", "40", "$0.004055", "3", "1", "75%"]
    days = table(html, "usage-days")
    assert list(days) == ["2026-03-01", "2026-03-02"]
    assert days["2026-03-01"][-3:] == ["1", "1", "50%"]
    assert "research" not in html.split('<svg class="usage-chart"')[1].split("</svg>")[0]


def test_default_range_is_the_last_30_days(browser: Client, append) -> None:
    append("run_today", started(), responded("c1", "openai", "gpt-4o"))
    before = datetime.now(UTC).date()
    html = browser.get(URL).content.decode()
    # Today when the page was made: the day before or after the request, should midnight pass meanwhile.
    days = {before, datetime.now(UTC).date()}
    assert any(
        f'name="from" value="{d - timedelta(days=29)}"' in html and f'name="to" value="{d}"' in html for d in days
    )
    assert list(table(html, "usage-table")) == ["openai/gpt-4o", "total"]
    assert svg(html).count('<text class="tick"') >= 5 + 12 - 2  # dollar ticks and day labels


def test_chart_stacks_bars_per_day_and_model_with_dollar_ticks_and_legend(browser: Client, calls: None) -> None:
    chart = svg(browser.get(URL + RANGE).content.decode())
    assert 'role="group"' in chart and re.search(
        r'aria-label="Daily cost by model from 2026-03-01 to 2026-03-02: \$0\.004055', chart
    )
    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="end"[^>]*>([^<]+)</text>', chart)
    assert ticks[0] == "$0.000" and ticks[-1].startswith("$0.00") and len(ticks) >= 3
    assert re.findall(r'<text class="tick"[^>]*text-anchor="middle">([^<]+)</text>', chart) == ["Mar 01", "Mar 02"]
    legend = re.findall(
        r'<tspan class="legend-model">([^<]+)</tspan> <tspan class="legend-total">([^<]+)</tspan>', chart
    )
    assert legend == [
        ("openai/gpt-4o", "$0.0035"),
        ("openai/gpt-4o-mini", "$0.000555"),
        ("acme.chat/house", "n/a (unpriced)"),
    ]
    patterns = re.findall(r'<pattern id="(usage-p\d)"', chart)
    assert patterns == ["usage-p0", "usage-p1", "usage-p2"]
    bars = re.findall(r'<a class="bar( unpriced)?" href="([^"]+)" data-model="([^"]+)"', chart)
    assert len(bars) == 4
    by_model = {(m, unescape(href)) for _, href, m in bars}
    assert (
        "openai/gpt-4o-mini",
        "/w/acme/support/?model=openai%2Fgpt-4o-mini&from=2026-03-02&to=2026-03-02",
    ) in by_model
    assert [m for unpriced, _, m in bars if unpriced] == ["acme.chat/house"]
    heights = {
        m: float(h)
        for m, h in re.findall(
            r'<a class="bar" href="[^"]+" data-model="([^"]+)"[^>]*><rect [^>]*height="([\d.]+)"', chart
        )
    }
    assert heights["openai/gpt-4o"] > heights["openai/gpt-4o-mini"] > 0


def test_chart_bars_drill_down_to_the_runs_behind_them(browser: Client, calls: None) -> None:
    chart = svg(browser.get(URL + RANGE).content.decode())
    expected = {
        ("openai/gpt-4o-mini", "2026-03-01"): ["run_a"],
        ("openai/gpt-4o-mini", "2026-03-02"): ["run_c"],
        ("openai/gpt-4o", "2026-03-02"): ["run_b"],
        ("acme.chat/house", "2026-03-01"): ["run_a"],
    }
    seen = {}
    for href, model in re.findall(r'<a class="bar[^"]*" href="([^"]+)" data-model="([^"]+)"', chart):
        href = unescape(href)
        day = re.search(r"from=([\d-]+)", href).group(1)
        runs = browser.get(href)
        assert runs.status_code == 200
        seen[model, day] = re.findall(r'data-run-id="([^"]+)"', runs.content.decode())
    assert seen == expected


def test_table_rows_drill_down_by_model_and_by_day(browser: Client, calls: None) -> None:
    html = browser.get(URL + RANGE).content.decode()
    links = dict((k, unescape(h)) for h, k in re.findall(r'<a class="drill" href="([^"]+)">([^<]+)</a>', html))

    def runs(key: str) -> list[str]:
        return sorted(re.findall(r'data-run-id="([^"]+)"', browser.get(links[key]).content.decode()))

    assert runs("openai/gpt-4o-mini") == ["run_a", "run_c"]
    assert runs("acme.chat/house") == ["run_a"]
    assert runs("2026-03-01") == ["run_a"]
    assert runs("2026-03-02") == ["run_b", "run_c"]
    assert runs("Total") == ["run_a", "run_b", "run_c"]  # never run_none: it made no model calls


def test_csv_download_matches_the_table(browser: Client, calls: None) -> None:
    html = browser.get(URL + RANGE).content.decode()
    href = unescape(re.search(r'<a id="usage-csv" href="([^"]+)"', html).group(1))
    response = browser.get(href)  # the API, on the console's session
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(response.content.decode())))
    rows = table(html, "usage-table")
    assert [line["key"] for line in lines] == [k for k in rows if k != "total"]
    for line in lines:
        shown = rows[line["key"]]
        assert [
            f"{int(line[c]):,}" for c in ("inputTokens", "cachedInputTokens", "outputTokens", "reasoningTokens")
        ] == shown[1:5]
        assert [line["pricedCalls"], line["unpricedCalls"]] == shown[6:8]
        if line["costUsd"] == "":
            assert shown[5] == "n/a"
        else:
            assert shown[5] == money(Decimal(line["costUsd"]))  # the one money format of the console
    days = browser.get(unescape(re.search(r'<a id="usage-csv-days" href="([^"]+)"', html).group(1)))
    assert [line["key"] for line in csv.DictReader(io.StringIO(days.content.decode()))] == ["2026-03-01", "2026-03-02"]


def test_tenant_scope_covers_every_workspace_of_the_tenant(browser: Client, calls: None, outsider) -> None:
    with on_day(DAY2):
        log.append(
            workspace=Workspace.objects.get(slug="main"),
            run_id="run_g",
            events=[started(), responded("c1", "openai", "gpt-5")],
        )
    response = browser.get(URL + RANGE + "&scope=tenant")
    assert response.status_code == 200
    html = response.content.decode()
    models = table(html, "usage-table")
    assert "anthropic/claude-sonnet-4-6" in models and "openai/gpt-5" not in models
    assert list(table(html, "usage-workspaces")) == ["acme/research", "acme/support"]
    assert "/w/acme/research/usage/?from=2026-03-01&amp;to=2026-03-02" in html
    csv_href = unescape(re.search(r'<a id="usage-csv" href="([^"]+)"', html).group(1))
    keys = [line["key"] for line in csv.DictReader(io.StringIO(browser.get(csv_href).content.decode()))]
    assert keys == [k for k in models if k != "total"]


def test_an_empty_range_has_an_empty_chart_and_zero_cost(browser: Client, calls: None) -> None:
    html = browser.get(URL + "?from=2001-01-01&to=2001-01-31").content.decode()
    assert "No model calls in this range" in svg(html)
    assert table(html, "usage-table")["total"][5:] == ["$0", "0", "0", "—"]


INVALID_CASES = [
    ("?from=2026-02-30", "Enter a valid date"),
    ("?to=soon", "Enter a valid date"),
    ("?from=2026-03-02&to=2026-03-01", "From must not be after To"),
    ("?from=2020-01-01&to=2026-01-01", "at most 366 days"),
    ("?scope=galaxy", "Select a valid choice"),
]


def test_invalid_ranges_are_a_readable_400(browser: Client, workspace: Workspace) -> None:
    for query, message in INVALID_CASES:
        response = browser.get(URL + query)
        assert response.status_code == 400, query
        html = response.content.decode()
        assert message in html and 'role="alert"' in html and 'class="usage-chart"' not in html, query


def test_dollar_ticks_use_round_steps() -> None:
    assert _nice_step(0.0041) == pytest.approx(0.002)
    assert _nice_step(9) == pytest.approx(2.5)
    assert _nice_step(130) == pytest.approx(50)
    assert _dollars(0.003, 0.001) == "$0.003" and _dollars(7.5, 2.5) == "$7.50" and _dollars(1500, 500) == "$1,500"


def test_usage_page_queries_do_not_grow_with_the_calls(browser: Client, calls: None, django_assert_num_queries) -> None:
    with CaptureQueriesContext(connection) as small:
        assert browser.get(URL + "?from=2026-02-01&to=2026-03-31").status_code == 200
    run = Run.objects.get(run_id="run_b")
    base = datetime(2026, 2, 1, tzinfo=UTC)
    models = [("openai", "gpt-4o"), ("openai", "gpt-5"), ("google", "gemini-2.5-pro"), ("acme", "private")]
    CostEntry.objects.bulk_create(
        [
            CostEntry(
                run=run,
                sequence=1000 + i,
                provider=models[i % 4][0],
                model_id=models[i % 4][1],
                input_tokens=100,
                output_tokens=10,
                cost_usd=None if i % 4 == 3 else Decimal("0.001"),
                price_table_version="t",
                recorded_at=base + timedelta(minutes=17 * i),
            )
            for i in range(5_000)
        ],
        batch_size=1000,
    )
    rollup.recount(run.workspace_id, {base.date() + timedelta(days=d) for d in range(60)})
    with django_assert_num_queries(len(small)):
        response = browser.get(URL + "?from=2026-02-01&to=2026-03-31")
    html = response.content.decode()
    assert len(table(html, "usage-days")) == 59 and "google/gemini-2.5-pro" in table(html, "usage-table")
    rows, _ = usage_rows(group_by="model", start=date(2026, 2, 1), end=date(2026, 3, 31), workspace=run.workspace)
    assert len(rows) == 6


# --- the bars and table rows written in Python, against the template loops they replaced ----------

BARS_TEMPLATE = Template(
    '{% for seg in chart.segments %}<a class="bar{% if seg.unpriced %} unpriced{% endif %}" href="{{ seg.href }}" '
    'data-model="{{ seg.series.model }}" aria-label="{{ seg.title }}"><rect x="{{ seg.x|floatformat:2 }}" '
    'y="{{ seg.y|floatformat:2 }}" width="{{ seg.width|floatformat:2 }}" height="{{ seg.height|floatformat:2 }}" '
    'fill="url(#{{ seg.series.pattern_id }})"/><title>{{ seg.title }}</title></a>\n    {% endfor %}'
)
ROWS_TEMPLATE = Template(
    '{% load console_format %}{% for row in rows %}\n  <tr data-key="{{ row.key }}">\n    <th scope="row" class="mono">'
    '{% if row.href %}<a class="drill" href="{{ row.href }}">{{ row.key }}</a>{% else %}{{ row.key }}{% endif %}</th>\n'
    '    {% for n in row.tokens %}<td class="num">{{ n }}</td>{% endfor %}\n    <td class="num cost'
    '{% if row.usage.cost_usd is None %} na{% endif %}">{{ row.usage.cost_usd|money }}</td>\n    <td class="num">'
    '{{ row.usage.priced_calls }}</td><td class="num">{{ row.usage.unpriced_calls }}</td><td class="num">'
    "{{ row.coverage }}</td>\n  </tr>\n  {% endfor %}"
)


def test_bars_and_rows_are_the_markup_the_template_loops_wrote() -> None:
    workspace = Workspace(tenant=Tenant(slug="acme"), slug="support")
    start = date(2026, 1, 1)
    models = [("openai", "gpt-4o"), ("a<b>&\"c'", "m/x?y=1&z"), ("acme", "house")]
    cells = [
        PeriodModelCost(
            start + timedelta(days=d),
            *models[(d + i) % 3],
            cost_usd=None if (d + i) % 3 == 2 else Decimal(d * 7 + i) / Decimal(997) + Decimal("1e-9"),
            calls=3 + i,
            priced_calls=3 + i,
        )
        for d in range(0, 366, 3)
        for i in range(2)
    ]
    chart = build_chart(cells, start, start + timedelta(days=365), workspace)
    assert len(chart.segments) == len(cells)
    assert str(chart.bars) == BARS_TEMPLATE.render(Context({"chart": chart}))
    rows = [
        TableRow(key, href, UsageRow(key, 12_345_678, 9, 1_000, 0, cost, priced, unpriced))
        for key, href, cost, priced, unpriced in [
            ("openai/gpt-4o", "/w/acme/support/?model=openai%2Fgpt-4o&from=2026-01-01", Decimal("1234.5"), 3, 0),
            ("<x>&'\"", None, None, 0, 2),
            ("2026-01-02", "/w/?a=1&b=<2>", Decimal("0.0000001"), 1, 1),
            ("zero", "/w/", Decimal(0), 0, 0),
        ]
    ]
    assert "".join(str(r.html) for r in rows) == ROWS_TEMPLATE.render(Context({"rows": rows}))


# What a chart's coordinates are: 0, or from a pixel's fraction to far beyond the viewBox.
@given(
    st.just(0.0)
    | st.floats(min_value=1e-3, max_value=1e6)
    | st.integers(0, 10**6).map(lambda n: n / 1000)
    | st.integers(0, 10**5).map(lambda n: n / 200)
)
def test_two_places_is_floatformat_2(value: float) -> None:
    assert _two_places(value) == floatformat(value, 2)


@pytest.mark.parametrize("value", [0.125, 12.345, 1.005, 2.675, 0.0, 5.0, 1e-7, 899.995, 254.0, 3])
def test_two_places_on_ties(value: float) -> None:
    assert _two_places(value) == floatformat(value, 2)


# --- periods: a long range by week or month --------------------------------------------------------


@pytest.fixture
def months_of_calls(append) -> None:
    """Calls on 2025-12-20, 2026-01-05, 2026-01-31, 2026-03-01 and 2026-03-02 (the `calls` days)."""
    for i, day in enumerate((date(2025, 12, 20), date(2026, 1, 5), date(2026, 1, 31))):
        with on_day(day):
            append(f"run_m{i}", started("wf_m"), responded("c1", "openai", "gpt-4o", inp=1000 * (i + 1), out=10))


def test_granularity_follows_the_length_of_the_range() -> None:
    from ledger.reads.usage import granularity_for, periods

    assert granularity_for(date(2026, 1, 1), date(2026, 4, 2)) == "day"  # 92 days
    assert granularity_for(date(2026, 1, 1), date(2026, 4, 3)) == "week"
    assert granularity_for(date(2026, 1, 1), date(2026, 7, 2)) == "week"  # 183 days
    assert granularity_for(date(2026, 1, 1), date(2026, 7, 3)) == "month"
    assert periods(date(2025, 12, 20), date(2026, 3, 2), "month") == [
        (date(2025, 12, 20), date(2025, 12, 31)),
        (date(2026, 1, 1), date(2026, 1, 31)),
        (date(2026, 2, 1), date(2026, 2, 28)),
        (date(2026, 3, 1), date(2026, 3, 2)),
    ]
    assert periods(date(2026, 3, 4), date(2026, 3, 17), "week") == [  # 2026-03-09 is a Monday
        (date(2026, 3, 4), date(2026, 3, 8)),
        (date(2026, 3, 9), date(2026, 3, 15)),
        (date(2026, 3, 16), date(2026, 3, 17)),
    ]


@pytest.mark.parametrize(
    "start, end",
    [
        (date(2025, 12, 1), date(2026, 3, 31)),
        (date(2025, 12, 15), date(2026, 3, 1)),
        (date(2026, 1, 1), date(2026, 1, 31)),
        (date(2026, 1, 6), date(2026, 1, 30)),
        (date(2025, 3, 3), date(2026, 3, 2)),
    ],
)
def test_months_and_weeks_sum_the_same_days(
    calls: None, months_of_calls: None, workspace: Workspace, start: date, end: date
) -> None:
    from ledger.reads import usage

    days, total = usage_rows(group_by="day", start=start, end=end, workspace=workspace)
    for granularity in ("week", "month"):
        rows, period_total = usage_rows(group_by=granularity, start=start, end=end, workspace=workspace)
        assert period_total == total, granularity
        firsts = [first for first, _ in usage.periods(start, end, granularity)]
        assert {r.key for r in rows} <= {f.isoformat() for f in firsts}
        for row in rows:  # each period holds exactly its days
            first = date.fromisoformat(row.key or "")
            last = dict(usage.periods(start, end, granularity))[first]
            inside = [d for d in days if first <= date.fromisoformat(d.key or "") <= last]
            assert row.priced_calls + row.unpriced_calls == sum(d.priced_calls + d.unpriced_calls for d in inside)
            assert row.input_tokens == sum(d.input_tokens for d in inside)
        report = usage.report(start=start, end=end, granularity=granularity, workspace=workspace)
        assert report.total == total and [r.key for r in report.by_period] == [r.key for r in rows]


def test_a_year_is_shown_by_month(browser: Client, calls: None, months_of_calls: None) -> None:
    html = browser.get(URL + "?from=2025-03-03&to=2026-03-02").content.decode()
    months = table(html, "usage-days")
    assert list(months) == ["2025-12", "2026-01", "2026-03-01 – 2026-03-02"]
    assert months["2026-01"][-3:] == ["2", "0", "100%"] and "By month" in html and "Month (UTC)" in html
    chart = svg(html)
    assert "Monthly cost by model from 2025-03-03 to 2026-03-02" in chart
    assert chart.count('<a class="bar') == 1 + 1 + 3  # gpt-4o in Dec and Jan; three models in March
    assert "openai/gpt-4o in 2026-01: $" in chart and "Mar 2026" in chart
    drill = re.search(r'<tr data-key="2026-01">.*?href="([^"]+)"', html, re.S).group(1)
    assert "from=2026-01-01" in drill and "to=2026-01-31" in drill
    assert "CSV by month" in html and "groupBy=month" in unescape(html)
    by_week = browser.get(URL + "?from=2025-03-03&to=2026-03-02&by=week").content.decode()
    assert "Weekly cost by model" in by_week and "2025-12-15 – 2025-12-21" in table(by_week, "usage-days")
    by_day = browser.get(URL + "?from=2025-03-03&to=2026-03-02&by=day").content.decode()
    assert list(table(by_day, "usage-days"))[:2] == ["2025-12-20", "2026-01-05"]
    assert browser.get(URL + "?by=fortnight").status_code == 400


def test_api_usage_by_week_and_month(browser: Client, calls: None, months_of_calls: None) -> None:
    params = {"from": "2025-12-15", "to": "2026-03-02", "workspace": "acme/support"}
    by_month = browser.get("/api/v1/usage", {**params, "groupBy": "month"}).json()
    assert [r["key"] for r in by_month["rows"]] == ["2025-12-15", "2026-01-01", "2026-03-01"]
    assert [r["pricedCalls"] + r["unpricedCalls"] for r in by_month["rows"]] == [1, 2, 4]
    assert by_month["total"] == browser.get("/api/v1/usage", {**params, "groupBy": "day"}).json()["total"]
    by_week = browser.get("/api/v1/usage", {**params, "groupBy": "week", "limit": 2}).json()
    assert [r["key"] for r in by_week["rows"]] == ["2025-12-15", "2026-01-05"] and by_week["next"]
    csv_text = browser.get("/api/v1/usage", {**params, "groupBy": "month", "format": "csv"}).content.decode()
    assert csv_text.splitlines()[2].startswith("2026-01-01,5000,")
