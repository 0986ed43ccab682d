"""A process-local cache of folded states, so an append folds only its own batch.

The cache is only ever a guess: the locked strategy confirms it under the run's head lock
(`state_for_append`), the one-statement strategies in the condition of their head update
(ledger/log/rules.py HEAD_GUESS), so a state from before another process appended is never used.
Its price table is a guess too, the writer's Workspace's, as are the size limits the append holds
the run to: the same two places hold them to the workspace's stored ones
(rules.take_stored_settings, rules.settings_in_force).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import orjson
from django.db import connection

from ..fold import RunState, ToolCallState, fold
from ..fold.pricing import PriceTable
from ..models import Run, ToolCall
from .bulk import column, table
from .envelopes import log_of


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
    values.update(model_calls=pending, pending_model_calls=list(range(len(pending))), cost_entries=[], tool_calls={})
    dropped = getattr(state, "tool_calls_dropped", 0) + len(state.tool_calls)
    return AppendState(**values, tool_calls_dropped=dropped)


def restore_tool_calls(
    run_pk: int, state: RunState, items: Iterable[tuple[str, Any]], *, started_new: bool = False
) -> tuple[str, ...]:
    """Put back into a compacted `state` the tool calls that the batch `items` ((type, payload)
    pairs) names and it left out, from their projection rows (by the unique (run, call_id)).

    With `started_new`, a call whose first event in the batch is its start is taken to be new and
    not read; the ids so taken are returned, and the caller's write must hold only if none of
    them has a row (statements.Guard.new_calls: a repeated start of a call compaction left out,
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
    columns = ", ".join(
        f"CAST({column(ToolCall, n)} AS text)" if n in _TOOL_JSON else column(ToolCall, n) for n in _TOOL_COLUMNS
    )
    marks = ", ".join(["%s"] * len(call_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {columns} FROM {table(ToolCall)} WHERE {column(ToolCall, 'run')} = %s "
            f"AND {column(ToolCall, 'call_id')} IN ({marks}) ORDER BY {column(ToolCall, 'position')}",
            [run_pk, *call_ids],
        )
        rows = cursor.fetchall()
    for (
        call_id,
        tool_name,
        args,
        caller,
        turn,
        step_path,
        status,
        result,
        error,
        duration_ms,
        reconciled,
        origin,
        started_sequence,
        ended_sequence,
    ) in rows:
        # tool_fields in reverse: the fold never holds "" where a row holds it for None.
        state.tool_calls[call_id] = ToolCallState(
            call_id=call_id,
            tool_name=tool_name or None,
            args=_json(args),
            caller=caller or None,
            turn=turn,
            step_path=step_path or None,
            status=status,
            result=_json(result),
            error=_json(error),
            duration_ms=duration_ms,
            reconciled=bool(reconciled),
            origin=origin or None,
            started_sequence=started_sequence,
            ended_sequence=ended_sequence,
        )
        state.tool_calls_dropped -= 1  # type: ignore[attr-defined]


def _json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # an integer beyond 64 bits: the standard library reads it
        return json.loads(text)


_TOOL_COLUMNS = (
    "call_id",
    "tool_name",
    "args",
    "caller",
    "turn",
    "step_path",
    "status",
    "result",
    "error",
    "duration_ms",
    "reconciled",
    "origin",
    "started_sequence",
    "ended_sequence",
)
_TOOL_JSON = frozenset({"args", "result", "error"})


def weight(state: RunState) -> int:
    """The records a state holds, what the cache's budget counts."""
    return (
        1
        + len(state.steps)
        + len(state.model_calls)
        + len(state.tool_calls)
        + len(state.cost_entries)
        + len(state.sessions)
        + len(state.artifacts)
        + len(state.parallel_groups)
        + len(state.outer_loop_cycles)
        + len(state.divergences)
    )


class _StateCache:
    """Recently folded states, so an append folds only its own batch.

    Keyed by workspace and run id, so that an append can guess the run's row and last sequence
    without a query. A guess is only ever used where the database confirms it: under the run's
    row lock (`state_for_append`), or in the condition of the head update itself (ledger/
    statements.py), so a state from before another process appended is never used. A state is
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
        state = compact(entry.state)
        if state is not entry.state:  # (NamedTuple._replace cost more than the rest of a put)
            entry = Cached(entry.run_pk, entry.version, state)
        records = weight(state)
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


def state_for_append(run: Run, prices: PriceTable) -> RunState:
    """The state at the run's last sequence; the caller holds the run's row lock."""
    state = cached_for_append(run, prices)
    return state if state is not None else folded_for_append(run, prices)


def cached_for_append(run: Run, prices: PriceTable) -> RunState | None:
    """The state at the run's last sequence as this process cached it with `prices` (a new run's
    empty one), None without one; the caller holds the run's row lock."""
    if run.last_sequence == 0:
        return RunState(run_id=run.run_id)
    cached = STATES.take(run.workspace_id, run.run_id, prices.version)
    if cached is not None and cached.run_pk == run.pk and cached.state.last_sequence == run.last_sequence:
        return cached.state
    return None


def folded_for_append(run: Run, prices: PriceTable) -> RunState:
    """The state at the run's last sequence, folded from its log with `prices`."""
    state = fold(log_of(run), prices=prices)
    state.payload_bytes = run.payload_bytes  # the head's counter: the fold does not keep it
    return state


def guess(
    workspace_pk: int, run_id: str, version: str, items: Iterable[tuple[str, Any]]
) -> tuple[Cached | None, tuple[str, ...]]:
    """The run's cached state taken out of the cache (None without one), with the tool calls the
    batch `items` names put back (`restore_tool_calls`, calls the batch starts taken to be new);
    and those new calls' ids, which the write must find without a row."""
    cached = STATES.take(workspace_pk, run_id, version)
    if cached is None:
        return None, ()
    return cached, restore_tool_calls(cached.run_pk, cached.state, items, started_new=True)
