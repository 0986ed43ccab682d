"""`--fail-if`: a condition on an evaluation's aggregates that fails the gate.

Grammar (no eval; a small recursive descent)::

    expr    := term ("or" term)*
    term    := factor ("and" factor)*
    factor  := "not" factor | "(" expr ")" | METRIC OP NUMBER
    OP      := "<" | "<=" | ">" | ">=" | "==" | "!="

METRIC is one of METRICS (docs/evaluations.md "The gate"): e.g.
`pass_rate < 0.95 or cost_delta > 0.10`. A metric with no value (a cost delta when the original
runs had no priced call) makes its comparison false.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import InvalidEvaluation

METRICS = {
    "pass_rate": "share of runs whose every score passed (0..1)",
    "pass_rate_before": "the same for the originals of the runs that ran",
    "pass_rate_delta": "pass_rate - pass_rate_before",
    "mean_score": "mean of every score of the new runs (0..1)",
    "mean_score_delta": "mean score of the new runs minus the originals'",
    "changed_rate": "share of runs whose outcome (status and output) changed",
    "changed": "number of runs whose outcome changed",
    "failed": "number of runs that failed (or did not finish)",
    "cost_delta": "relative change of cost: new / original - 1",
    "latency_delta": "relative change of total duration: new / original - 1",
    "tokens_delta": "relative change of tokens: new / original - 1",
}
OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
NUMBER = r"-?\d+(?:\.\d+)?"
TOKEN = re.compile(rf"\s*(?:(<=|>=|==|!=|<|>|\(|\))|([A-Za-z_][A-Za-z_0-9]*)|({NUMBER}))")
MAX_LENGTH = 500
# Parentheses and `not`s nested deeper than this are refused: the parser recurses per level, and
# 500 characters of "(" went past Python's recursion limit (a 500, not a 400).
MAX_DEPTH = 32

Node = tuple[Any, ...]


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    text = text.strip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise InvalidEvaluation(f"failIf: cannot read {text[pos : pos + 20]!r}", field="failIf")
        out.append(m.group(0).strip())
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def parse(text: str) -> Node:
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_LENGTH:
        raise InvalidEvaluation(f"failIf is a condition of 1 to {MAX_LENGTH} characters", field="failIf")
    tokens = _tokens(text)
    node, rest = _expr(tokens, 0)
    if rest:
        raise InvalidEvaluation(f"failIf: unexpected {rest[0]!r}", field="failIf")
    return node


def _expr(tokens: list[str], depth: int) -> tuple[Node, list[str]]:
    node, tokens = _term(tokens, depth)
    while tokens and tokens[0].lower() == "or":
        right, tokens = _term(tokens[1:], depth)
        node = ("or", node, right)
    return node, tokens


def _term(tokens: list[str], depth: int) -> tuple[Node, list[str]]:
    node, tokens = _factor(tokens, depth)
    while tokens and tokens[0].lower() == "and":
        right, tokens = _factor(tokens[1:], depth)
        node = ("and", node, right)
    return node, tokens


def _factor(tokens: list[str], depth: int) -> tuple[Node, list[str]]:
    if not tokens:
        raise InvalidEvaluation("failIf ends too early", field="failIf")
    head = tokens[0]
    if head.lower() in ("not", "(") and depth >= MAX_DEPTH:
        raise InvalidEvaluation(f"failIf nests parentheses and nots at most {MAX_DEPTH} deep", field="failIf")
    if head.lower() == "not":
        node, rest = _factor(tokens[1:], depth + 1)
        return ("not", node), rest
    if head == "(":
        node, rest = _expr(tokens[1:], depth + 1)
        if not rest or rest[0] != ")":
            raise InvalidEvaluation("failIf: a '(' is not closed", field="failIf")
        return node, rest[1:]
    if head not in METRICS:
        raise InvalidEvaluation(f"failIf: unknown metric {head!r} (known: {', '.join(METRICS)})", field="failIf")
    if len(tokens) < 3 or tokens[1] not in OPS:
        raise InvalidEvaluation(f"failIf: {head} needs a comparison like {head} < 0.95", field="failIf")
    # A number as written (0.95, -1, 3): not nan nor inf, which float() also reads and which would
    # make a comparison that can never hold (a gate that never fails).
    if re.fullmatch(NUMBER, tokens[2]) is None:
        raise InvalidEvaluation(f"failIf: {tokens[2]!r} is not a number", field="failIf")
    number = float(tokens[2])
    return ("cmp", head, tokens[1], number), tokens[3:]


def evaluate(node: Node, metrics: Mapping[str, float | None]) -> bool:
    kind = node[0]
    if kind == "or":
        return evaluate(node[1], metrics) or evaluate(node[2], metrics)
    if kind == "and":
        return evaluate(node[1], metrics) and evaluate(node[2], metrics)
    if kind == "not":
        return not evaluate(node[1], metrics)
    _, name, op, number = node
    value = metrics.get(name)
    return value is not None and OPS[op](float(value), number)


def check(text: str) -> str:
    parse(text)
    return text.strip()
