from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from decimal import Context, Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.fold.pricing import (
    LITTLE_WORKFLOW,
    MAX_OVERRIDE_RATE,
    NO_PRICE,
    USAGE_NOT_REPORTED,
    InvalidOverride,
    ModelRates,
    PriceTable,
    Usage,
    UsageTotals,
    load_default_prices,
    override_problems,
    parse_price_table,
    price_call,
    price_recorded,
    prices_for,
    refused_overrides,
    reports_tokens,
    unpriced_reason,
)

PRICES = load_default_prices()


def cost(provider: str, model_id: str, **usage: int) -> Decimal | None:
    return price_call(Usage(**usage), provider, model_id, PRICES)


# Little Workflow's registry (its model-registry.json, as Little Workflow's reference §4 gives it): input / cached / output.
LITTLE_REGISTRY = {
    "openai/gpt-4o-mini": ("0.15", "0.075", "0.6"),
    "openai/gpt-4o": ("2.5", "1.25", "10"),
    "openai/gpt-5": ("1.25", "0.125", "10"),
    "openai/o4-mini": ("1.1", "0.275", "4.4"),
    "anthropic/claude-sonnet-4-6": ("3", "0.3", "15"),
    "anthropic/claude-opus-4-7": ("5", "0.5", "25"),
    "google/gemini-2.5-pro": ("1.25", "0.125", "10"),
    "google/gemini-2.5-flash": ("0.3", "0.03", "2.5"),
    "deepseek/deepseek-v4-flash": ("0.14", "0.0028", "0.28"),
    "deepseek/deepseek-v4-pro": ("0.435", "0.003625", "0.87"),
    "mistral/mistral-large-latest": ("2", None, "6"),
    "perplexity/sonar-pro": ("3", None, "15"),
    "groq/llama-3.3-70b-versatile": ("0.59", None, "0.79"),
    "amazon/nova-pro": ("0.8", None, "3.2"),
    "meta/llama-4-maverick": ("0.2", None, "0.6"),
    "qwen/qwen3-coder": ("0.3", None, "1.2"),
    "cohere/command-a": ("2.5", None, "10"),
    "azure/gpt-4o": ("2.5", None, "10"),
}
# Ours beyond Little Workflow's registry: entries its date-suffix rule reaches or must not reach.
OURS = {
    "anthropic/claude-3-5-sonnet": ("3", "0.3", "15"),
    "openai/gpt-4o-2024-05-13": ("5", None, "15"),
}


def test_shipped_table_prices_every_model_little_workflow_prices_at_its_rates() -> None:
    path = Path(__file__).resolve().parents[1] / "ledger" / "prices" / "2026-12-03.json"
    data = json.loads(path.read_text("utf-8"), parse_float=Decimal)
    assert data["version"] == PRICES.version == "2026-12-03"
    expected = {**LITTLE_REGISTRY, **OURS}
    assert set(data["models"]) == set(expected) == set(PRICES.rates)
    for key, (input_rate, cached_rate, output_rate) in expected.items():
        entry = data["models"][key]
        assert ("cachedInput" in entry) == (cached_rate is not None), key
        rates = PRICES.rates[key]
        assert rates.input == Decimal(input_rate)
        assert rates.output == Decimal(output_rate)
        assert rates.cached_input == (None if cached_rate is None else Decimal(cached_rate))
        assert entry.get("littleWorkflow", False) == (key in LITTLE_REGISTRY), key
    assert PRICES.little_workflow == frozenset(LITTLE_REGISTRY)


def test_every_price_names_its_source_and_date() -> None:
    path = Path(__file__).resolve().parents[1] / "ledger" / "prices" / "2026-12-03.json"
    for key, entry in json.loads(path.read_text("utf-8"))["models"].items():
        assert isinstance(entry["source"], str) and entry["source"], key
        assert date.fromisoformat(entry["sourceDate"]) <= date(2026, 12, 3), key
        # A rate without a provider page read on its date says so.
        assert entry.get("unverified", False) == (
            not entry["source"].startswith("https://") or "not re-read" in entry["source"]
        ), key


def test_the_previous_table_is_kept_for_the_cost_entries_it_priced() -> None:
    old = json.loads((Path(__file__).resolve().parents[1] / "ledger" / "prices" / "2026-11-01.json").read_text("utf-8"))
    assert old["version"] == "2026-11-01"
    assert parse_price_table(old).version == "2026-11-01"


@pytest.mark.parametrize(
    ("provider", "model_id", "priced_as"),
    [
        ("openai", "gpt-4o-2024-08-06", "openai/gpt-4o"),  # OpenAI's dated snapshot: -YYYY-MM-DD
        ("openai", "gpt-4o-2024-11-20", "openai/gpt-4o"),
        ("openai.chat", "gpt-4o-mini-2024-07-18", "openai/gpt-4o-mini"),
        ("anthropic", "claude-3-5-sonnet-20241022", "anthropic/claude-3-5-sonnet"),  # Anthropic's: -YYYYMMDD
        ("anthropic", "claude-sonnet-4-6-20260115", "anthropic/claude-sonnet-4-6"),
        ("anthropic", "claude-3-5-sonnet-latest", "anthropic/claude-3-5-sonnet"),  # an alias
        ("openai", "gpt-4o-2024-05-13", "openai/gpt-4o-2024-05-13"),  # its own entry shadows the rule
        ("OpenAI", "GPT-4o", "openai/gpt-4o"),
        ("perplexity", "sonar-pro", "perplexity/sonar-pro"),
    ],
)
def test_a_model_finds_its_entry_through_aliases_and_date_suffixes(
    provider: str, model_id: str, priced_as: str
) -> None:
    found = PRICES.resolve(provider, model_id)
    assert found is not None and found[0] == priced_as
    assert found[1] is PRICES.rates[priced_as]


@pytest.mark.parametrize(
    ("provider", "model_id"),
    [("openai", "gpt-4o-2024"), ("openai", "gpt-9-2024-08-06"), ("openai", "-2024-08-06"), ("anthropic", "20241022")],
)
def test_a_date_suffix_alone_prices_nothing_new(provider: str, model_id: str) -> None:
    assert PRICES.resolve(provider, model_id) is None


def test_the_dated_gpt_4o_costs_what_gpt_4o_costs_and_the_first_snapshot_its_own_price() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000)
    assert price_call(usage, "openai", "gpt-4o-2024-08-06", PRICES) == Decimal("7.5")
    assert price_call(usage, "openai", "gpt-4o-2024-05-13", PRICES) == Decimal("12.5")


def test_little_workflow_rules_price_only_its_registry_and_exactly() -> None:
    little = PRICES.for_little_workflow()
    assert little.rules == LITTLE_WORKFLOW and little.version == "2026-12-03+little"
    assert set(little.rates) == set(LITTLE_REGISTRY)
    # Little Workflow's own lookup: exact key, dot segments off the provider; no alias, no date suffix.
    assert little.resolve("openai.responses", "gpt-4o-mini") is not None
    assert little.resolve("openai", "gpt-4o-2024-08-06") is None
    assert little.resolve("anthropic", "claude-3-5-sonnet") is None  # ours, not its registry's
    assert little.resolve("cohere", "command-a") is not None
    assert little.for_little_workflow() is little


def test_workspace_overrides_apply_under_little_workflow_rules_too() -> None:
    little = PRICES.for_little_workflow().with_overrides({"acme/house": {"input": 1, "output": 2}})
    assert little.rules == LITTLE_WORKFLOW and little.version.startswith("2026-12-03+little+ws.")
    assert little.resolve("acme", "house") is not None


def test_a_price_table_refuses_an_alias_to_nothing_and_an_unknown_entry_field() -> None:
    with pytest.raises(ValueError, match="aliases name models"):
        parse_price_table({"version": "v", "models": {}, "aliases": {"a/b": "c/d"}})
    with pytest.raises(ValueError, match="needs input and output"):
        parse_price_table({"version": "v", "models": {"a/b": {"input": 1, "output": 2, "costUsd": 3}}})


def test_fractional_tokens_are_whole_under_our_rules_and_kept_under_little_workflows() -> None:
    recorded = {"inputTokens": 1500.5, "outputTokens": 20.25, "cachedInputTokens": 0.5}
    assert Usage.from_payload(recorded) == Usage(input_tokens=1500, output_tokens=20, cached_input_tokens=0)
    exact = Usage.from_payload(recorded, exact=True)
    assert (exact.input_tokens, exact.output_tokens, exact.cached_input_tokens) == (1500.5, 20.25, 0.5)
    # Dollars from the decimals the log wrote: ((1500.5 - 0.5) x 2.5 + 0.5 x 1.25 + 20.25 x 10) / 1M
    assert price_call(exact, "openai", "gpt-4o", PRICES) == Decimal("0.003953125")


def test_gpt_4o_one_million_in_half_million_out_costs_7_50() -> None:
    assert cost("openai", "gpt-4o", input_tokens=1_000_000, output_tokens=500_000) == Decimal("7.50")


def test_gpt_4o_mini_10k_in_2k_out_costs_0_0027() -> None:
    assert cost("openai", "gpt-4o-mini", input_tokens=10_000, output_tokens=2_000) == Decimal("0.0027")


def test_gpt_4o_mini_with_8k_cached_costs_0_0021() -> None:
    result = cost("openai", "gpt-4o-mini", input_tokens=10_000, output_tokens=2_000, cached_input_tokens=8_000)
    assert result == Decimal("0.0021")


def test_reasoning_tokens_are_not_charged_twice() -> None:
    plain = cost("openai", "o4-mini", input_tokens=1_000, output_tokens=5_000)
    reasoning = cost("openai", "o4-mini", input_tokens=1_000, output_tokens=5_000, reasoning_tokens=4_000)
    assert plain == reasoning == Decimal("0.0231")


def test_model_without_cache_rate_bills_cached_tokens_at_input_rate() -> None:
    result = cost("mistral", "mistral-large-latest", input_tokens=1_000, cached_input_tokens=1_000)
    assert result == Decimal("0.002")


def test_cached_tokens_above_input_clamp_to_input() -> None:
    usage = Usage(input_tokens=100, cached_input_tokens=500)
    assert usage.cached_input_tokens == 100
    assert price_call(usage, "openai", "gpt-4o-mini", PRICES) == Decimal("0.0000075")


def test_reasoning_tokens_above_output_clamp_to_output() -> None:
    assert Usage(output_tokens=10, reasoning_tokens=50).reasoning_tokens == 10


def test_ai_sdk_provider_suffix_prices_as_the_bare_provider() -> None:
    assert cost("openai.responses", "gpt-4o-mini", input_tokens=10_000, output_tokens=2_000) == Decimal("0.0027")


def test_unknown_models_are_null_not_zero() -> None:
    assert cost("acme.chat", "nope", input_tokens=10, output_tokens=10) is None
    assert cost("openai.responses", "gpt-9-imaginary", input_tokens=10, output_tokens=10) is None


@pytest.mark.parametrize(
    "usage",
    [
        {},  # what OTLP ingest and the OpenAI paths record when the provider reported nothing
        {"totalTokens": 150},
        {"inputTokens": None, "outputTokens": None},
        {"inputTokenDetails": {}, "outputTokenDetails": {}},  # the AI SDK's usage with every count undefined
        {"inputTokenDetails": {"cacheReadTokens": 20}, "outputTokenDetails": {"reasoningTokens": 5}},
        {"cachedInputTokens": 20, "reasoningTokens": 5},
        {"inputTokens": "120", "outputTokens": True},
    ],
)
def test_a_usage_without_input_or_output_count_reports_no_tokens_and_has_no_price(usage: dict[str, Any]) -> None:
    assert not reports_tokens(usage)
    assert price_recorded(usage, "openai", "gpt-4o-mini", PRICES) is None
    # Little Workflow's rules read any usage object as reported: its runs are priced as it prices them.
    assert price_recorded(usage, "openai", "gpt-4o-mini", PRICES.for_little_workflow()) == 0


@pytest.mark.parametrize(
    ("usage", "dollars"),
    [
        ({"inputTokens": 0, "outputTokens": 0}, Decimal(0)),
        ({"outputTokens": 0}, Decimal(0)),
        ({"inputTokens": 10_000, "outputTokens": 2_000}, Decimal("0.0027")),
        ({"inputTokens": 10_000.0}, Decimal("0.0015")),
    ],
)
def test_a_usage_with_an_input_or_output_count_is_priced_even_at_zero(usage: dict[str, Any], dollars: Decimal) -> None:
    assert reports_tokens(usage)
    assert price_recorded(usage, "openai", "gpt-4o-mini", PRICES) == dollars


def test_an_unpriced_call_says_why() -> None:
    assert unpriced_reason(Decimal(0), True) is None
    assert unpriced_reason(None, True) == NO_PRICE
    assert unpriced_reason(None, False) == USAGE_NOT_REPORTED
    assert price_recorded({"inputTokens": 10}, "acme.chat", "house", PRICES) is None


def test_lookup_is_case_insensitive_and_needs_provider_and_model() -> None:
    assert PRICES.lookup("OpenAI", "GPT-4o-mini") is PRICES.rates["openai/gpt-4o-mini"]
    assert PRICES.lookup(None, "gpt-4o-mini") is None
    assert PRICES.lookup("openai", "") is None
    # Dots are stripped from the provider only: a model id keeps its own dots.
    assert PRICES.lookup("google.generative-ai", "gemini-2.5-pro") is PRICES.rates["google/gemini-2.5-pro"]


def test_money_is_exact_decimal() -> None:
    assert cost("deepseek", "deepseek-v4-pro", input_tokens=1_000_000, cached_input_tokens=1_000_000) == Decimal(
        "0.003625"
    )
    totals = UsageTotals()
    for _ in range(10_000):
        totals = totals.add_call(Usage(input_tokens=1), cost("openai", "gpt-4o-mini", input_tokens=1))
    assert totals.cost_usd == Decimal("0.0015")


def test_usage_reads_ai_sdk_detail_objects_when_flat_fields_are_absent() -> None:
    usage = Usage.from_payload(
        {
            "inputTokens": 1_000,
            "outputTokens": 400,
            "inputTokenDetails": {"cacheReadTokens": 600},
            "outputTokenDetails": {"reasoningTokens": 300},
        }
    )
    assert usage == Usage(input_tokens=1_000, output_tokens=400, cached_input_tokens=600, reasoning_tokens=300)


def test_flat_usage_fields_win_over_details() -> None:
    usage = Usage.from_payload(
        {"inputTokens": 1_000, "cachedInputTokens": 100, "inputTokenDetails": {"cacheReadTokens": 600}}
    )
    assert usage.cached_input_tokens == 100


def test_recorded_cost_is_never_read() -> None:
    usage = Usage.from_payload({"inputTokens": 10_000, "outputTokens": 2_000, "costUsd": 999})
    assert price_call(usage, "openai", "gpt-4o-mini", PRICES) == Decimal("0.0027")


def test_negative_or_non_numeric_tokens_count_as_zero() -> None:
    usage = Usage.from_payload(
        {"inputTokens": -5, "outputTokens": "12", "cachedInputTokens": True, "reasoningTokens": float("nan")}
    )
    assert usage == Usage()
    assert price_call(usage, "openai", "gpt-4o", PRICES) == 0


def test_all_calls_unpriced_gives_null_cost() -> None:
    totals = UsageTotals().add_call(Usage(input_tokens=10), None)
    assert totals.cost_usd is None
    assert (totals.priced_calls, totals.unpriced_calls) == (0, 1)


def test_priced_plus_unpriced_sums_the_priced_calls() -> None:
    totals = UsageTotals().add_call(Usage(input_tokens=1_000_000), Decimal("2.50")).add_call(Usage(), None)
    assert totals.cost_usd == Decimal("2.5")
    assert (totals.priced_calls, totals.unpriced_calls) == (1, 1)
    assert totals.to_json() == {
        "inputTokens": 1_000_000,
        "outputTokens": 0,
        "cachedInputTokens": 0,
        "reasoningTokens": 0,
        "costUsd": 2.5,
        "pricedCalls": 1,
        "unpricedCalls": 1,
    }


def test_no_calls_is_a_true_zero() -> None:
    assert UsageTotals().cost_usd == 0
    assert UsageTotals().to_json()["costUsd"] == 0.0
    assert UsageTotals().to_json()["costUsd"] is not None


def test_usage_totals_round_trip_through_json() -> None:
    totals = UsageTotals().add_call(Usage(input_tokens=3, output_tokens=7), Decimal("0.0000123"))
    assert UsageTotals.from_json(totals.to_json()) == totals
    unpriced = UsageTotals().add_call(Usage(input_tokens=3), None)
    assert UsageTotals.from_json(unpriced.to_json()) == unpriced


def test_workspace_override_changes_rates_and_version() -> None:
    table = PRICES.with_overrides({"openai/gpt-4o": {"output": 5}})
    assert table.version.startswith("2026-12-03+ws")
    assert table.version != PRICES.version
    assert table.lookup("openai", "gpt-4o").cached_input == Decimal("1.25")  # type: ignore[union-attr]
    result = price_call(Usage(input_tokens=1_000_000, output_tokens=500_000), "openai", "gpt-4o", table)
    assert result == Decimal("5")
    assert PRICES.lookup("openai", "gpt-4o").output == 10  # type: ignore[union-attr]


def test_override_version_names_the_overrides() -> None:
    one = PRICES.with_overrides({"openai/gpt-4o": {"output": 5}})
    same = PRICES.with_overrides({"OpenAI/GPT-4o": {"output": 5.0}})
    other = PRICES.with_overrides({"openai/gpt-4o": {"output": 6}})
    assert one.version == same.version
    assert one.version != other.version
    assert PRICES.with_overrides({}) is PRICES


def test_override_can_add_a_model_and_drop_a_cache_rate() -> None:
    table = PRICES.with_overrides(
        {"acme/house-model": {"input": 1, "output": 2}, "openai/gpt-4o-mini": {"cachedInput": None}}
    )
    assert price_call(Usage(input_tokens=1_000_000, output_tokens=1_000_000), "acme.chat", "house-model", table) == 3
    assert price_call(Usage(input_tokens=10_000, cached_input_tokens=10_000), "openai", "gpt-4o-mini", table) == (
        Decimal("0.0015")
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"acme/new": {"input": 1}},
        {"openai/gpt-4o": {"cached_input": 1}},
        {"openai/gpt-4o": {"input": -1}},
        {"openai/gpt-4o": {"input": "cheap"}},
        {"openai/gpt-4o": {"input": True}},
        {"gpt-4o": {"input": 1, "output": 1}},
    ],
)
def test_bad_overrides_are_refused(overrides: dict) -> None:
    with pytest.raises(ValueError):
        PRICES.with_overrides(overrides)


def test_a_refused_override_names_every_problem_by_field() -> None:
    """What the Settings page's form shows next to each field (console/pages/prices.py)."""
    problems = override_problems("acme/new", {"input": "cheap", "cachedInput": -1}, PRICES.rates)
    assert set(problems) == {"input", "cachedInput", "output"}
    assert "must be a number" in problems["input"] and "not negative" in problems["cachedInput"]
    assert "adds a model" in problems["output"]
    assert override_problems("openai/gpt-4o", {"cachedInput": None}, PRICES.rates) == {}
    assert set(override_problems("gpt-4o", {"input": 1}, PRICES.rates)) == {"key"}
    with pytest.raises(InvalidOverride) as refused:
        PRICES.with_overrides({"acme/new": {"input": "cheap"}})
    assert set(refused.value.problems) == {"input", "output"} and isinstance(refused.value, ValueError)


def test_price_table_is_immutable() -> None:
    with pytest.raises(TypeError):
        PRICES.rates["acme/free"] = PRICES.rates["openai/gpt-4o"]  # type: ignore[index]
    assert isinstance(PRICES, PriceTable)
    assert load_default_prices() is PRICES


# --- price_call's integer arithmetic against the definition ---------------------------------------

_WIDE = Context(prec=200)


def reference_cost(usage: Usage, rates: ModelRates) -> Decimal:
    """The definition in Decimal (what price_call computed before it worked in integers):
    (uncached input x input rate + cached x cache rate + output x output rate) / 1M."""
    cache_rate = rates.input if rates.cached_input is None else rates.cached_input
    total = _WIDE.add(
        _WIDE.add(
            _WIDE.multiply(Decimal(usage.input_tokens - usage.cached_input_tokens), rates.input),
            _WIDE.multiply(Decimal(usage.cached_input_tokens), cache_rate),
        ),
        _WIDE.multiply(Decimal(usage.output_tokens), rates.output),
    )
    return _WIDE.divide(total, Decimal(1_000_000))


# Rates as a price table or an override holds them: any finite non-negative decimal, from whole
# hundreds (positive exponents: 1E+2) down to twelve places.
rates_strategy = st.builds(
    lambda digits, exponent: Decimal(digits).scaleb(exponent),
    st.integers(0, 10**9),
    st.integers(-12, 3),
)
tokens = st.integers(0, 10**13)


@settings(max_examples=400, deadline=None)
@given(
    rate_in=rates_strategy,
    rate_out=rates_strategy,
    rate_cached=st.none() | rates_strategy,
    input_tokens=tokens,
    output_tokens=tokens,
    cached=tokens,
    reasoning=tokens,
)
def test_price_call_equals_the_decimal_definition(
    rate_in: Decimal,
    rate_out: Decimal,
    rate_cached: Decimal | None,
    input_tokens: int,
    output_tokens: int,
    cached: int,
    reasoning: int,
) -> None:
    rates = ModelRates(input=rate_in, output=rate_out, cached_input=rate_cached)
    table = PriceTable(version="t", rates={"p/m": rates})
    usage = Usage(input_tokens, output_tokens, cached, reasoning)
    priced = price_call(usage, "p", "m", table)
    assert priced == reference_cost(usage, rates)
    assert priced is not None and f"{priced.normalize():f}" == f"{reference_cost(usage, rates).normalize():f}"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(tokens, tokens, tokens), max_size=40))
def test_totals_of_many_calls_equal_the_decimal_sum(calls: list[tuple[int, int, int]]) -> None:
    totals = UsageTotals()
    expected = Decimal(0)
    rates = PRICES.lookup("openai", "gpt-4o-mini")
    assert rates is not None
    for input_tokens, output_tokens, cached in calls:
        usage = Usage(input_tokens, output_tokens, cached)
        totals = totals.add_call(usage, price_call(usage, "openai", "gpt-4o-mini", PRICES))
        expected = _WIDE.add(expected, reference_cost(usage, rates))
    assert totals.cost_usd == expected and totals.priced_calls == len(calls)
    assert totals == UsageTotals(
        sum(c[0] for c in calls),
        sum(c[1] for c in calls),
        sum(min(c[2], c[0]) for c in calls),
        0,
        expected,
        len(calls),
        0,
    )


@pytest.mark.parametrize(
    "rates",
    [
        {"input": 0, "output": 0},  # free
        {"input": 100, "output": 1000, "cachedInput": 0},  # whole dollars, free cache hits
        {"input": 0.000000000001, "output": 123456.123456789},  # the smallest and a long rate
        {"input": 3, "output": 15, "cachedInput": 0.3},
    ],
)
def test_edge_prices_equal_the_definition(rates: dict[str, Any]) -> None:
    table = PRICES.with_overrides({"acme/edge": rates})
    model_rates = table.lookup("acme", "edge")
    assert model_rates is not None
    for usage in (Usage(), Usage(1), Usage(0, 1), Usage(999_999, 1, 999_999), Usage(10**12, 10**12, 7, 10**12)):
        assert price_call(usage, "acme", "edge", table) == reference_cost(usage, model_rates)


def test_lookup_answers_the_same_the_second_time_and_keeps_no_odd_keys() -> None:
    table = PRICES.with_overrides({"openai.responses/gpt-4.1": {"input": 9, "output": 9}})
    asks = [
        ("openai.responses", "gpt-4.1"),
        ("OpenAI.Chat", "GPT-4o"),
        ("openai", "nope"),
        ("", "gpt-4o"),
        (None, "gpt-4o"),
        ({"not": "hashable"}, "gpt-4o"),
        ("openai", ["gpt-4o"]),
    ]
    first = [table.lookup(p, m) for p, m in asks]
    assert first == [table.lookup(p, m) for p, m in asks]
    assert first[0] == ModelRates(Decimal(9), Decimal(9)) and first[1] == table.rates["openai/gpt-4o"]
    assert first[2:] == [None] * 5
    assert PRICES.lookup("openai.responses", "gpt-4.1") is None  # each table answers from its own rates


def test_overrides_stored_that_the_table_refuses_are_left_out_and_named() -> None:
    @dataclass
    class Stored:
        price_overrides: Any

    good = {"acme/house": {"input": 1, "output": 2}}
    at_bound = Stored({"openai/gpt-4o": {"input": MAX_OVERRIDE_RATE}})
    assert prices_for(at_bound).lookup("openai", "gpt-4o").input == MAX_OVERRIDE_RATE  # type: ignore[union-attr]
    assert refused_overrides(at_bound) == {}
    stored = Stored({"openai/gpt-4o": {"input": 1e300, "output": 1}, **good, "acme/later": {"output": 1}})
    table = prices_for(stored)
    assert table.version == prices_for(Stored(good)).version  # the digest of the overrides taken
    assert table.lookup("openai", "gpt-4o") == PRICES.lookup("openai", "gpt-4o")
    assert table.lookup("acme", "later") is None
    assert set(refused_overrides(stored)) == {"openai/gpt-4o", "acme/later"}
    assert "at most 1,000,000 USD per 1M tokens" in refused_overrides(stored)["openai/gpt-4o"]
    # A model an earlier override adds may have some rates changed by a later one, as with_overrides takes them.
    both = Stored({**good, "ACME/house": {"output": 3}})
    assert refused_overrides(both) == {} and prices_for(both).lookup("acme", "house").output == 3  # type: ignore[union-attr]
    assert prices_for(Stored(["x"])) is PRICES and "*" in refused_overrides(Stored(["x"]))
