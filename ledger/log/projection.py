"""Projections: the Run, Step, ToolCall and CostEntry rows, written from the fold.

There is one implementation of what a log means, `ledger.fold`. This module only turns a
RunState into rows: inside the append transaction for the events just written (`batch_changes`,
written by `write` or, on PostgreSQL, inside the append's one statement: ledger/log/pgappend.py), from
scratch (`rebuild`), and for comparison (`differences`, used by `ledger verify`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import islice
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

import orjson
from django.db import connection, transaction

from . import rollup
from ..fold import RunState, ToolCallState, fold
from ..models import CostEntry, Run, Step, ToolCall, Workspace
from .bulk import column, insert_rows, table, upsert_rows
from ..fold.pricing import PriceTable, UsageTotals, load_default_prices

MONEY_PLACES = Decimal("1e-12")
# SQLite hands decimals back through a 15-digit float; compare money at a precision both keep.
COMPARE_PLACES = Decimal("1e-9")


def prices_for(workspace: Workspace) -> PriceTable:
    table = load_default_prices()
    return table.with_overrides(workspace.price_overrides) if workspace.price_overrides else table


# --- a process-local cache of folded states ------------------------------------------------


class Cached(NamedTuple):
    run_pk: int
    version: str  # of the price table the state was folded with
    state: RunState


# A cached state is compacted once it holds this many per-call records (model calls, tool calls,
# cost entries): what an append needs of a long run is its head, its steps and open model calls;
# its settled calls and cost entries stay in the database.
COMPACT_AT = 1_000
# What the cache may hold in all, estimated at RECORD_BYTES per record (a model call with its
# response, a tool call with its arguments, a cost entry: about 1 kB each, bench/memory.py).
BUDGET_BYTES = 64 * 1024 * 1024
RECORD_BYTES = 1_000


@dataclass(eq=False, slots=True)
class AppendState(RunState):
    """A RunState compacted for the append path only (`compact`): the model calls still waiting
    for their answer, no cost entries, no tool calls. A tool call a later batch names is read
    back from its projection row (`restore_tool_calls`) before the batch is folded, so the rows an
    append writes are the ones the full fold gives (tests/test_state_cache.py). Never compared
    with a fold, never shown: `ledger verify`, rebuilds and pages fold the log."""

    tool_calls_dropped: int = 0  # tool calls left out: positions of new calls count them


def compact(state: RunState) -> RunState:
    """`state` as the cache keeps it: itself while small, else an AppendState."""
    held = len(state.model_calls) + len(state.tool_calls) + len(state.cost_entries)
    if held < COMPACT_AT:
        return state
    values = {f.name: getattr(state, f.name) for f in fields(RunState)}
    pending = [state.model_calls[i] for i in state.pending_model_calls]
    values.update(model_calls=pending, pending_model_calls=list(range(len(pending))), cost_entries=[],
                  tool_calls={})
    dropped = getattr(state, "tool_calls_dropped", 0) + len(state.tool_calls)
    return AppendState(**values, tool_calls_dropped=dropped)


def tool_call_count(state: RunState) -> int:
    """How many tool calls the run has had: those the state holds and those compaction left out."""
    return len(state.tool_calls) + getattr(state, "tool_calls_dropped", 0)


def restore_tool_calls(run_pk: int, state: RunState, items: Iterable[tuple[str, Any]], *,
                       started_new: bool = False) -> tuple[str, ...]:
    """Put back into a compacted `state` the tool calls that the batch `items` ((type, payload)
    pairs) names and it left out, from their projection rows (by the unique (run, call_id)).

    With `started_new`, a call whose first event in the batch is its start is taken to be new and
    not read; the ids so taken are returned, and the caller's write must hold only if none of
    them has a row (pgappend.Guard.new_calls: a repeated start of a call compaction left out,
    the gateway re-claiming it, then misses and the locked path reads it). A batch of new calls,
    the common case, then costs no read at all."""
    if not getattr(state, "tool_calls_dropped", 0):
        return ()
    first: dict[str, bool] = {}  # call id -> its first event in the batch is its start
    for type_, payload in items:
        if type_.startswith("harness.tool_call.") and isinstance(payload, Mapping):
            call_id = payload.get("callId")
            if isinstance(call_id, str) and call_id and call_id not in first and call_id not in state.tool_calls:
                first[call_id] = type_ == "harness.tool_call.started"
    assumed = tuple(c for c, starts in first.items() if starts) if started_new else ()
    wanted = [c for c, starts in first.items() if not (starts and started_new)]
    if wanted:
        _read_tool_calls(run_pk, state, wanted)
    return assumed


def _read_tool_calls(run_pk: int, state: RunState, call_ids: Sequence[str]) -> None:
    # A plain cursor and orjson: the ORM's rows and json.loads cost more than the query.
    columns = ", ".join(f"CAST({column(ToolCall, n)} AS text)" if n in _TOOL_JSON else column(ToolCall, n)
                        for n in _TOOL_COLUMNS)
    marks = ", ".join(["%s"] * len(call_ids))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {table(ToolCall)} WHERE {column(ToolCall, 'run')} = %s "
                       f"AND {column(ToolCall, 'call_id')} IN ({marks}) ORDER BY {column(ToolCall, 'position')}",
                       [run_pk, *call_ids])
        rows = cursor.fetchall()
    for (call_id, tool_name, args, caller, turn, step_path, status, result, error, duration_ms, reconciled,
         origin, started_sequence, ended_sequence) in rows:
        # tool_fields in reverse: the fold never holds "" where a row holds it for None.
        state.tool_calls[call_id] = ToolCallState(
            call_id=call_id, tool_name=tool_name or None, args=_json(args), caller=caller or None, turn=turn,
            step_path=step_path or None, status=status, result=_json(result), error=_json(error),
            duration_ms=duration_ms, reconciled=bool(reconciled), origin=origin or None,
            started_sequence=started_sequence, ended_sequence=ended_sequence)
        state.tool_calls_dropped -= 1  # type: ignore[attr-defined]


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an integer beyond 64 bits: the standard library reads it
        return json.loads(text)


_TOOL_COLUMNS = ("call_id", "tool_name", "args", "caller", "turn", "step_path", "status", "result", "error",
                 "duration_ms", "reconciled", "origin", "started_sequence", "ended_sequence")
_TOOL_JSON = frozenset({"args", "result", "error"})


def weight(state: RunState) -> int:
    """The records a state holds, what the cache's budget counts."""
    return (1 + len(state.steps) + len(state.model_calls) + len(state.tool_calls) + len(state.cost_entries)
            + len(state.sessions) + len(state.artifacts) + len(state.parallel_groups)
            + len(state.outer_loop_cycles) + len(state.divergences))


class _StateCache:
    """Recently folded states, so an append folds only its own batch.

    Keyed by workspace and run id, so that an append can guess the run's row and last sequence
    without a query. A guess is only ever used where the database confirms it: under the run's
    row lock (`state_for_append`), or in the condition of the head update itself (ledger/
    pgappend.py), so a state from before another process appended is never used. A state is
    taken out while a transaction advances it and put back only after commit, so a rolled-back
    batch can never leave it half-applied.

    Bounded twice: at most `size` runs, and at most `budget` bytes (estimated, RECORD_BYTES a
    record); least recent out first. A long run's state is compacted (`compact`) when it is put
    back, so one run of a million events weighs what its steps do, not what its calls do.
    """

    def __init__(self, size: int = 512, budget: int = BUDGET_BYTES) -> None:
        self._states: OrderedDict[tuple[int, str], Cached] = OrderedDict()
        self._weights: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self.size = size
        self.budget = budget
        self.held = 0  # records, the sum of _weights

    def take(self, workspace_pk: int, run_id: str, version: str) -> Cached | None:
        key = (workspace_pk, run_id)
        with self._lock:
            entry = self._states.pop(key, None)
            self.held -= self._weights.pop(key, 0)
        return entry if entry is not None and entry.version == version else None

    def put(self, workspace_pk: int, run_id: str, entry: Cached) -> None:
        key = (workspace_pk, run_id)
        entry = entry._replace(state=compact(entry.state))
        records = weight(entry.state)
        limit = self.budget // RECORD_BYTES
        with self._lock:
            self.held -= self._weights.pop(key, 0)
            self._states.pop(key, None)
            if records > limit:
                return  # alone over the budget: the next append folds the log
            self._states[key] = entry
            self._weights[key] = records
            self.held += records
            while len(self._states) > self.size or self.held > limit:
                old, _ = self._states.popitem(last=False)
                self.held -= self._weights.pop(old)

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._weights.clear()
            self.held = 0


STATES = _StateCache()


def log_of(run: Run, *, upto: int | None = None) -> list[dict[str, Any]]:
    """The run's envelopes, in order, straight from the log (up to sequence `upto`: a prefix;
    sequences are dense from 1, so that is the first `upto` rows)."""
    from .envelopes import read_envelopes

    return read_envelopes(run, limit=upto)


def state_for_append(run: Run, prices: PriceTable) -> RunState:
    """The state at the run's last sequence; the caller holds the run's row lock."""
    if run.last_sequence == 0:
        return RunState(run_id=run.run_id)
    cached = STATES.take(run.workspace_id, run.run_id, prices.version)
    if cached is not None and cached.run_pk == run.pk and cached.state.last_sequence == run.last_sequence:
        return cached.state
    return fold(log_of(run), prices=prices)


def remembering(run: Run, prices: PriceTable, state: RunState) -> Callable[[], None]:
    """What keeps `state` as the run's cached state; to be called once its batch has committed."""
    entry = Cached(run.pk, prices.version, state)
    workspace_id, run_id = run.workspace_id, run.run_id
    return lambda: STATES.put(workspace_id, run_id, entry)


# --- rows from state -----------------------------------------------------------------------


def _when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _money(value: Decimal | None) -> Decimal | None:
    return None if value is None else value.quantize(MONEY_PLACES)


def _usage(usage: UsageTotals) -> dict[str, Any]:
    return {
        "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
        "cached_input_tokens": usage.cached_input_tokens, "reasoning_tokens": usage.reasoning_tokens,
        "cost_usd": _money(usage.cost_usd), "priced_calls": usage.priced_calls,
        "unpriced_calls": usage.unpriced_calls,
    }


def root_run_id(workspace_id: int, parent_run_id: str | None) -> str:
    if not parent_run_id:
        return ""
    parent = Run.objects.filter(workspace_id=workspace_id, run_id=parent_run_id).values_list(
        "root_run_id", flat=True).first()
    return parent or parent_run_id


def run_fields(state: RunState) -> dict[str, Any]:
    """The Run row's projected columns, except root_run_id (which needs the parent's row)."""
    return {
        "status": state.status, "workflow_version_id": state.workflow_version_id or "",
        "label": state.label or "", "started_at": _when(state.started_at),
        "finished_at": _when(state.finished_at), "input": state.input, "output": state.output,
        "output_ref": state.output_ref or "", "error": state.error,
        "parent_run_id": state.parent_run_id or "",
        "replay_of": state.replay_of or "", "event_count": state.event_count,
        "last_sequence": state.last_sequence, **_usage(state.usage),
    }


def all_run_fields(run: Run, state: RunState) -> dict[str, Any]:
    return {**run_fields(state), "root_run_id": root_run_id(run.workspace_id, state.parent_run_id)}


def step_fields(state: RunState, path: str, position: int) -> dict[str, Any]:
    step = state.steps[path]
    return {
        "step_path": path, "position": position, "status": step.status, "visit": step.visit,
        "attempts": [
            {"attempt": a.attempt, "status": a.status, "error": a.error,
             "startedAt": a.started_at, "finishedAt": a.finished_at}
            for a in step.attempts
        ],
        "output": step.output, "has_output": step.has_output, "output_ref": step.output_ref or "",
        "artifact_refs": list(step.artifact_refs), "error": step.error,
        "first_sequence": step.first_sequence, "last_sequence": step.last_sequence,
        "started_at": _when(step.started_at), "finished_at": _when(step.finished_at),
        **_usage(step.usage),
    }


def tool_fields(state: RunState, call_id: str, position: int) -> dict[str, Any]:
    call = state.tool_calls[call_id]
    return {
        "call_id": call_id, "position": position, "tool_name": call.tool_name or "",
        "args": call.args, "caller": call.caller or "", "turn": call.turn,
        "step_path": call.step_path or "", "status": call.status, "result": call.result,
        "error": call.error, "duration_ms": call.duration_ms, "reconciled": call.reconciled,
        "origin": call.origin or "", "started_sequence": call.started_sequence,
        "ended_sequence": call.ended_sequence,
    }


def cost_fields(state: RunState, index: int, recorded_at: Mapping[int, str]) -> dict[str, Any]:
    entry = state.cost_entries[index]
    return {
        "sequence": entry.sequence, "call_id": entry.call_id or "", "step_path": entry.step_path or "",
        "provider": entry.provider or "", "model_id": entry.model_id or "",
        "input_tokens": entry.input_tokens, "output_tokens": entry.output_tokens,
        "cached_input_tokens": entry.cached_input_tokens, "reasoning_tokens": entry.reasoning_tokens,
        "cost_usd": _money(entry.cost_usd), "price_table_version": entry.price_table_version,
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


def batch_changes(workspace_id: int, state: RunState, envelopes: Sequence[Mapping[str, Any]],
                  before: Mark) -> Changes:
    """The rows that the batch `envelopes` touched; `state` has already been advanced by it.

    Only changed Run columns are set, only touched steps and tool calls upserted, only new cost
    entries inserted (they are only ever added: one per answered model call, at its sequence).
    """
    new_entries = range(before.cost_entries, len(state.cost_entries))
    cost_paths = {path for i in new_entries if (path := state.cost_entries[i].step_path)}
    recorded_at = {e["sequence"]: e["recordedAt"] for e in envelopes}
    run = {k: v for k, v in run_fields(state).items() if k not in before.run or before.run[k] != v}
    if any(e["type"] == "RunStarted" for e in envelopes):
        run["root_run_id"] = root_run_id(workspace_id, state.parent_run_id)
    cost_entries = [cost_fields(state, i, recorded_at) for i in new_entries]
    new_calls, touched_calls = _touched_tool_calls(state, envelopes, before)
    return Changes(
        run=run,
        steps=[step_fields(state, path, i) for i, (path, step) in enumerate(state.steps.items())
               if step.last_sequence > before.last_sequence or path in cost_paths],
        tool_calls=touched_calls,
        cost_entries=cost_entries,
        daily_usage=rollup.cells(workspace_id, state.workflow_version_id or "", cost_entries),
        new_tool_calls=new_calls,
    )


def _touched_tool_calls(state: RunState, envelopes: Sequence[Mapping[str, Any]], before: Mark,
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows of the calls the batch named (by `callId`): those it started (no row yet), then
    those that have one, without a walk over all of the run's calls. A call new in the batch is
    among the last keys, its position their count before; a call written before keeps its stored
    position (the upsert never sets it: POSITIONED)."""
    new = list(islice(reversed(state.tool_calls), tool_call_count(state) - before.tool_calls))
    positions = {call_id: before.tool_calls + i for i, call_id in enumerate(reversed(new))}
    named = {e["payload"].get("callId") for e in envelopes if isinstance(e.get("payload"), Mapping)}
    return ([tool_fields(state, call_id, position) for call_id, position in positions.items()],
            [tool_fields(state, call_id, 0) for call_id in named if call_id in state.tool_calls
             and call_id not in positions])


# A step's or tool call's position is its order of first appearance: set by the row's first
# write, never by an upsert of a later batch.
POSITIONED = ("position",)


def write(run_pk: int, changes: Changes) -> None:
    """Write `changes` with one statement per table (ledger/log/bulk.py); the appends on PostgreSQL
    write them inside their head statement instead (ledger/log/pgappend.py)."""
    if changes.run:
        Run.objects.filter(pk=run_pk).update(**changes.run)
    upsert_rows(Step, ("run_id", "step_path"), [{"run_id": run_pk, **row} for row in changes.steps],
                keep=POSITIONED)
    insert_rows(ToolCall, [{"run_id": run_pk, **row} for row in changes.new_tool_calls])
    upsert_rows(ToolCall, ("run_id", "call_id"), [{"run_id": run_pk, **row} for row in changes.tool_calls],
                keep=POSITIONED)
    insert_rows(CostEntry, [{"run_id": run_pk, **row} for row in changes.cost_entries])
    rollup.add(changes.daily_usage)


# --- the three uses ------------------------------------------------------------------------


@transaction.atomic
def rebuild(run: Run) -> RunState:
    """Throw the run's projections away and write them again from the log."""
    run = Run.objects.select_for_update().select_related("workspace").get(pk=run.pk)
    prices = prices_for(run.workspace)
    log = log_of(run)
    state = fold(log, prices=prices, run_id=run.run_id)
    days = rollup.days_of([run.pk]).get(run.workspace_id, set())
    for model in (Step, ToolCall, CostEntry):
        model.objects.filter(run=run).delete()
    recorded_at = {e["sequence"]: e["recordedAt"] for e in log}
    write(run.pk, Changes(
        run=all_run_fields(run, state),
        steps=[step_fields(state, path, i) for i, path in enumerate(state.steps)],
        tool_calls=[tool_fields(state, call_id, i) for i, call_id in enumerate(state.tool_calls)],
        cost_entries=[cost_fields(state, i, recorded_at) for i in range(len(state.cost_entries))],
    ))
    # The days of the old entries and of the new are counted again, whatever the old rows were.
    rollup.recount(run.workspace_id, days | rollup.days_of([run.pk]).get(run.workspace_id, set()))
    STATES.take(run.workspace_id, run.run_id, prices.version)  # drop whatever this process cached for the run
    return state


def _comparable(value: Any) -> Any:
    if isinstance(value, Decimal):
        return value.quantize(COMPARE_PLACES)
    return value


def _compare(label: str, expected: Mapping[str, Any], stored: Mapping[str, Any]) -> list[str]:
    return [
        f"{label}.{name}: projection has {stored.get(name)!r}, the log says {value!r}"
        for name, value in expected.items()
        if _comparable(stored.get(name)) != _comparable(value)
    ]


def differences(run: Run, state: RunState, log: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the stored projections disagree with the fold of the log (empty when equal)."""
    problems: list[str] = []
    expected_run = all_run_fields(run, state)
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
            problems += _compare(f"cost entry @{entry.sequence}", cost_fields(state, i, recorded_at),
                                 stored_costs.pop(entry.sequence))
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
                "sequence", "cost_usd", "price_table_version"):
            if _comparable(before.get(sequence)) != _comparable(cost) or versions.get(sequence) != version:
                changed += 1
        count += 1
    STATES.clear()
    return count, changed
