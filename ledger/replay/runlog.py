"""Reads of one run's log for the console's evidence views: the run folded whole or up to an
event (the run at any point), a search of its events, and where its first failure is.

The fold is the one interpretation of a log (docs/design.md §4): the state after event N is
`fold(events 1..N)`, computed when asked and never stored. Every read here is a constant number
of queries however long the run is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db.models import Q, QuerySet

from ..canonical import canonical_json
from ..fold import RunState, fold
from ..fold.pricing import prices_of
from ..fold.state import occurred_at
from ..log import snapshots
from ..log.envelopes import event_envelope, log_of, read_envelopes
from ..models import EVENT_FAILURE, EVENT_IN_DOUBT, Event, Run, ToolCall
from .stored_plan import replay_plan_for

# A tool's results name its call, not the tool: its calls are looked up, as many as this.
TOOL_CALLS_SEARCHED = 200


class _Events(ABC):
    """What the evidence views read of single events: a payload, when its fact happened."""

    @abstractmethod
    def event(self, sequence: int | None) -> dict[str, Any] | None:
        """The event of that sequence, None when there is none."""

    @abstractmethod
    def prefetch(self, sequences: Iterable[int | None]) -> None:
        """Read the events of `sequences` that are not at hand yet, in one query."""

    def payload(self, sequence: int | None) -> Any:
        event = self.event(sequence)
        return None if event is None else event["payload"]

    def recorded_at(self, sequence: int | None) -> str | None:
        event = self.event(sequence)
        value = None if event is None else event["recordedAt"]
        return value if isinstance(value, str) else None

    def occurred_at(self, sequence: int | None) -> str | None:
        """When the event's fact happened: its `occurredAt` (a span's start or end for OTLP), else
        its recordedAt; the times the fold gives runs and steps, so bars and durations agree."""
        event = self.event(sequence)
        if event is None:
            return None
        recorded = event["recordedAt"] if isinstance(event["recordedAt"], str) else None
        payload = event["payload"]
        return occurred_at(payload, recorded) if isinstance(payload, dict) and recorded else recorded


@dataclass(frozen=True)
class FoldedRun(_Events):
    """A run's log (or a prefix of it) and what the fold makes of it."""

    log: list[dict[str, Any]]
    state: RunState

    @property
    def last_sequence(self) -> int:
        return len(self.log)

    def prefetch(self, sequences: Iterable[int | None]) -> None:
        """The whole log is at hand."""

    def event(self, sequence: int | None) -> dict[str, Any] | None:
        """An event of the log (sequences are dense: index = sequence - 1)."""
        if sequence is None or not 0 < sequence <= len(self.log):
            return None
        return self.log[sequence - 1]


@dataclass
class SnapshotRun(_Events):
    """A run's state after event `last_sequence`, from its fold snapshots (ledger/log/snapshots.py),
    and the single events a view asks for, read when asked (`prefetch` them first: one query)."""

    run: Run
    state: RunState
    last_sequence: int
    events: dict[int, dict[str, Any]] = field(default_factory=dict)

    def prefetch(self, sequences: Iterable[int | None]) -> None:
        wanted = {s for s in sequences if s is not None and 0 < s <= self.last_sequence and s not in self.events}
        if wanted:
            self.events.update((e["sequence"], e) for e in read_envelopes(self.run, sequences=wanted))

    def event(self, sequence: int | None) -> dict[str, Any] | None:
        if sequence is None or not 0 < sequence <= self.last_sequence:
            return None
        if sequence not in self.events:
            self.prefetch([sequence])
        return self.events.get(sequence)


def folded(run: Run, *, upto: int | None = None) -> FoldedRun:
    """The run as it is, or as it was after event `upto`: the fold of that prefix."""
    log = log_of(run, upto=upto)
    return FoldedRun(log, fold(log, prices=prices_of(run), run_id=run.run_id))


def snapshot(run: Run, *, upto: int | None = None) -> SnapshotRun:
    """The run as it is, or as it was after event `upto`, from the nearest stored or cached state:
    what the console's views read, at a cost of the events after that state and those they show."""
    last = run.last_sequence if upto is None else max(0, min(upto, run.last_sequence))
    return SnapshotRun(run, snapshots.state_after(run, last), last)


def replay_plan_of(run: Run, run_at: FoldedRun) -> dict[str, Any] | None:
    """The replay plan of the folded log (a prefix gives the plan as it was then)."""
    return replay_plan_for(run, run_at.log) if run_at.log else None


@dataclass(frozen=True)
class EventFilter:
    """What to look for in a run's events; empty fields match everything."""

    type: str = ""  # a prefix of the event type ("harness.tool_call." finds every tool event)
    step: str = ""  # the exact stepPath
    tool: str = ""  # the exact toolName: the calls of that tool and their outcomes
    text: str = ""  # anywhere in the type or the payload, ignoring case

    def __bool__(self) -> bool:
        return bool(self.type or self.step or self.tool or self.text)


def _field_is(name: str, value: str) -> Q:
    """The payload (canonical JSON text, no whitespace) has `"name":value` at some depth."""
    return Q(payload__contains=f"{canonical_json(name)}:{canonical_json(value)}")


def search_events(run: Run, filters: EventFilter, *, after: int = 0, limit: int) -> list[dict[str, Any]]:
    """The run's events after `after` that match every filter, in order, at most `limit`."""
    qs = Event.objects.filter(run=run, sequence__gt=after)
    if filters.type:
        qs = qs.filter(type__startswith=filters.type)
    if filters.step:
        qs = qs.filter(_field_is("stepPath", filters.step))
    if filters.tool:
        call_ids = ToolCall.objects.filter(run=run, tool_name=filters.tool).values_list("call_id", flat=True)[
            :TOOL_CALLS_SEARCHED
        ]
        matches = _field_is("toolName", filters.tool)
        for call_id in call_ids:
            matches |= _field_is("callId", call_id)
        qs = qs.filter(matches)
    if filters.text:
        qs = qs.filter(Q(type__icontains=filters.text) | Q(payload__icontains=filters.text))
    return [event_envelope(e, run.run_id) for e in qs.order_by("sequence")[:limit]]


def jump_targets(run: Run, kind: Literal["failure", "in_doubt"]) -> QuerySet[Event]:
    """The run's failure events, or its in-doubt tool calls (partial indexes event_failures and
    event_in_doubt: the few such events are read, not the run's whole log)."""
    return Event.objects.filter(run=run).filter(EVENT_FAILURE if kind == "failure" else EVENT_IN_DOUBT)


def first_sequence(run: Run, kind: Literal["failure", "in_doubt"]) -> int | None:
    """The sequence of the run's first failure event, or of its first in-doubt tool call."""
    return jump_targets(run, kind).order_by("sequence").values_list("sequence", flat=True).first()


def tool_call_starts(run: Run) -> list[tuple[str, str, str, int | None]]:
    """Every tool call of the run (its projection row): call id, tool, step and the sequence of
    its start, in the order the calls appeared."""
    return list(
        ToolCall.objects.filter(run=run)
        .order_by("position")
        .values_list("call_id", "tool_name", "step_path", "started_sequence")
    )


def children_of(run: Run) -> list[Run]:
    """The run's direct sub-runs (parentRunId), oldest first, with the workspace already loaded."""
    children = list(
        Run.objects.filter(workspace_id=run.workspace_id, parent_run_id=run.run_id).order_by("started_at", "pk")
    )
    for child in children:
        child.workspace = run.workspace
    return children


def state_json(run: Run, *, at: int | None = None) -> dict[str, Any]:
    """The run's folded state after event `at` (default: its last), as `ledger state RUN` and
    `GET /api/v1/runs/{runId}/state` give it: the fold the console's state-at-N view shows,
    `RunState.to_json()` (camelCase; keyed collections as lists in log order; money as decimal
    strings, exact). Little Workflow's `run-state` prints its own materialized state."""
    run_at = folded(run, upto=at)
    return {
        "runId": run.run_id,
        "at": run_at.log[-1]["sequence"] if run_at.log else 0,
        "lastSequence": run.last_sequence,
        "state": run_at.state.to_json(),
    }
