"""Folded states for reads: the state of a run after event N without folding events 1..N.

A read asks `state_after(run, upto)`. The answer is the fold of events 1..upto, got from the
nearest state below it and the events after that state only:

- a process-local cache of the states reads asked for last (`READS`), so a page opened twice, or a
  live run whose page follows it, folds only the events appended since;
- stored snapshots (`FoldSnapshot` rows, zlib-compressed JSON), written lazily by the read that
  first folds past them: a ladder at events EVERY, 2·EVERY, 4·EVERY, 8·EVERY … (so the stored
  states of a run weigh about twice its newest state, not the square of its length), and one
  rolling snapshot at the newest multiple of EVERY a read passed, replaced as the run grows. A
  process that has never seen the run folds at most EVERY events after loading the rolling one;
  the state at an earlier event N folds forward from the ladder's rung below N (at most N/2
  events).

Snapshots are a projection: each is the fold of its prefix, which never changes (the log is
append-only, and its events are never updated: ledger/dbguards.py). They are keyed by the price
table's version (a new table folds from scratch), deleted with their run, thrown away by
`ledger rebuild` and compared with the fold of the log by `ledger verify` (`check`). A state
handed out here is shared with other readers: callers never change it.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
from django.db import IntegrityError, transaction

from ..fold import RunState, RunStateMismatch, advance, fold, fold_into
from ..fold.pricing import PriceTable, prices_of
from ..models import FoldSnapshot, LogProof, Run
from .envelopes import read_envelopes
from .states import weight

# Events between two stored snapshots: a read folds at most this many after loading one.
EVERY = 5_000
# What the read cache may hold in all, in records (states.weight: a step, a call, a cost entry
# …, about 1 kB each, bench/memory.py): 200 MB, so that the newest state of a run of 100,000
# events (60,000 records) and a state at an earlier event of it fit together.
READ_BUDGET = 200_000
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
    return None if row is None else decode(row)


def encode(state: RunState) -> bytes:
    return zlib.compress(orjson.dumps(state.to_json()), 1)


def decode(raw: bytes | memoryview) -> RunState:
    return RunState.from_json(orjson.loads(zlib.decompress(bytes(raw))))


def on_ladder(sequence: int) -> bool:
    """EVERY, 2·EVERY, 4·EVERY, …: the snapshots kept for good."""
    rung = sequence // EVERY
    return sequence % EVERY == 0 and rung > 0 and rung & (rung - 1) == 0


def _store(run: Run, version: str, state: RunState, *, rolling: bool) -> None:
    """Keep `state` as a snapshot (with `rolling`, in place of the run's rolling one below it);
    another reader storing the same one first is no error."""
    try:
        with transaction.atomic():
            if rolling:
                below = FoldSnapshot.objects.filter(run=run, price_version=version, sequence__lt=state.last_sequence)
                below.exclude(sequence__in=_ladder_below(state.last_sequence)).delete()
            FoldSnapshot.objects.create(
                run=run, sequence=state.last_sequence, price_version=version, state=encode(state)
            )
    except IntegrityError:
        pass


def _ladder_below(sequence: int) -> list[int]:
    rungs, rung = [], EVERY
    while rung < sequence:
        rungs.append(rung)
        rung *= 2
    return rungs


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
    rolling = target // EVERY * EVERY  # the newest multiple of EVERY this read passes
    offset = 0
    while offset < len(events):
        stop = min(len(events), (begun + offset) // EVERY * EVERY + EVERY - begun)
        chunk = events[offset:stop]
        if state is None:
            state = fold(chunk, prices=prices, run_id=run.run_id)
        elif offset == 0:
            state = fold_into(state, chunk, prices=prices)  # a copy: the state below may be shared
        else:
            advance(state, chunk, prices=prices)  # this read's own copy, not handed out yet
        offset = stop
        at = state.last_sequence
        if at % EVERY == 0 and (on_ladder(at) or (at == rolling and target == last)):
            _store(run, prices.version, state, rolling=not on_ladder(at))
    assert state is not None
    READS.put(key, state)
    return state


class _HeadMemo:
    """Aggregates of a run's projections (step count, costs per model …) as they were at its
    head: the projections change only when an event is appended (the head's sequence moves) or
    when they are rebuilt (`forget`), so a value computed at one head holds until then. Keyed
    like the read cache (a new price table is another key), least recent out first."""

    def __init__(self, size: int = 512) -> None:
        self._values: OrderedDict[tuple[_Key, int, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.size = size

    def get(self, run: Run, name: str, compute: Callable[[], Any]) -> Any:
        entry = (_key(run, prices_of(run)), run.last_sequence, name)
        with self._lock:
            if entry in self._values:
                self._values.move_to_end(entry)
                return self._values[entry]
        value = compute()
        with self._lock:
            self._values[entry] = value
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return value

    def drop(self, run_pk: int) -> None:
        with self._lock:
            for entry in [e for e in self._values if e[0].run_pk == run_pk]:
                del self._values[entry]

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


HEADS = _HeadMemo()


def at_head(run: Run, name: str, compute: Callable[[], Any]) -> Any:
    """`compute()` (an aggregate of the run's projections), remembered for the run's head: what
    a view reads again on every request of an unchanged run. Callers never change the value."""
    return HEADS.get(run, name, compute)


def forget(run: Run) -> None:
    """Throw the run's snapshots away, stored and cached, and its log proof, which vouches for the
    projections being rebuilt (`ledger rebuild`)."""
    FoldSnapshot.objects.filter(run=run).delete()
    LogProof.objects.filter(run=run).delete()
    READS.drop(run.pk)
    HEADS.drop(run.pk)


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
            stored = decode(raw)
        except (ValueError, TypeError, KeyError, AttributeError, zlib.error) as exc:
            problems.append(f"snapshot at event {sequence} cannot be read: {exc}")
            continue
        if stored != folded:
            problems.append(f"snapshot at event {sequence} differs from the fold of events 1..{sequence}")
    return problems
