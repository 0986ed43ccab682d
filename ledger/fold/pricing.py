"""Model prices and the one place tokens become dollars (docs/design.md §4).

Rates are USD per 1M tokens from a versioned table shipped in `ledger/prices/`. Money is
`Decimal` throughout: a float sum of thousands of sub-cent calls drifts, and `ledger verify`
compares projections with a fresh fold to the last digit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, Protocol

from ..canonical import digest

TOKENS_PER_PRICE_UNIT = 1_000_000
_PRICE_UNIT = Decimal(TOKENS_PER_PRICE_UNIT)
DEFAULT_PRICE_FILE = "2026-12-03.json"
# The rules a table prices by: ours (aliases, date suffixes), or Little Workflow's for the runs
# imported from it (its registry's entries only, looked up exactly: its report is reproduced).
NATIVE = "native"
LITTLE_WORKFLOW = "little-workflow"

# Wide enough that no product or sum of token counts and rates is ever rounded.
MONEY = Context(prec=50)
# Never rounds: a call's dollars are an exact integer count of a power of ten (price_call).
EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)
_ZERO = Decimal(0)

_RATE_KEYS = {"input", "cachedInput", "output"}
# The highest rate an override may set, USD per 1M tokens ($1 a token, 40,000 times the
# dearest rate shipped): what the cost columns (numeric(24,12), below 10^12 dollars) can hold
# a call's, a run's and a day's sums of, with room (docs/operations.md § Prices, "Bounds").
MAX_OVERRIDE_RATE = Decimal(1_000_000)
# What an entry of the shipped table may say beside its rates: where they come from (docs/operations.md § Prices).
_ENTRY_KEYS = _RATE_KEYS | {"source", "sourceDate", "unverified", "littleWorkflow"}
_new = object.__new__
_LOOKUPS_KEPT = 1024  # distinct (provider, modelId) answers a table remembers; payloads name them
# A recorded JSON object: dict first, so the usual case skips the Mapping ABC's Python-level check.
_OBJECT = (dict, Mapping)


@dataclass(frozen=True)
class ModelRates:
    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None  # None: cache hits bill at the input rate
    # (input, cached input, output) as integers of one power of ten, and that power less the six
    # of the per-million unit: price_call multiplies ints and builds one Decimal, exactly.
    scaled: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cache_rate = self.input if self.cached_input is None else self.cached_input
        rates = (self.input, cache_rate, self.output)
        exponent = min(0, *(int(rate.as_tuple().exponent) for rate in rates))
        ints = [int(EXACT.scaleb(rate, -exponent)) for rate in rates]
        object.__setattr__(self, "scaled", (*ints, exponent - 6))


@dataclass(frozen=True)
class PriceTable:
    """Rates by `provider/modelId` (lower case), and how a model a call names finds its entry.

    `aliases` maps a key to another entry's key; `date_suffixes` are patterns a model id may end
    with (a dated snapshot such as `gpt-4o-2024-08-06`) that are cut off when the id has no entry
    of its own. `little_workflow` are the keys Little Workflow's registry prices at these rates;
    under `rules == LITTLE_WORKFLOW` only those are looked up, exactly (`for_little_workflow`).
    """

    version: str
    rates: Mapping[str, ModelRates]
    aliases: Mapping[str, str] = field(default_factory=dict)
    date_suffixes: tuple[str, ...] = ()
    little_workflow: frozenset[str] = frozenset()
    rules: str = NATIVE

    def __post_init__(self) -> None:
        frozen = MappingProxyType({key.lower(): rates for key, rates in self.rates.items()})
        object.__setattr__(self, "rates", frozen)
        object.__setattr__(self, "aliases", MappingProxyType({k.lower(): v.lower() for k, v in self.aliases.items()}))
        object.__setattr__(self, "little_workflow", frozenset(key.lower() for key in self.little_workflow))
        object.__setattr__(self, "_suffixes", tuple(re.compile(pattern) for pattern in self.date_suffixes))
        # resolve's answers by (provider, modelId): the fold asks once per model call.
        object.__setattr__(self, "_found", {})

    def lookup(self, provider: Any, model_id: Any) -> ModelRates | None:
        resolved = self.resolve(provider, model_id)
        return None if resolved is None else resolved[1]

    def resolve(self, provider: Any, model_id: Any) -> tuple[str, ModelRates] | None:
        """The entry that prices `provider/modelId`, as (its key, its rates), or None."""
        found: dict[tuple[str, str], tuple[str, ModelRates] | None] = self._found  # type: ignore[attr-defined]
        key = (provider, model_id)
        try:
            return found[key]
        except (KeyError, TypeError):  # TypeError: an unhashable value from a payload
            pass
        resolved = self._resolve(provider, model_id)
        if isinstance(provider, str) and isinstance(model_id, str) and len(found) < _LOOKUPS_KEPT:
            found[key] = resolved
        return resolved

    def _resolve(self, provider: Any, model_id: Any) -> tuple[str, ModelRates] | None:
        """The exact key first (under either rules), then ours: an alias, then the model id
        without a date suffix (exactly, then as an alias)."""
        if not isinstance(provider, str) or not provider:
            return None
        if not isinstance(model_id, str) or not model_id:
            return None
        found = self._exact(provider, model_id)
        if found is not None or self.rules == LITTLE_WORKFLOW:
            return found
        found = self._aliased(provider, model_id)
        if found is not None:
            return found
        for suffix in self._suffixes:  # type: ignore[attr-defined]
            undated = suffix.sub("", model_id)
            if undated and undated != model_id:
                found = self._exact(provider, undated) or self._aliased(provider, undated)
                if found is not None:
                    return found
        return None

    def _keys(self, provider: str, model_id: str) -> list[str]:
        """`provider/modelId` keys to try, trailing dot segments off the provider one at a time
        (`openai.responses` -> `openai`): model ids have dots of their own (`gpt-4.1`), and the
        exact key comes first, so a dotted entry in the table shadows its bare provider."""
        keys, candidate = [], provider
        while True:
            keys.append(f"{candidate}/{model_id}".lower())
            cut = candidate.rfind(".")
            if cut <= 0:
                return keys
            candidate = candidate[:cut]

    def _exact(self, provider: str, model_id: str) -> tuple[str, ModelRates] | None:
        for key in self._keys(provider, model_id):
            rates = self.rates.get(key)
            if rates is not None:
                return key, rates
        return None

    def _aliased(self, provider: str, model_id: str) -> tuple[str, ModelRates] | None:
        for key in self._keys(provider, model_id):
            target = self.aliases.get(key)
            if target is not None and target in self.rates:
                return target, self.rates[target]
        return None

    def for_little_workflow(self) -> PriceTable:
        """This table as runs imported from Little Workflow are priced: only the entries its
        registry holds, looked up as it looks them up (exact key, provider dot segments off)."""
        if self.rules == LITTLE_WORKFLOW:
            return self
        return PriceTable(
            version=f"{self.version}+little",
            rates={key: rates for key, rates in self.rates.items() if key in self.little_workflow},
            little_workflow=self.little_workflow,
            rules=LITTLE_WORKFLOW,
        )

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> PriceTable:
        """This table with a workspace's rates laid over it.

        An entry may change some rates of a known model (`{"output": 5}`) or add a model
        (then `input` and `output` are required; `cachedInput: null` drops a cache rate).
        The version names a digest of the overrides, so `ledger reprice` can tell two
        workspaces' tables, or one workspace before and after an edit, apart. Under Little
        Workflow's rules an override is looked up like the registry's entries: the workspace
        said so.
        """
        if not overrides:
            return self
        merged = dict(self.rates)
        applied: dict[str, dict[str, str | None]] = {}
        for key, entry in overrides.items():
            problems = override_problems(key, entry, merged)
            if problems:
                raise InvalidOverride(problems)
            key = key.lower()
            base = merged.get(key) or ModelRates(input=Decimal(0), output=Decimal(0))  # both given
            rates = ModelRates(
                input=_rate(entry["input"], key) if "input" in entry else base.input,
                output=_rate(entry["output"], key) if "output" in entry else base.output,
                cached_input=(
                    (None if entry["cachedInput"] is None else _rate(entry["cachedInput"], key))
                    if "cachedInput" in entry
                    else base.cached_input
                ),
            )
            merged[key] = rates
            applied[key] = {
                "input": _plain(rates.input),
                "cachedInput": _plain(rates.cached_input),
                "output": _plain(rates.output),
            }
        return PriceTable(
            version=f"{self.version}+ws.{digest(applied)[7:15]}",
            rates=merged,
            aliases=self.aliases,
            date_suffixes=self.date_suffixes,
            little_workflow=self.little_workflow,
            rules=self.rules,
        )


_UNPRICED = ModelRates(input=_ZERO, output=_ZERO)  # a model an override adds, as `_usable` knows it


class InvalidOverride(ValueError):
    """A price override `with_overrides` refuses; `problems` says what, by field: `key`, `entry`
    (the entry as a whole), or the rate (`input`, `cachedInput`, `output`)."""

    def __init__(self, problems: Mapping[str, str]) -> None:
        super().__init__("; ".join(problems.values()))
        self.problems = dict(problems)


def override_problems(key: Any, entry: Any, known: Mapping[str, ModelRates]) -> dict[str, str]:
    """Everything wrong with one override laid over a table whose entries are `known` (lower-case
    keys), by field; empty when `with_overrides` takes it. A known model may change some rates;
    a new one needs `input` and `output`; `cachedInput: null` drops a cache rate."""
    if not isinstance(key, str) or "/" not in key.strip("/"):
        return {"key": f"price override key {key!r} is not 'provider/modelId'"}
    if not isinstance(entry, Mapping):
        return {"entry": f"price override {key!r} must be an object of rates"}
    unknown = set(entry) - _RATE_KEYS
    if unknown:
        return {"entry": f"price override {key!r} has unknown rate(s): {sorted(unknown)}"}
    problems: dict[str, str] = {}
    for name in ("input", "cachedInput", "output"):
        if name in entry and not (name == "cachedInput" and entry[name] is None):
            try:
                rate = _rate(entry[name], key)
            except ValueError as exc:
                problems[name] = str(exc)
                continue
            if rate > MAX_OVERRIDE_RATE:
                problems[name] = (
                    f"rate for {key!r} must be at most {MAX_OVERRIDE_RATE:,} USD per 1M tokens, got {entry[name]!r}"
                )
        elif name != "cachedInput" and key.lower() not in known:
            problems[name] = f"price override {key!r} adds a model, so needs input and output"
    return problems


@cache
def load_default_prices() -> PriceTable:
    text = resources.files("ledger").joinpath("prices", DEFAULT_PRICE_FILE).read_text("utf-8")
    # parse_float keeps 0.003625 exactly 0.003625 instead of its nearest binary double.
    return parse_price_table(json.loads(text, parse_float=Decimal))


def parse_price_table(data: Mapping[str, Any]) -> PriceTable:
    version = data.get("version")
    models = data.get("models")
    if not isinstance(version, str) or not version or not isinstance(models, Mapping):
        raise ValueError("a price table needs a version string and a models object")
    rates: dict[str, ModelRates] = {}
    little: set[str] = set()
    for key, entry in models.items():
        if not isinstance(entry, Mapping) or set(entry) - _ENTRY_KEYS or not {"input", "output"} <= set(entry):
            raise ValueError(f"price table entry {key!r} needs input and output rates, and only {sorted(_ENTRY_KEYS)}")
        cached = entry.get("cachedInput")
        rates[key] = ModelRates(
            input=_rate(entry["input"], key),
            output=_rate(entry["output"], key),
            cached_input=None if cached is None else _rate(cached, key),
        )
        if entry.get("littleWorkflow") is True:
            little.add(key)
    aliases = data.get("aliases", {})
    suffixes = data.get("dateSuffixes", [])
    if not isinstance(aliases, Mapping) or not all(isinstance(v, str) for v in aliases.values()):
        raise ValueError("aliases must map provider/modelId to provider/modelId")
    missing = sorted(target for target in aliases.values() if target.lower() not in {k.lower() for k in rates})
    if missing:
        raise ValueError(f"aliases name models the table does not price: {missing}")
    if not isinstance(suffixes, list) or not all(isinstance(p, str) for p in suffixes):
        raise ValueError("dateSuffixes must be a list of regular expressions")
    return PriceTable(
        version=version, rates=rates, aliases=aliases, date_suffixes=tuple(suffixes), little_workflow=frozenset(little)
    )


def _rate(value: Any, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise ValueError(f"rate for {where!r} must be a number, got {value!r}")
    # repr gives the shortest decimal that round-trips, so 0.15 stays 0.15.
    rate = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not rate.is_finite() or rate < 0:
        raise ValueError(f"rate for {where!r} must be finite and not negative, got {value!r}")
    return rate


def _plain(value: Decimal | None) -> str | None:
    return None if value is None else f"{value.normalize():f}"


# A token count: whole under our rules; under Little Workflow's, the number its log recorded.
Tokens = int | float


def exact_tokens(value: Tokens) -> Decimal:
    """A token count as the decimal its shortest form writes (`1500.5`, not the binary double's
    expansion): what the dollars of a fractional count are computed from."""
    return Decimal(value) if value.__class__ is int else Decimal(repr(value))


def _tokens_as_recorded(value: Any) -> Tokens:
    """Little Workflow's `tokenCount`: a finite number above 0 as it is, anything else 0."""
    if value.__class__ is int:
        return value if value > 0 else 0
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return 0


def _tokens(value: Any) -> int:
    """A token count as the fold counts it: anything but a positive finite number is 0."""
    if value.__class__ is int:  # the usual case, ahead of the checks bool (an int) needs
        return value if value > 0 else 0
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and math.isfinite(value) and value > 0:
        return int(value)
    return 0


@dataclass(frozen=True, init=False, slots=True)  # slots: a long run's state holds one per model call
class Usage:
    """One model call's tokens. `cached` is part of `input`, `reasoning` part of `output`."""

    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cached_input_tokens: Tokens = 0
    reasoning_tokens: Tokens = 0

    def __init__(
        self, input_tokens: Any = 0, output_tokens: Any = 0, cached_input_tokens: Any = 0, reasoning_tokens: Any = 0
    ) -> None:
        _fill_usage(
            self, _tokens(input_tokens), _tokens(output_tokens), _tokens(cached_input_tokens), _tokens(reasoning_tokens)
        )

    @classmethod
    def from_payload(cls, usage: Mapping[str, Any], *, exact: bool = False) -> Usage:
        """Read a recorded `usage` object; a `costUsd` in it is never read. `exact`: counts as
        recorded, fractions kept (Little Workflow's rule for its logs), else whole tokens."""
        if not isinstance(usage, _OBJECT):
            raise TypeError("usage must be an object")
        get = usage.get
        cached = get("cachedInputTokens")
        if cached is None:
            # AI SDK v7 records only the details objects; v6 recorded the flat fields.
            cached = _detail(get("inputTokenDetails"), "cacheReadTokens")
        reasoning = get("reasoningTokens")
        if reasoning is None:
            reasoning = _detail(get("outputTokenDetails"), "reasoningTokens")
        count = _tokens_as_recorded if exact else _tokens
        # The fold builds one per model call: without the keyword __init__'s call frame.
        made = _new(cls)
        _fill_usage(
            made,
            count(get("inputTokens", 0)),
            count(get("outputTokens", 0)),
            0 if cached is None else count(cached),
            0 if reasoning is None else count(reasoning),
        )
        return made

    def to_json(self) -> dict[str, Tokens]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "reasoningTokens": self.reasoning_tokens,
        }


# The slots' own setters: a frozen dataclass refuses setattr, and object.__setattr__ looks each up.
_SET_INPUT, _SET_OUTPUT, _SET_CACHED, _SET_REASONING = (
    Usage.__dict__[name].__set__
    for name in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
)


def _fill_usage(usage: Usage, input_tokens: Tokens, output_tokens: Tokens, cached: Tokens, reasoning: Tokens) -> None:
    """Set a Usage's counts once each (counted by _tokens): cached within input, reasoning
    within output."""
    _SET_INPUT(usage, input_tokens)
    _SET_OUTPUT(usage, output_tokens)
    _SET_CACHED(usage, cached if cached < input_tokens else input_tokens)
    _SET_REASONING(usage, reasoning if reasoning < output_tokens else output_tokens)


def _detail(details: Any, key: str) -> Any:
    if details is None or not isinstance(details, _OBJECT):  # None first: the usual case, no ABC check
        return None
    return details.get(key)


def reports_tokens(usage: Mapping[str, Any]) -> bool:
    """Whether a recorded usage object reports the call's tokens, under our rules: it gives
    `inputTokens` or `outputTokens` as a number (0 included). `{}`, what a provider that reported
    nothing leaves (an OpenAI stream without `include_usage`), `{"totalTokens": 9}` and
    `{"inputTokens": null}` do not: the details objects hold parts of these two, never them, so
    such a call's dollars are unknown, not 0 (docs/operations.md § Prices)."""
    return _is_count(usage.get("inputTokens")) or _is_count(usage.get("outputTokens"))


def _is_count(value: Any) -> bool:
    if value.__class__ is int:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Why a call has no dollars: its model has no rate in the table, or (our rules) its usage named
# no token count. A call both is `USAGE_NOT_REPORTED`: no price added later could price it.
NO_PRICE = "no_price"
USAGE_NOT_REPORTED = "usage_not_reported"
UNPRICED_WORDS = {NO_PRICE: "no price", USAGE_NOT_REPORTED: "usage not reported"}


def unpriced_reason(cost: Decimal | None, usage_reported: bool) -> str | None:
    """Why a call's cost is NULL (`NO_PRICE` or `USAGE_NOT_REPORTED`), None for a priced call."""
    if cost is not None:
        return None
    return NO_PRICE if usage_reported else USAGE_NOT_REPORTED


def price_recorded(usage: Mapping[str, Any], provider: Any, model_id: Any, table: PriceTable) -> Decimal | None:
    """Dollars for one call from its recorded usage object, by the table's rules: None when the
    table has no price for the model or, under ours, when the usage reports no tokens (the fold
    applies the same rule inline: ledger/fold/handlers.py `_model_responded`)."""
    little = table.rules == LITTLE_WORKFLOW
    if not little and not reports_tokens(usage):
        return None
    return price_call(Usage.from_payload(usage, exact=little), provider, model_id, table)


def price_call(usage: Usage, provider: Any, model_id: Any, table: PriceTable) -> Decimal | None:
    """Dollars for one call, or None when the table has no price for the model (never 0). The
    tokens are taken as reported: `price_recorded` is what reads a recorded usage object."""
    rates = table.lookup(provider, model_id)
    if rates is None:
        return None
    rate_in, rate_cached, rate_out, exponent = rates.scaled
    tokens_in, tokens_out, cached = usage.input_tokens, usage.output_tokens, usage.cached_input_tokens
    # Reasoning tokens are already inside output_tokens: charging them again would double-bill.
    # (tokens x rate) / 1M in integers of 10^exponent dollars: exact, as the Decimal sum was.
    units: int | Decimal
    if isinstance(tokens_in, int) and isinstance(tokens_out, int) and isinstance(cached, int):
        units = (tokens_in - cached) * rate_in + cached * rate_cached + tokens_out * rate_out
    else:  # a fraction of a token (Little Workflow's logs): its decimal digits, exactly
        d_in, d_out, d_cached = exact_tokens(tokens_in), exact_tokens(tokens_out), exact_tokens(cached)
        units = (d_in - d_cached) * rate_in + d_cached * rate_cached + d_out * rate_out
    return EXACT.scaleb(Decimal(units), exponent)


@dataclass(frozen=True)
class UsageTotals:
    """Sums over calls. `cost_usd` is None only when every call was unpriced; 0 means no calls."""

    input_tokens: Tokens = 0
    output_tokens: Tokens = 0
    cached_input_tokens: Tokens = 0
    reasoning_tokens: Tokens = 0
    cost_usd: Decimal | None = Decimal(0)
    priced_calls: int = 0
    unpriced_calls: int = 0

    @property
    def calls(self) -> int:
        return self.priced_calls + self.unpriced_calls

    def add_call(self, usage: Usage, cost: Decimal | None) -> UsageTotals:
        """`merge` with the totals of one call, built directly: the fold calls this per model call."""
        priced = self.priced_calls + (0 if cost is None else 1)
        total = None if priced == 0 else MONEY.add(self.cost_usd or _ZERO, cost or _ZERO)
        # Built without the frozen __init__ (a guarded setattr per field): the same fields, filled
        # in one step, as copy.copy does; the fold calls this twice per model call.
        totals = _new(UsageTotals)
        totals.__dict__.update(
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cached_input_tokens=self.cached_input_tokens + usage.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + usage.reasoning_tokens,
            cost_usd=total,
            priced_calls=priced,
            unpriced_calls=self.unpriced_calls + (1 if cost is None else 0),
        )
        return totals

    def merge(self, other: UsageTotals) -> UsageTotals:
        priced = self.priced_calls + other.priced_calls
        unpriced = self.unpriced_calls + other.unpriced_calls
        cost: Decimal | None
        if priced == 0:
            cost = None if unpriced else Decimal(0)
        else:
            cost = MONEY.add(self.cost_usd or Decimal(0), other.cost_usd or Decimal(0))
        return UsageTotals(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cost_usd=cost,
            priced_calls=priced,
            unpriced_calls=unpriced,
        )

    def to_json(self) -> dict[str, Any]:
        """The API's usage object; `costUsd` is a JSON number or null."""
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "reasoningTokens": self.reasoning_tokens,
            "costUsd": None if self.cost_usd is None else float(self.cost_usd),
            "pricedCalls": self.priced_calls,
            "unpricedCalls": self.unpriced_calls,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UsageTotals:
        cost = data.get("costUsd")
        return cls(
            **{f.name: data.get(_camel(f.name), 0) for f in fields(cls) if f.name != "cost_usd"},
            cost_usd=None if cost is None else Decimal(str(cost)),
        )


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class Priced(Protocol):
    """What prices a run: its workspace's overrides of the shipped table (a Workspace)."""

    price_overrides: Any


class PricedRun(Protocol):
    """A run (models.Run): its workspace, and the rules its log was written under."""

    @property
    def workspace(self) -> Priced: ...

    @property
    def imported_from(self) -> str: ...


def prices_for(workspace: Priced, *, rules: str = NATIVE) -> PriceTable:
    """The price table a workspace's runs are priced with: the shipped one (as Little Workflow
    prices, for `rules=LITTLE_WORKFLOW`), with the workspace's overrides. An override stored
    that `with_overrides` refuses (written before overrides were checked, or before a bound,
    or by hand) is left out, never a failed append: the table prices that model as if it had no
    override, and the Prices page and `ledger verify` name it (`refused_overrides`)."""
    table = load_default_prices() if rules != LITTLE_WORKFLOW else _little_workflow_prices()
    overrides = workspace.price_overrides
    if not overrides:
        return table
    try:
        return table.with_overrides(overrides)
    except (InvalidOverride, AttributeError):  # AttributeError: not an object at all
        return table.with_overrides(_usable(overrides, table)[0])


def refused_overrides(workspace: Priced, *, rules: str = NATIVE) -> dict[str, str]:
    """The workspace's stored overrides that `prices_for` leaves out, each with why; empty
    when it takes them all."""
    table = load_default_prices() if rules != LITTLE_WORKFLOW else _little_workflow_prices()
    return _usable(workspace.price_overrides or {}, table)[1]


def _usable(overrides: Any, table: PriceTable) -> tuple[dict[str, Any], dict[str, str]]:
    """The overrides `with_overrides` takes, in order, as it lays them over `table`, and the
    refused ones by key with the reason."""
    if not isinstance(overrides, Mapping):
        return {}, {"*": f"the price overrides must be an object of models, got {type(overrides).__name__}"}
    known = dict(table.rates)  # grows by the models the overrides taken so far add
    usable: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for key, entry in overrides.items():
        problems = override_problems(key, entry, known)
        if problems:
            refused[str(key)] = "; ".join(problems.values())
            continue
        usable[key] = entry
        known.setdefault(key.lower(), _UNPRICED)
    return usable, refused


def prices_of(run: PricedRun) -> PriceTable:
    """The price table of one run: its workspace's, under the rules of where its log came from."""
    return prices_for(run.workspace, rules=LITTLE_WORKFLOW if run.imported_from == LITTLE_WORKFLOW else NATIVE)


@cache
def _little_workflow_prices() -> PriceTable:
    return load_default_prices().for_little_workflow()
