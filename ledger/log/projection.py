"""Projections: the Run, Step, ToolCall and CostEntry rows, written from the fold.

There is one implementation of what a log means, `ledger.fold`. This module only turns a
RunState into rows: inside the append transaction for the events just written (`batch_changes`,
written by `write` or, on PostgreSQL, inside the append's one statement: ledger/log/statements.py), from
scratch (`rebuild`), and for comparison (`differences`, used by `ledger verify`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from itertools import islice
from typing import Any

from django.db import transaction

from ..canonical import NUL_STAND_IN, NotCanonicalizable, canonical_bytes, canonical_json, nul_as_stand_in
from ..errors import UsageTooLarge
from ..fold import RunState, fold
from ..fold.pricing import Tokens, UsageTotals, prices_of
from ..models import CostEntry, Run, Step, ToolCall
from . import rollup, snapshots
from .bulk import insert_rows, upsert_rows
from .envelopes import log_of
from .states import STATES

MONEY_PLACES = Decimal("1e-12")
# The money columns are numeric(24, 12) (ledger/models.py): twelve digits before the point.
MONEY_LIMIT = Decimal(10) ** 12
# SQLite hands decimals back through a 15-digit float; compare money at a precision both keep.
COMPARE_PLACES = Decimal("1e-9")


def tool_call_count(state: RunState) -> int:
    """How many tool calls the run has had: those the state holds and those compaction left out."""
    return len(state.tool_calls) + getattr(state, "tool_calls_dropped", 0)


# --- rows from state -----------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _parsed(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _when(value: str | None) -> datetime | None:
    # A batch's envelopes share one recordedAt, and a run's steps a few timestamps: each text is
    # parsed once (a datetime is immutable), not once per cost entry.
    return _parsed(value) if value else None


def _money(value: Decimal | None) -> Decimal | None:
    if value is None:
        return None
    if not -MONEY_LIMIT < value < MONEY_LIMIT:
        # Refused before any row is written, on both databases alike (PostgreSQL's column would
        # fail the statement; SQLite's adapter the quantize).
        raise UsageTooLarge(
            f"the model calls would cost {value:.2E} USD, more than the {MONEY_LIMIT:,} USD a total "
            "of the ledger holds",
            field="payload.response.usage",
        )
    return value.quantize(MONEY_PLACES)


def _whole(tokens: Tokens) -> int:
    """A token count as the columns keep it: whole. Only a log read by Little Workflow's rules
    has fractions (docs/operations.md § Importing Little Workflow data); the report and the run's state show them exactly."""
    return tokens if isinstance(tokens, int) else math.floor(tokens)


def _usage(usage: UsageTotals) -> dict[str, Any]:
    return {
        "input_tokens": _whole(usage.input_tokens),
        "output_tokens": _whole(usage.output_tokens),
        "cached_input_tokens": _whole(usage.cached_input_tokens),
        "reasoning_tokens": _whole(usage.reasoning_tokens),
        "cost_usd": _money(usage.cost_usd),
        "priced_calls": usage.priced_calls,
        "unpriced_calls": usage.unpriced_calls,
    }


def root_run_id(workspace_id: int, parent_run_id: str | None) -> str:
    if not parent_run_id:
        return ""
    parent = (
        Run.objects.filter(workspace_id=workspace_id, run_id=parent_run_id)
        .values_list("root_run_id", flat=True)
        .first()
    )
    return parent or parent_run_id


def reroot(run: Run, root: str) -> None:
    """`run` just started below `root`: the runs that started before it, naming it (or a run below
    it) as their parent, took its id for their root (`root_run_id`: the parent's row was not there
    to ask); they are below `root` now. A sub-run may be written before its parent: the client's
    outbox and spool deliver runs independently, and `ledger import-little` imports runs in id
    order. In the append's transaction; the index `run_below` finds them."""
    Run.objects.filter(workspace_id=run.workspace_id, root_run_id=run.run_id).exclude(pk=run.pk).update(
        root_run_id=root
    )


def run_fields(state: RunState) -> dict[str, Any]:
    """The Run row's projected columns, except root_run_id (which needs the parent's row)."""
    return {
        "status": state.status,
        "workflow_version_id": state.workflow_version_id or "",
        "label": state.label or "",
        "started_at": _when(state.started_at),
        "finished_at": _when(state.finished_at),
        "input": state.input,
        "output": state.output,
        "output_ref": state.output_ref or "",
        "error": state.error,
        "parent_run_id": state.parent_run_id or "",
        "replay_of": state.replay_of or "",
        "event_count": state.event_count,
        "last_sequence": state.last_sequence,
        "payload_bytes": state.payload_bytes,
        **_usage(state.usage),
    }


def all_run_fields(run: Run, state: RunState) -> dict[str, Any]:
    return {**run_fields(state), "root_run_id": root_run_id(run.workspace_id, state.parent_run_id)}


def step_fields(state: RunState, path: str, position: int) -> dict[str, Any]:
    step = state.steps[path]
    return {
        "step_path": path,
        "position": position,
        "status": step.status,
        "visit": step.visit,
        "attempts": [
            {
                "attempt": a.attempt,
                "status": a.status,
                "error": a.error,
                "startedAt": a.started_at,
                "finishedAt": a.finished_at,
            }
            for a in step.attempts
        ],
        "output": step.output,
        "has_output": step.has_output,
        "output_ref": step.output_ref or "",
        "artifact_refs": list(step.artifact_refs),
        "error": step.error,
        "first_sequence": step.first_sequence,
        "last_sequence": step.last_sequence,
        "started_at": _when(step.started_at),
        "finished_at": _when(step.finished_at),
        **_usage(step.usage),
    }


def tool_fields(state: RunState, call_id: str, position: int) -> dict[str, Any]:
    call = state.tool_calls[call_id]
    return {
        "call_id": call_id,
        "position": position,
        "tool_name": call.tool_name or "",
        "args": call.args,
        "caller": call.caller or "",
        "turn": call.turn,
        "step_path": call.step_path or "",
        "status": call.status,
        "result": call.result,
        "error": call.error,
        "duration_ms": call.duration_ms,
        "reconciled": call.reconciled,
        "origin": call.origin or "",
        "started_sequence": call.started_sequence,
        "ended_sequence": call.ended_sequence,
    }


def cost_fields(state: RunState, index: int, recorded_at: Mapping[int, str]) -> dict[str, Any]:
    entry = state.cost_entries[index]
    # Whole counts (every native log's) as they are, without a call each (_whole).
    input_tokens, output_tokens = entry.input_tokens, entry.output_tokens
    cached, reasoning = entry.cached_input_tokens, entry.reasoning_tokens
    cost = entry.cost_usd
    return {
        "sequence": entry.sequence,
        "call_id": entry.call_id or "",
        "step_path": entry.step_path or "",
        "provider": entry.provider or "",
        "model_id": entry.model_id or "",
        "input_tokens": input_tokens if input_tokens.__class__ is int else _whole(input_tokens),
        "output_tokens": output_tokens if output_tokens.__class__ is int else _whole(output_tokens),
        "cached_input_tokens": cached if cached.__class__ is int else _whole(cached),
        "reasoning_tokens": reasoning if reasoning.__class__ is int else _whole(reasoning),
        "cost_usd": None
        if cost is None
        else cost.quantize(MONEY_PLACES)
        if -MONEY_LIMIT < cost < MONEY_LIMIT
        else _money(cost),
        "price_table_version": entry.price_table_version,
        "priced_as": entry.priced_as or "",
        "usage_reported": entry.usage_reported,
        "recorded_at": _when(recorded_at[entry.sequence]),
    }


@dataclass
class Changes:
    """What a batch (or a rebuild) writes to the projections: the Run columns to set, and whole
    Step, ToolCall and CostEntry rows (field name to value, without run_id), in the fold's order;
    and the new cost entries' daily usage rows to add (ledger/log/rollup.py).

    `new_tool_calls` are the calls the batch started, which have no row yet: inserted, not
    upserted (an upsert's speculative insertion cost the server ~3.5 of ~19 µs a row); the
    `tool_calls` the batch named that have one are upserted."""

    run: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    cost_entries: list[dict[str, Any]] = field(default_factory=list)
    daily_usage: list[dict[str, Any]] = field(default_factory=list)
    new_tool_calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Mark:
    """Where a state stood before a batch advanced it: enough to tell what the batch changed."""

    last_sequence: int
    cost_entries: int
    tool_calls: int
    run: dict[str, Any]

    @classmethod
    def of(cls, state: RunState) -> Mark:
        return cls(state.last_sequence, len(state.cost_entries), tool_call_count(state), run_fields(state))


def batch_changes(
    workspace_id: int, state: RunState, envelopes: Sequence[Mapping[str, Any]], before: Mark, *, whole: bool = True
) -> Changes:
    """The rows that the batch `envelopes` touched; `state` has already been advanced by it.

    Only changed Run columns are set, only touched steps and tool calls upserted, only new cost
    entries inserted (they are only ever added: one per answered model call, at its sequence).

    Not `whole`: a part of a long batch before its last (ledger/log/strategies.py `pipelined`),
    whose run columns, steps and usage cells the last part writes for the whole batch
    (`batch_totals`): only its tool calls and cost entries, and the head's `last_sequence`.
    """
    new_entries = range(before.cost_entries, len(state.cost_entries))
    recorded_at = {e["sequence"]: e["recordedAt"] for e in envelopes}
    cost_entries = [cost_fields(state, i, recorded_at) for i in new_entries]
    new_calls, touched_calls = _touched_tool_calls(state, envelopes, before)
    if not whole:
        return Changes(
            run={"last_sequence": state.last_sequence},
            tool_calls=touched_calls,
            cost_entries=cost_entries,
            new_tool_calls=new_calls,
        )
    cost_paths = {path for i in new_entries if (path := state.cost_entries[i].step_path)}
    run = run_changes(state, before)
    if any(e["type"] == "RunStarted" for e in envelopes):
        run["root_run_id"] = root_run_id(workspace_id, state.parent_run_id)
    return Changes(
        run=run,
        steps=touched_steps(state, before, envelopes, cost_paths),
        tool_calls=touched_calls,
        cost_entries=cost_entries,
        daily_usage=rollup.cells(workspace_id, state.workflow_version_id or "", cost_entries),
        new_tool_calls=new_calls,
    )


def touched_steps(
    state: RunState, before: Mark, envelopes: Sequence[Mapping[str, Any]], cost_paths: set[str]
) -> list[dict[str, Any]]:
    """The rows of the steps the events since `before` (`envelopes`) touched, or that own one of
    `cost_paths` (whose usage totals moved), without a walk over all of the run's steps.

    The fold moves a step's `last_sequence` only for an event whose payload names it
    (`stepPath`, ledger/fold/handlers.py), so only the steps the batch names, and those of
    `cost_paths`, are looked at. The steps are kept in their order of first appearance: a step new
    since `before` is among the last keys, its position their count before; a step written before
    keeps its stored position (the upsert never sets it: POSITIONED)."""
    steps = state.steps
    after = before.last_sequence
    new: list[str] = []
    for path in reversed(steps):
        if steps[path].first_sequence <= after:
            break
        new.append(path)
    new.reverse()
    first = len(steps) - len(new)
    rows = [step_fields(state, path, first + i) for i, path in enumerate(new)]
    named = {
        step_path
        for e in envelopes
        if (isinstance(payload := e.get("payload"), dict) or isinstance(payload, Mapping))
        and isinstance(step_path := payload.get("stepPath"), str)
    }
    for path in sorted((named | cost_paths).difference(new)):
        step = steps.get(path)
        if step is not None and (step.last_sequence > after or path in cost_paths):
            rows.append(step_fields(state, path, 0))
    return rows


def run_changes(state: RunState, before: Mark) -> dict[str, Any]:
    """The Run columns whose projected value moved since `before`."""
    return {k: v for k, v in run_fields(state).items() if k not in before.run or before.run[k] != v}


def batch_totals(
    workspace_id: int,
    state: RunState,
    before: Mark,
    envelopes: Sequence[Mapping[str, Any]],
    entries: Sequence[Mapping[str, Any]],
) -> Changes:
    """What a long batch written in parts writes once, in its last part (ledger/log/strategies.py
    `pipelined`): the Run columns that moved since `before` (where the batch started), the steps
    the batch's `envelopes` touched or that own one of `entries` (its cost entries, rows of
    `cost_fields`), and the usage cells those entries add to."""
    cost_paths = {path for e in entries if (path := e["step_path"])}
    return Changes(
        run=run_changes(state, before),
        steps=touched_steps(state, before, envelopes, cost_paths),
        daily_usage=rollup.cells(workspace_id, state.workflow_version_id or "", entries),
    )


def _touched_tool_calls(
    state: RunState,
    envelopes: Sequence[Mapping[str, Any]],
    before: Mark,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of the calls the batch named (by `callId`): those it started (no row yet), then
    those that have one, without a walk over all of the run's calls. A call new in the batch is
    among the last keys, its position their count before; a call written before keeps its stored
    position (the upsert never sets it: POSITIONED)."""
    new = list(islice(reversed(state.tool_calls), tool_call_count(state) - before.tool_calls))
    positions = {call_id: before.tool_calls + i for i, call_id in enumerate(reversed(new))}
    # A callId that is not a string names no call (a custom event's, or one a type does not list,
    # may be any JSON: a list is not even hashable).
    named = {
        call_id
        for e in envelopes
        if (isinstance(payload := e.get("payload"), dict) or isinstance(payload, Mapping))
        and isinstance(call_id := payload.get("callId"), str)
    }
    return (
        [tool_fields(state, call_id, position) for call_id, position in positions.items()],
        [
            tool_fields(state, call_id, 0)
            for call_id in named
            if call_id in state.tool_calls and call_id not in positions
        ],
    )


# A step's or tool call's position is its order of first appearance: set by the row's first
# write, never by an upsert of a later batch.
POSITIONED = ("position",)


def write(run_pk: int, changes: Changes) -> None:
    """Write `changes` with one statement per table (ledger/log/bulk.py); the appends on PostgreSQL
    write them inside their head statement instead (ledger/log/statements.py)."""
    if changes.run:
        Run.objects.filter(pk=run_pk).update(**changes.run)
    upsert_rows(Step, ("run_id", "step_path"), [{"run_id": run_pk, **row} for row in changes.steps], keep=POSITIONED)
    insert_rows(ToolCall, [{"run_id": run_pk, **row} for row in changes.new_tool_calls])
    upsert_rows(
        ToolCall, ("run_id", "call_id"), [{"run_id": run_pk, **row} for row in changes.tool_calls], keep=POSITIONED
    )
    insert_rows(CostEntry, [{"run_id": run_pk, **row} for row in changes.cost_entries])
    rollup.add(changes.daily_usage)


# --- the three uses ------------------------------------------------------------------------


@transaction.atomic
def rebuild(run: Run) -> RunState:
    """Throw the run's projections away and write them again from the log."""
    run = Run.objects.select_for_update().select_related("workspace").get(pk=run.pk)
    prices = prices_of(run)
    log = log_of(run)
    state = fold(log, prices=prices, run_id=run.run_id)
    state.payload_bytes = payload_bytes_of(log)
    days = rollup.days_of([run.pk]).get(run.workspace_id, set())
    for model in (Step, ToolCall, CostEntry):
        model.objects.filter(run=run).delete()
    recorded_at = {e["sequence"]: e["recordedAt"] for e in log}
    write(
        run.pk,
        Changes(
            run=all_run_fields(run, state),
            steps=[step_fields(state, path, i) for i, path in enumerate(state.steps)],
            tool_calls=[tool_fields(state, call_id, i) for i, call_id in enumerate(state.tool_calls)],
            cost_entries=[cost_fields(state, i, recorded_at) for i in range(len(state.cost_entries))],
        ),
    )
    # The days of the old entries and of the new are counted again, whatever the old rows were.
    rollup.recount(run.workspace_id, days | rollup.days_of([run.pk]).get(run.workspace_id, set()))
    STATES.take(run.workspace_id, run.run_id, prices.version)  # drop whatever this process cached for the run
    snapshots.forget(run)
    return state


def _comparable(value: Any) -> Any:
    """What a column is compared by. Money at a precision both backends keep; a JSON value by its
    canonical text, the form the log's ids are computed over: the double 4.417056118872473e16
    that a writer sent and the integer 44170561188724730 the canonical text reads back as are one
    number, as 1e21 and the 1000000000000000000000 jsonb gives back are
    (tests/test_numbers.py)."""
    if isinstance(value, Decimal):
        return value.quantize(COMPARE_PLACES)
    if isinstance(value, str):
        return value.replace("\x00", NUL_STAND_IN) if "\x00" in value else value
    if isinstance(value, dict | list | float) or (isinstance(value, int) and not isinstance(value, bool)):
        try:
            return nul_as_stand_in(canonical_json(value))
        except NotCanonicalizable:
            return value
    return value


def payload_bytes_of(log: Sequence[Mapping[str, Any]]) -> int:
    """The bytes of the log's stored canonical payloads, counted again: what the write path keeps
    on the head (`Run.payload_bytes`) for LEDGER_MAX_BYTES_PER_RUN."""
    return sum(len(canonical_bytes(e.get("payload"))) for e in log)


def _compare(label: str, expected: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    return [
        f"{label}.{name}: projection has {stored.get(name)!r}, the log says {value!r}"
        for name, value in expected.items()
        if _comparable(stored.get(name)) != _comparable(value)
    ]


def differences(
    run: Run, state: RunState, log: Sequence[Mapping[str, Any]], *, payload_bytes: int | None = None
) -> list[str]:
    """Where the stored projections disagree with the fold of the log (empty when equal). `log`
    holds at least the events of the state's cost entries (for their times); the bytes of the
    whole log's payloads are counted from it unless given (`payload_bytes`: a log proof's)."""
    problems: list[str] = []
    counted = payload_bytes_of(log) if payload_bytes is None else payload_bytes
    expected_run = {**all_run_fields(run, state), "payload_bytes": counted}
    stored_run = Run.objects.filter(pk=run.pk).values(*expected_run).get()
    problems += _compare("run", expected_run, stored_run)

    stored_steps = {r["step_path"]: r for r in Step.objects.filter(run=run).values()}
    for i, path in enumerate(state.steps):
        if path not in stored_steps:
            problems.append(f"step {path}: missing from the projection")
        else:
            problems += _compare(f"step {path}", step_fields(state, path, i), stored_steps.pop(path))
    problems += [f"step {path}: in the projection but not in the log" for path in stored_steps]

    stored_calls = {r["call_id"]: r for r in ToolCall.objects.filter(run=run).values()}
    for i, call_id in enumerate(state.tool_calls):
        if call_id not in stored_calls:
            problems.append(f"tool call {call_id}: missing from the projection")
        else:
            problems += _compare(f"tool call {call_id}", tool_fields(state, call_id, i), stored_calls.pop(call_id))
    problems += [f"tool call {c}: in the projection but not in the log" for c in stored_calls]

    recorded_at = {e["sequence"]: e["recordedAt"] for e in log}
    stored_costs = {r["sequence"]: r for r in CostEntry.objects.filter(run=run).values()}
    for i, entry in enumerate(state.cost_entries):
        if entry.sequence not in stored_costs:
            problems.append(f"cost entry @{entry.sequence}: missing from the projection")
        else:
            problems += _compare(
                f"cost entry @{entry.sequence}", cost_fields(state, i, recorded_at), stored_costs.pop(entry.sequence)
            )
    problems += [f"cost entry @{s}: in the projection but not in the log" for s in stored_costs]
    return problems


def reprice(runs: Iterable[Run]) -> tuple[int, int]:
    """Recompute every cost entry from its recorded tokens with today's prices.

    Returns (runs, cost entries whose dollars or price table changed).
    """
    count = changed = 0
    for run in runs:
        before = dict(CostEntry.objects.filter(run=run).values_list("sequence", "cost_usd"))
        versions = dict(CostEntry.objects.filter(run=run).values_list("sequence", "price_table_version"))
        rebuild(run)
        for sequence, cost, version in CostEntry.objects.filter(run=run).values_list(
            "sequence", "cost_usd", "price_table_version"
        ):
            if _comparable(before.get(sequence)) != _comparable(cost) or versions.get(sequence) != version:
                changed += 1
        count += 1
    STATES.clear()
    return count, changed
