"""Folded states for reads: the state of a run after event N without folding events 1..N.

A read asks `state_after(run, upto)`. The answer is the fold of events 1..upto, got from the
nearest state below it and the events after that state only:

- a process-local cache of the states reads asked for last (`READS`), so a page opened twice, or a
  live run whose page follows it, folds only the events appended since;
- stored snapshots (`FoldSnapshot` rows): the state after every `EVERY`-th event, written lazily
  by the read that first folds past that event, so a process that has never seen the run (or a
  state-at-N far from the newest) folds at most `EVERY` events after loading one.

Snapshots are a projection: each is the fold of its prefix, which never changes (the log is
append-only, and its events are never updated: ledger/dbguards.py). They are keyed by the price
table's version (a new table folds from scratch), deleted with their run, thrown away by
`ledger rebuild` and compared with the fold of the log by `ledger verify` (`check`). A state
handed out here is shared with other readers: callers never change it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson
from django.db import IntegrityError, transaction

from ..fold import RunState, RunStateMismatch, advance, fold, fold_into
from ..fold.pricing import PriceTable, prices_of
from ..models import FoldSnapshot, Run
from .envelopes import read_envelopes
from .states import weight

# Events between two stored snapshots: a read folds at most this many after loading one.
EVERY = 5_000
# What the read cache may hold in all, in records (states.weight: a step, a call, a cost entry
# …, about 1 kB each): 64 MB, the append cache's budget again.
READ_BUDGET = 64_000
READ_RUNS = 64


class _Key(NamedTuple):
    run_pk: int
    run_id: str
    created: str  # with the pk: a run deleted and another made in its row is another run
    version: str


def _key(run: Run, prices: PriceTable) -> _Key:
    return _Key(run.pk, run.run_id, run.created_at.isoformat() if run.created_at else "", prices.version)


class _ReadCache:
    """Recently read states, by run and sequence; least recent out first, within a budget."""

    def __init__(self, budget: int = READ_BUDGET, runs: int = READ_RUNS) -> None:
        self._states: OrderedDict[tuple[_Key, int], RunState] = OrderedDict()
        self._weights: dict[tuple[_Key, int], int] = {}
        self._lock = threading.Lock()
        self.budget = budget
        self.runs = runs
        self.held = 0

    def best(self, key: _Key, upto: int) -> RunState | None:
        """The cached state of the run nearest below or at `upto`."""
        with self._lock:
            found = [(s, k) for k in self._states if k[0] == key and (s := k[1]) <= upto]
            if not found:
                return None
            _, best = max(found)
            self._states.move_to_end(best)
            return self._states[best]

    def put(self, key: _Key, state: RunState) -> None:
        entry = (key, state.last_sequence)
        records = weight(state)
        with self._lock:
            if entry in self._states or records > self.budget:
                return
            self._states[entry] = state
            self._weights[entry] = records
            self.held += records
            while len(self._states) > self.runs or self.held > self.budget:
                old, _ = self._states.popitem(last=False)
                self.held -= self._weights.pop(old)

    def drop(self, run_pk: int) -> None:
        with self._lock:
            for entry in [e for e in self._states if e[0].run_pk == run_pk]:
                del self._states[entry]
                self.held -= self._weights.pop(entry)

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._weights.clear()
            self.held = 0


READS = _ReadCache()


def _stored(run: Run, version: str, upto: int) -> RunState | None:
    """The stored snapshot of the run nearest below or at `upto`."""
    row = (
        FoldSnapshot.objects.filter(run=run, price_version=version, sequence__lte=upto)
        .order_by("-sequence")
        .values_list("state", flat=True)
        .first()
    )
    return None if row is None else RunState.from_json(orjson.loads(bytes(row)))


def _store(run: Run, version: str, state: RunState) -> None:
    """Keep `state` as a snapshot; another reader storing the same one first is no error."""
    try:
        with transaction.atomic():
            FoldSnapshot.objects.create(
                run=run,
                sequence=state.last_sequence,
                price_version=version,
                state=orjson.dumps(state.to_json()),
            )
    except IntegrityError:
        pass


def state_after(run: Run, upto: int | None = None) -> RunState:
    """The fold of the run's events 1..`upto` (default: all of them), from the nearest cached or
    stored state below it; snapshots passed on the way are stored. Never change what it returns."""
    last = run.last_sequence
    target = last if upto is None else max(0, min(upto, last))
    if target == 0:
        return RunState(run_id=run.run_id)
    prices = prices_of(run)
    key = _key(run, prices)
    state = READS.best(key, target)
    if state is None or state.last_sequence < target - target % EVERY:
        stored = _stored(run, prices.version, target)
        if stored is not None and (state is None or stored.last_sequence > state.last_sequence):
            state = stored
            READS.put(key, state)
    if state is not None and state.last_sequence == target:
        return state
    begun = 0 if state is None else state.last_sequence
    events = read_envelopes(run, after=begun, limit=target - begun)
    offset = 0
    while offset < len(events):
        stop = min(len(events), (begun + offset) // EVERY * EVERY + EVERY - begun)
        chunk = events[offset:stop]
        state = (
            fold(chunk, prices=prices, run_id=run.run_id) if state is None else fold_into(state, chunk, prices=prices)
        )
        offset = stop
        if state.last_sequence % EVERY == 0:
            _store(run, prices.version, state)
    assert state is not None
    READS.put(key, state)
    return state


def forget(run: Run) -> None:
    """Throw the run's snapshots away, stored and cached (`ledger rebuild`)."""
    FoldSnapshot.objects.filter(run=run).delete()
    READS.drop(run.pk)


def check(run: Run, log: Sequence[Mapping[str, Any]]) -> list[str]:
    """What is wrong with the run's stored snapshots: each must equal the fold of its prefix of
    `log` (the run's whole log, read by `ledger verify`)."""
    problems = []
    rows = FoldSnapshot.objects.filter(run=run).order_by("sequence").values_list("sequence", "price_version", "state")
    prices = prices_of(run)
    folded = RunState(run_id=run.run_id)  # advanced along the log, one snapshot to the next
    for sequence, version, raw in rows:
        if version != prices.version:
            continue  # folded with another price table: no read uses it
        if sequence > len(log):
            problems.append(f"snapshot at event {sequence}: the log has {len(log)} events")
            continue
        try:
            advance(folded, log[folded.last_sequence : sequence], prices=prices)
        except RunStateMismatch:
            return [*problems, "the log cannot be folded up to the snapshots"]
        try:
            stored = RunState.from_json(orjson.loads(bytes(raw)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append(f"snapshot at event {sequence} cannot be read: {exc}")
            continue
        if stored != folded:
            problems.append(f"snapshot at event {sequence} differs from the fold of events 1..{sequence}")
    return problems
