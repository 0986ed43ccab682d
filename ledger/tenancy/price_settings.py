"""A workspace's price overrides (`Workspace.price_overrides`): its own rates laid over the price
table the deployment ships, as a person reads them, and the two services that change them (set
one model's override, remove it), checked as the fold checks them (`PriceTable.with_overrides`)
and audited (`price_overrides.changed`, the model with its override before and after).

What a change does not do: reprice what is recorded. Cost entries already written keep the
prices they were computed with until their run's next append (ledger/log/repricing.py), the
workspace's reprice (ledger/tenancy/repricing.py, from the Prices page) or `ledger reprice`
recomputes them from their tokens; `ledger verify` reports the entries priced by an older table
meanwhile (docs/operations.md § Prices). What it does: price every append that starts after it
commits, in every process, whenever that process loaded its Workspace (ledger/log/rules.py
`prices_in_force`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from .. import audit
from ..errors import LedgerError
from ..fold.pricing import (
    LITTLE_WORKFLOW,
    NATIVE,
    InvalidOverride,
    ModelRates,
    load_default_prices,
    override_problems,
    prices_for,
    refused_overrides,
)
from ..limits import written
from ..models import Workspace
from . import repricing

RATES = ("input", "cachedInput", "output")
# A long enough model id for every provider's names; the key is stored and audited as typed.
MAX_KEY_LENGTH = 200


class InvalidPriceOverride(LedgerError):
    """Refused as `with_overrides` refuses it; `details.problems` by field (`key`, a rate, or
    `entry`), the first also as `details.field`."""

    code = "invalid_price_override"

    def __init__(self, problems: Mapping[str, str]) -> None:
        first = next(iter(problems))
        super().__init__(problems[first], field=first, problems=dict(problems))


@dataclass(frozen=True)
class PriceRow:
    key: str
    shipped: ModelRates | None  # None: a model only this workspace prices
    override: Mapping[str, Any] | None  # the workspace's entry as stored; None: the shipped rates
    rates: ModelRates | None  # in force here (None when the stored overrides cannot be applied)


@dataclass(frozen=True)
class PriceSheet:
    shipped_version: str
    version: str  # the table this workspace's new cost entries name
    rows: list[PriceRow]  # every model priced here: the shipped ones, then the workspace's own
    problem: str  # overrides stored before they were checked, that the fold refuses

    @property
    def overridden(self) -> list[PriceRow]:
        return [row for row in self.rows if row.override is not None]


def sheet(workspace: Workspace) -> PriceSheet:
    shipped = load_default_prices()
    raw = workspace.price_overrides or {}
    overrides = dict(raw) if isinstance(raw, Mapping) else {}
    # Overrides the fold leaves out (prices_for): the rows show them without rates in force.
    refused = refused_overrides(workspace)
    table, problem = prices_for(workspace), "; ".join(refused.values())
    refused_keys = {k.lower() for k in refused}
    stored = {str(k).lower(): v if isinstance(v, Mapping) else {} for k, v in overrides.items()}
    keys = list(shipped.rates) + sorted(k for k in stored if k not in shipped.rates)
    rows = [
        PriceRow(
            key=key,
            shipped=shipped.rates.get(key),
            override=stored.get(key),
            rates=None if key in refused_keys else table.rates.get(key),
        )
        for key in keys
    ]
    return PriceSheet(shipped_version=shipped.version, version=table.version, rows=rows, problem=problem)


def parse_rate(text: str) -> Any:
    """A rate as typed (USD per 1M tokens) as the JSON number it is stored as; anything that is
    not a number comes back as typed, for `with_overrides` to refuse in its own words."""
    text = text.strip()
    try:
        value = Decimal(text)
    except InvalidOperation:
        return text
    if value.is_finite() and value == value.to_integral_value() and abs(value) < 2**53:
        return int(value)
    # repr gives back the shortest decimal (pricing._rate reads floats that way): 0.15 stays 0.15.
    return float(text) if value.is_finite() else text


# Characters a model's name never holds: spaces and line breaks (Z*), controls (Cc), format
# characters (Cf: the bidi overrides such as U+202E, zero-width joiners), and the unassigned,
# private and surrogate ones. A key with them would look like another model's on the page and in
# the audit log, and match no call (a harness names its models without them).
_NOT_IN_A_NAME = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"})


def key_problem(key: str) -> str:
    """Why `key` (trimmed, lower-cased) holds a character no model's name does; empty when it
    holds none (its `provider/modelId` shape is the price table's to check)."""
    for char in key:
        if unicodedata.category(char) in _NOT_IN_A_NAME:
            what = "a space" if char == " " else f"U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')})"
            return f"a model's name holds no spaces, control or invisible characters: this one has {what}"
    return ""


@dataclass
class _Priced:
    """Overrides not saved yet, as `prices_for` reads a workspace's."""

    price_overrides: Any


def _check(key: str, entry: Mapping[str, Any], overrides: dict[str, Any]) -> None:
    """The override as the fold will take it, under both rules a workspace's runs are priced by:
    ours, and Little Workflow's for imported runs (its registry prices fewer models, so a model
    known to ours may be new to it, and then needs input and output)."""
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidPriceOverride({"key": f"a model is at most {MAX_KEY_LENGTH} characters"})
    problem = key_problem(key)
    if problem:
        raise InvalidPriceOverride({"key": problem})
    if not entry:
        raise InvalidPriceOverride({"entry": "give at least one rate to override"})
    for rules in (NATIVE, LITTLE_WORKFLOW):
        table = prices_for(_Priced({}), rules=rules)
        problems = override_problems(key, entry, table.rates)
        if problems and rules == LITTLE_WORKFLOW:
            problems = {
                name: f"{key} is not in Little Workflow's registry, which prices the runs imported from it: "
                "give both input and output"
                for name in problems
            }
        if problems:
            raise InvalidPriceOverride(problems)
        try:
            table.with_overrides(overrides)
        except InvalidOverride as exc:  # another model's override, stored before overrides were checked
            raise InvalidPriceOverride({"entry": f"the workspace's other overrides are refused: {exc}"}) from None


def _save(
    workspace: Workspace,
    key: str,
    entry: Mapping[str, Any] | None,
    *,
    by: audit.Actor | AbstractBaseUser,
    reason: str,
) -> bool:
    """Set (`entry`) or remove (None) one model's override under the workspace's row lock."""
    reason = written(reason, field="reason", label="reason", required=False, workspace=workspace)
    ws = Workspace.objects.select_for_update().select_related("tenant").get(pk=workspace.pk)
    overrides = dict(ws.price_overrides or {})
    # One entry per model: a key stored in other letters (before they were checked) goes.
    same = [k for k in overrides if str(k).lower() == key]
    before = overrides[same[0]] if same else None
    for k in same:
        del overrides[k]
    if entry is not None:
        overrides[key] = dict(entry)
        _check(key, entry, overrides)
    if before == entry:
        return False
    ws.price_overrides = overrides
    ws.save(update_fields=["price_overrides"])
    repricing.restart_open(ws)  # a reprice under way ends on this table, not the one it began with
    audit.record(
        actor=by,
        tenant=ws.tenant,
        workspace=ws,
        action=audit.Action.PRICE_OVERRIDES_CHANGED,
        target=f"workspace:{ws.tenant.slug}/{ws.slug}",
        reason=reason,
        details={"model": key, "before": before, "after": entry},
    )
    workspace.price_overrides = overrides
    return True


@transaction.atomic
def set_override(
    *,
    workspace: Workspace,
    key: str,
    rates: Mapping[str, Any],
    by: audit.Actor | AbstractBaseUser,
    reason: str = "",
) -> bool:
    """Override one model's rates here (`input`, `cachedInput`, `output`, USD per 1M tokens;
    `cachedInput: None` drops a cache rate), replacing its earlier override; a model the shipped
    table does not price needs input and output. InvalidPriceOverride (nothing changed) when the
    fold would refuse it; False when it is the override in force already."""
    if not isinstance(key, str):
        raise InvalidPriceOverride({"key": "a model is provider/modelId"})
    entry = {name: rates[name] for name in RATES if name in rates}
    return _save(workspace, key.strip().lower(), entry, by=by, reason=reason)


@transaction.atomic
def remove_override(*, workspace: Workspace, key: str, by: audit.Actor | AbstractBaseUser, reason: str = "") -> bool:
    """The shipped rates again for one model (a model only the workspace priced is unpriced
    again); False when it had no override."""
    return _save(workspace, key.strip().lower(), None, by=by, reason=reason)
