"""Scorers: registered Python functions that score a new run against its original and the
expected output (docs/evaluations.md "Scorers").

`register_scorer(name, fn)` like `register` of workflows (a workflow module registers its own);
`fn(ctx: ScoreContext) -> Score`. A score is a number in [0, 1] and pass/fail with a reason; a
scorer that only decides pass/fail scores 1.0 or 0.0. Built in:

- `exact`: the output equals the expected output (canonical JSON equality).
- `json_fields`: args `{fields: [dotted paths], tolerance?: number}`: each field equal, numbers
  within `tolerance` (absolute); the score is the share of fields that match.
- `regex`: args `{pattern, field?}`: the output (or one dotted field of it) as text matches (RE2).
- `model_graded`: args `{provider, model, rubric?}`: a model of the provider registry
  (ledger/runtime/providers.py) is asked whether the output meets the expected one and answers
  `PASS`/`FAIL` or a number in [0, 1] first, then its reason.

Paid calls. A scorer, built in or registered, pays for a model call by asking a model of the
provider registry (`grader_model`, or `provider_for` itself). While a scorer runs every such
model is metered (`run_scorer`): before each call leaves, the evaluation's budget is asked and a
refused call raises `PaidCallRefused` without asking the provider (the score fails with the
budget's reason, whatever the scorer does with the exception); after it, its tokens are priced
like any live call and its dollars count in the evaluation's spend at once. What a call costs:
- a reply: its price, or unknown (no price for the model, or no usage reported);
- a failure of the provider after the request left, or may have left (an HTTP error, a timeout,
  a reply it could not read, any exception it raises that does not say otherwise): unknown. The
  provider may have charged for it; counting it 0 would let a ceiling be passed unseen;
- a failure before any request left (the scorer refused its input itself, no such provider, the
  budget refused it, or the provider says nothing was sent: model.request_left): nothing.
A call of unknown cost counts as unpriced: it stops the evaluation under a ceiling like an
unpriced call of its runs (budget.py). A scorer that made no call through the registry may still
report calls it paid another way in its Score's `usage` and `cost_usd` (None: unknown); those
count after it returns, and no budget is asked before them.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import re2

from ..canonical import digest
from ..fold.pricing import price_recorded, prices_for
from ..models import Workspace
from ..redaction import compile_linear
from ..runtime.model import ModelProvider, ModelReply, ModelRequest, request_left
from ..runtime.providers import ScriptedProvider, provider_for, wrapping
from ..runtime.registry import load_modules
from .errors import InvalidEvaluation


@dataclass(frozen=True)
class ScoreContext:
    workspace: Workspace
    run_id: str  # the run scored: the new run, or the original for the score "before"
    output: Any
    expected: Any
    original_output: Any
    args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    value: float
    passed: bool
    reason: str = ""
    # Its paid calls' tokens and dollars (the module's docstring): run_scorer puts those of its
    # calls through the registry here; a scorer sets them only for calls it paid another way.
    usage: Mapping[str, Any] | None = None
    # None when unknown (no price, no token count reported, or failed after the request left), never 0.
    cost_usd: Decimal | None = Decimal(0)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": round(self.value, 6), "passed": self.passed, "reason": self.reason}
        if self.usage is not None:
            out["usage"] = dict(self.usage)
            out["costUsd"] = None if self.cost_usd is None else str(self.cost_usd)
        return out


Scorer = Callable[[ScoreContext], Score]
_SCORERS: dict[str, Scorer] = {}
_CHECKERS: dict[str, Callable[[Mapping[str, Any]], None]] = {}


def register_scorer(name: str, fn: Scorer, *, check_args: Callable[[Mapping[str, Any]], None] | None = None) -> None:
    """Make `name` usable in evaluations; a later registration of the same name replaces it."""
    _SCORERS[name] = fn
    if check_args is not None:
        _CHECKERS[name] = check_args


def unregister_scorer(name: str) -> None:
    _SCORERS.pop(name, None)
    _CHECKERS.pop(name, None)


def _registered() -> dict[str, Scorer]:
    """The scorers, after importing the workflow modules (RUNLEDGER_WORKFLOW_MODULES), where
    docs/evaluations.md says to register your own: as a workflow's name, a scorer's is looked up
    in a process that may not have imported them yet (the API's, the worker's, a CLI's)."""
    load_modules()
    return _SCORERS


def known_scorers() -> list[str]:
    return sorted(_registered())


MAX_ARGS_CHARS = 10_000


def check_specs(value: Any) -> list[dict[str, Any]]:
    """[{name, args}] from a list of names or {name, args?} objects; refuses unknown scorers."""
    if not isinstance(value, list) or not value or len(value) > 10:
        raise InvalidEvaluation("scorers must list 1 to 10 scorers", field="scorers")
    specs = []
    for item in value:
        spec = {"name": item, "args": {}} if isinstance(item, str) else item
        if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
            raise InvalidEvaluation("each scorer is a name or {name, args}", field="scorers")
        args = spec.get("args") or {}
        if not isinstance(args, Mapping):
            raise InvalidEvaluation(f"scorer {spec['name']}: args must be an object", field="scorers")
        # Args are kept on the evaluation and echoed in its scores' reasons, once per run and side.
        if len(json.dumps(args, ensure_ascii=False, default=str)) > MAX_ARGS_CHARS:
            raise InvalidEvaluation(
                f"scorer {spec['name']}: args are at most {MAX_ARGS_CHARS} characters of JSON", field="scorers"
            )
        if spec["name"] not in _registered():
            raise InvalidEvaluation(
                f"no scorer named {spec['name']!r} is registered (known: {known_scorers()})", field="scorers"
            )
        checker = _CHECKERS.get(str(spec["name"]))
        if checker is not None:
            checker(args)
        specs.append({"name": str(spec["name"]), "args": dict(args)})
    if len({s["name"] for s in specs}) != len(specs):
        raise InvalidEvaluation("a scorer is listed twice", field="scorers")
    return specs


# --- paid calls ---------------------------------------------------------------------------------


class PaidCallRefused(Exception):
    """Raised to a scorer instead of a model call its evaluation's budget refuses: the provider
    was not asked."""


@dataclass(frozen=True)
class Spending:
    """What a scorer's paid calls answer to (an evaluation's budget: evaluations._spending).
    `refusal()`: why the next call may not be made, or None; `spent(cost)`: one call's dollars
    once known, None when unknown, added at once so that the next `refusal()` sees them."""

    refusal: Callable[[], str | None]
    spent: Callable[[Decimal | None], None]


UNMETERED = Spending(refusal=lambda: None, spent=lambda cost: None)  # outside an evaluation


@dataclass
class _Tally:
    """The paid calls of one scorer's verdict."""

    workspace: Workspace
    spending: Spending
    calls: int = 0
    unpriced: int = 0
    cost_usd: Decimal = Decimal(0)
    usage: dict[str, int] = field(default_factory=dict)
    refused: str | None = None

    def count(self, usage: Mapping[str, Any], cost: Decimal | None) -> None:
        self.calls += 1
        for key, tokens in usage.items():
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self.usage[key] = self.usage.get(key, 0) + tokens
        if cost is None:
            self.unpriced += 1
        else:
            self.cost_usd += cost
        self.spending.spent(cost)


# The verdict being made in this context: a model a scorer kept from an earlier verdict (in a
# global, say) counts toward the one asking now, not toward the evaluation it was made for.
_TALLY: ContextVar[_Tally | None] = ContextVar("scorer_tally", default=None)


class _Metered:
    """A model of the registry, asked by a scorer: checked before each call, counted after."""

    def __init__(self, inner: ModelProvider) -> None:
        self.inner = inner
        self.name, self.model_id = inner.name, inner.model_id

    def generate(self, request: ModelRequest) -> ModelReply:
        tally = _TALLY.get()
        if tally is None:  # outside a scorer's verdict: nobody pays
            return self.inner.generate(request)
        refusal = tally.spending.refusal()
        if refusal is not None:
            tally.refused = refusal
            raise PaidCallRefused(refusal)
        try:
            reply = self.inner.generate(request)
        except Exception as exc:
            if request_left(exc):
                tally.count({}, None)  # it may have been charged: unknown, never 0
            raise
        usage = dict(reply.usage)
        try:
            cost = price_recorded(usage, self.name, self.model_id, prices_for(tally.workspace))
        except Exception:  # noqa: BLE001 - usage that cannot be priced is of unknown cost, not free
            cost = None
        tally.count(usage, cost)
        return reply


def grader_model(provider: str, model: str) -> ModelProvider:
    """A model of the provider registry for a scorer to ask (a `scripted` provider answers every
    request with FAIL); inside `run_scorer` its calls are paid calls."""
    return provider_for(
        provider=provider,
        model=model,
        current=ScriptedProvider(script=lambda r: {"text": "FAIL no grader script"}, name=provider),
    )


def run_scorer(spec: Mapping[str, Any], ctx: ScoreContext, spending: Spending = UNMETERED) -> Score:
    """One scorer's verdict, its paid calls (the module's docstring) checked and counted with
    `spending`; a scorer that raises fails with the exception as its reason."""
    tally = _Tally(ctx.workspace, spending)
    token = _TALLY.set(tally)
    try:
        with wrapping(_Metered):
            score = _registered()[spec["name"]](ctx)
    except Exception as exc:  # noqa: BLE001 - a broken scorer is a failed score, not a broken evaluation
        score = Score(0.0, False, f"the scorer raised {type(exc).__name__}: {exc}")
    finally:
        _TALLY.reset(token)
    if tally.refused is not None:
        not_made = "the grader was not asked" if not tally.calls else "its next model call was not made"
        score = Score(0.0, False, f"budget_exhausted: {tally.refused}; {not_made}")
    value = min(1.0, max(0.0, float(score.value)))
    if tally.calls:
        cost = None if tally.unpriced else tally.cost_usd  # the verdict's dollars: unknown if one call's are
        return Score(value, bool(score.passed), score.reason, tally.usage, cost)
    reported = _dollars(score.cost_usd)
    if score.usage is not None or reported != 0:
        spending.spent(reported)  # what it paid outside the registry, as it reports it
    return Score(value, bool(score.passed), score.reason, score.usage, reported)


def _dollars(value: Any) -> Decimal | None:
    """A scorer's own `cost_usd` as dollars; what is not a number is unknown."""
    if value is None or isinstance(value, bool):
        return None
    try:
        dollars = value if isinstance(value, Decimal) else Decimal(str(value))
    except ArithmeticError:
        return None
    return dollars if dollars.is_finite() else None


# --- built-ins --------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    try:
        return digest(a) == digest(b)
    except Exception:  # noqa: BLE001 - a value without a canonical form equals nothing
        return False


def exact(ctx: ScoreContext) -> Score:
    if _same(ctx.output, ctx.expected):
        return Score(1.0, True, "the output equals the expected output")
    return Score(0.0, False, "the output differs from the expected output")


_MISSING = object()


def _field(value: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _check_json_fields(args: Mapping[str, Any]) -> None:
    fields = args.get("fields")
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise InvalidEvaluation("json_fields needs args.fields: a list of dotted paths", field="scorers")
    tolerance = args.get("tolerance", 0)
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
        raise InvalidEvaluation("json_fields args.tolerance is a number >= 0", field="scorers")


def json_fields(ctx: ScoreContext) -> Score:
    fields: list[str] = list(ctx.args["fields"])
    tolerance = float(ctx.args.get("tolerance", 0))
    wrong = []
    for path in fields:
        got, want = _field(ctx.output, path), _field(ctx.expected, path)
        if got is _MISSING or want is _MISSING:
            ok = got is want
        elif isinstance(got, int | float) and isinstance(want, int | float) and not isinstance(got, bool):
            ok = abs(float(got) - float(want)) <= tolerance
        else:
            ok = _same(got, want)
        if not ok:
            wrong.append(path)
    share = (len(fields) - len(wrong)) / len(fields)
    if not wrong:
        return Score(1.0, True, f"all {len(fields)} field(s) match")
    return Score(share, False, f"differ: {', '.join(wrong)}")


def _check_regex(args: Mapping[str, Any]) -> None:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise InvalidEvaluation("regex needs args.pattern", field="scorers")
    try:
        _linear(pattern)
    except re2.error as exc:
        raise InvalidEvaluation(
            f"regex args.pattern does not compile as RE2 (no lookaround or backreferences): {exc}", field="scorers"
        ) from None


@functools.lru_cache(maxsize=64)
def _linear(pattern: str) -> Any:
    """A member's pattern runs on RE2, in time linear in the text (a worker scoring a run's output
    never hangs on a pattern that backtracks, e.g. `(a+)+$`)."""
    return compile_linear(pattern)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def regex(ctx: ScoreContext) -> Score:
    value = _field(ctx.output, str(ctx.args.get("field", "")))
    if value is _MISSING:
        return Score(0.0, False, f"the output has no field {ctx.args.get('field')}")
    pattern = str(ctx.args["pattern"])
    shown = pattern if len(pattern) <= 120 else pattern[:119] + "…"
    try:
        found = _linear(pattern).search(_text(value))
    except re2.error:  # checked when the evaluation was made; a pattern stored before RE2 was not
        return Score(0.0, False, f"/{shown}/ is not a pattern RE2 runs")
    if found:
        return Score(1.0, True, f"matches /{shown}/")
    return Score(0.0, False, f"does not match /{shown}/")


def _check_model_graded(args: Mapping[str, Any]) -> None:
    for key in ("provider", "model"):
        if not isinstance(args.get(key), str) or not args.get(key):
            raise InvalidEvaluation(f"model_graded needs args.{key}", field="scorers")


GRADER_SYSTEM = (
    "You grade an AI agent's output against the expected output. Answer PASS or FAIL, or a score "
    "between 0 and 1, first, then one sentence of reason."
)
_VERDICT = re.compile(r"^\s*(PASS|FAIL|[01](?:\.\d+)?)\b[\s:.,-]*(.*)$", re.IGNORECASE | re.DOTALL)


def model_graded(ctx: ScoreContext) -> Score:
    grader = grader_model(str(ctx.args["provider"]), str(ctx.args["model"]))
    content = (
        f"Rubric: {ctx.args.get('rubric') or 'the output says what the expected output says'}\n"
        f"Expected: {_text(ctx.expected)}\nOutput: {_text(ctx.output)}"
    )
    body = {
        "model": grader.model_id,
        "messages": [{"role": "system", "content": GRADER_SYSTEM}, {"role": "user", "content": content}],
        "tools": [],
    }
    reply = grader.generate(ModelRequest(step_path=f"grade:{ctx.run_id}", turn=1, body=body))
    match = _VERDICT.match(reply.text or "")
    if match is None:
        return Score(0.0, False, f"the grader's answer has no verdict: {(reply.text or '')[:200]}")
    word, reason = match.group(1).upper(), match.group(2).strip()[:500]
    value = 1.0 if word == "PASS" else 0.0 if word == "FAIL" else float(word)
    return Score(value, value >= 0.5, reason or word)


register_scorer("exact", exact)
register_scorer("json_fields", json_fields, check_args=_check_json_fields)
register_scorer("regex", regex, check_args=_check_regex)
register_scorer("model_graded", model_graded, check_args=_check_model_graded)
