"""The fold's state: what a run's log means, as plain records (docs/design.md §4).

Records compare by value and by the order of their keyed collections; `RunState.to_json()` and
`from_json()` go through `ledger.fold.codec`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from .codec import dump, keyed_fields, load
from .pricing import Tokens, Usage, UsageTotals

_T = TypeVar("_T")
ARTIFACT_REF_PREFIX = "artifact://"
_VISIT = re.compile(r"\.visit\[(\d+)\]\Z")
# Origins of model calls answered from an earlier run's record rather than by a provider.
REPLAYED_ORIGINS = ("recorded", "simulated")


class RunStateMismatch(ValueError):
    """The events are not one run's dense log (Little Workflow's RunStateEventMismatchError)."""


class _Record:
    """Dataclass equality that also respects the order of keyed collections.

    Steps, tool calls and the like are dicts kept in order of first appearance; plain dict
    equality would call two states with differently ordered steps equal.
    """

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        cls: Any = type(self)
        keyed = keyed_fields(cls)
        for f in fields(self):  # type: ignore[arg-type]
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name in keyed and list(mine) != list(theirs):
                return False
            if mine != theirs:
                return False
        return True

    # The records are slotted dataclasses: a long run holds one per model and tool call, and
    # slots make each smaller and cheaper to build.
    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]


@dataclass(eq=False, slots=True)
class Attempt(_Record):
    attempt: int
    status: str  # running | completed | failed
    error: Any = None
    started_at: str | None = None
    finished_at: str | None = None


@dataclass(eq=False, slots=True)
class StepState(_Record):
    step_path: str
    status: str = "scheduled"  # scheduled | running | completed | failed
    scheduled: bool = False  # a StepScheduled was recorded (other events name the step too)
    step_id: str | None = None
    visit: int | None = None
    attempts: list[Attempt] = field(default_factory=list)
    output: Any = None
    has_output: bool = False  # an output of null is still an output
    output_ref: str | None = None
    artifact_refs: list[str] = field(default_factory=list)
    error: Any = None
    metadata: Any = None
    first_sequence: int = 0
    last_sequence: int = 0
    started_at: str | None = None
    finished_at: str | None = None
    usage: UsageTotals = field(default_factory=UsageTotals)


@dataclass(eq=False, slots=True)
class ParallelBranch(_Record):
    branch_path: str
    status: str = "scheduled"  # scheduled | completed | failed
    item_key: Any = None
    branch_index: int | None = None
    output_ref: str | None = None
    artifact_refs: list[str] = field(default_factory=list)
    error: Any = None
    first_sequence: int = 0
    last_sequence: int = 0


@dataclass(eq=False, slots=True)
class ParallelGroup(_Record):
    step_path: str
    status: str = "running"  # running | completed | failed
    attempt: int | None = None
    branch_count: int | None = None
    max_concurrency: int | None = None
    failure_mode: str | None = None
    fan_in_order: Any = None
    error: Any = None
    branches: dict[str, ParallelBranch] = field(default_factory=dict)
    first_sequence: int = 0
    last_sequence: int = 0


@dataclass(eq=False, slots=True)
class HarnessSession(_Record):
    sequence: int
    step_path: str | None = None
    role: str | None = None
    task: Any = None
    manifest: Any = None
    manifest_hash: str | None = None
    parent_run_id: str | None = None
    attempt: int = 1  # the step attempt the session belongs to
    status: str = "started"  # started | completed | failed
    output: Any = None
    error: Any = None
    ended_sequence: int | None = None


@dataclass(eq=False, slots=True)
class ModelCall(_Record):
    turn: int | None = None
    call_id: str | None = None
    step_path: str | None = None
    status: str = "called"  # called | responded | failed
    provider: str | None = None
    model_id: str | None = None
    usage: Usage | None = None
    cost: Decimal | None = None
    prompt_hash: str | None = None
    response: Any = None  # as recorded: a resume answers the same turn with it
    error: Any = None
    called_sequence: int | None = None
    responded_sequence: int | None = None
    failed_sequence: int | None = None
    origin: str | None = None
    replay_of: str | None = None
    session: int | None = None  # index into RunState.sessions
    # False when the answer's usage gave no token count (pricing.reports_tokens): `cost` is then
    # None, whatever the model's price, and its zero tokens are not a count.
    usage_reported: bool = True


@dataclass(eq=False, slots=True)
class ToolCallState(_Record):
    call_id: str
    tool_name: str | None = None
    args: Any = None
    caller: str | None = None
    turn: int | None = None
    step_path: str | None = None
    status: str = "started"  # waiting_approval | approved | started | succeeded | failed | in_doubt
    result: Any = None
    error: Any = None
    duration_ms: float | None = None
    reconciled: bool = False
    origin: str | None = None
    replay_of: str | None = None
    started_sequence: int | None = None
    ended_sequence: int | None = None
    session: int | None = None
    # A call that needs a human approver (ledger/replay/toolapproval.py): {status: pending | approved |
    # rejected, argsDigest, sequence, by?}, the newest request's; None for every other call.
    approval: Any = None


@dataclass(eq=False, slots=True)
class Artifact(_Record):
    ref: str
    step_path: str | None = None
    name: str | None = None
    content_type: str | None = None
    first_sequence: int = 0
    created_sequence: int | None = None  # the ArtifactCreated event, when there is one
    payload: Any = None


@dataclass(eq=False, slots=True)
class OuterLoopCycle(_Record):
    outer_loop_id: str | None
    cycle_number: int
    supervise: Any = None
    sequence: int = 0


@dataclass(eq=False, slots=True)
class CostEntry(_Record):
    sequence: int
    call_id: str | None
    turn: int | None
    step_path: str | None
    provider: str | None
    model_id: str | None
    input_tokens: Tokens
    output_tokens: Tokens
    cached_input_tokens: Tokens
    reasoning_tokens: Tokens
    cost_usd: Decimal | None
    price_table_version: str
    priced_as: str | None = None  # the price table's entry that priced the call (an alias, an undated id)
    usage_reported: bool = True  # False: no token count recorded (ModelCall.usage_reported), cost None


@dataclass(eq=False, slots=True)
class RunState(_Record):
    run_id: str
    workflow_version_id: str | None = None
    status: str = "pending"  # pending | running | completed | failed
    started_at: str | None = None
    finished_at: str | None = None
    workflow: str | None = None  # the built-in runtime's registered name and definition digest
    workflow_version_hash: str | None = None
    input: Any = None
    input_ref: str | None = None
    output: Any = None
    has_output: bool = False
    output_ref: str | None = None
    error: Any = None
    parent_run_id: str | None = None
    outer_loop_id: str | None = None
    label: str | None = None
    tags: Any = None
    replay_of: str | None = None
    last_sequence: int = 0
    event_count: int = 0
    custom_event_count: int = 0
    # The bytes of the run's stored canonical payloads: kept by the write path (ledger/log/strategies.py
    # `_allocate`), not by the fold, which sees parsed payloads; rebuild and verify count it from the
    # log (ledger/log/projection.py `payload_bytes_of`). Not compared: a fold of the log leaves it 0.
    payload_bytes: int = field(default=0, compare=False)
    usage: UsageTotals = field(default_factory=UsageTotals)
    # Model calls a re-execution served from the original's record (origin recorded|simulated):
    # their tokens, priced for comparison, kept out of `usage` because nothing was spent on them.
    replayed_usage: UsageTotals = field(default_factory=UsageTotals)
    # harness.replay.diverged payloads: calls a re-execution's record could not answer.
    divergences: list[Any] = field(default_factory=list)
    steps: dict[str, StepState] = field(default_factory=dict)
    parallel_groups: dict[str, ParallelGroup] = field(default_factory=dict)
    sessions: list[HarnessSession] = field(default_factory=list)
    model_calls: list[ModelCall] = field(default_factory=list)
    # Indexes into model_calls of calls still waiting for an answer, so pairing an answer costs
    # the number of open calls, not the length of the run.
    pending_model_calls: list[int] = field(default_factory=list)
    tool_calls: dict[str, ToolCallState] = field(default_factory=dict)
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    outer_loop_cycles: list[OuterLoopCycle] = field(default_factory=list)
    cost_entries: list[CostEntry] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """camelCase, JSON-safe, for storing in a projection.

        Keyed collections (steps, tool calls, …) become lists in order, because a jsonb
        column does not keep key order. Money is a decimal string here so the stored state
        round-trips exactly; API shapes with a numeric `costUsd` come from
        `UsageTotals.to_json()`.
        """
        return dump(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunState:
        state = load(cls, data)
        assert isinstance(state, RunState)
        return state


def _builder(cls: type[_T]) -> Callable[..., _T]:
    """A function that builds a `cls` from every field's value, positionally, in field order.

    The fold builds a model call, a cost entry or a tool call for most events of a long run; the
    class call (type call, then the dataclass `__init__`) costs twice what this does: a plain
    function (generated like the dataclass's own `__init__`) that fills the slots. A field added
    to the class is a required argument here too, so no caller can leave one unset.
    """
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    source = (
        f"def build_{cls.__name__}({', '.join(names)}):\n    record = _new(cls)\n"
        + "".join(f"    record.{name} = {name}\n" for name in names)
        + "    return record\n"
    )
    namespace: dict[str, Any] = {"_new": object.__new__, "cls": cls}
    exec(source, namespace)  # noqa: S102 (our own field names)
    built: Callable[..., _T] = namespace[f"build_{cls.__name__}"]
    return built


# (turn, call_id, step_path, status, provider, model_id, usage, cost, prompt_hash, response, error,
#  called_sequence, responded_sequence, failed_sequence, origin, replay_of, session, usage_reported)
build_model_call = _builder(ModelCall)
# (sequence, call_id, turn, step_path, provider, model_id, input_tokens, output_tokens,
#  cached_input_tokens, reasoning_tokens, cost_usd, price_table_version, priced_as, usage_reported)
build_cost_entry = _builder(CostEntry)
# (call_id, tool_name, args, caller, turn, step_path, status, result, error, duration_ms, reconciled,
#  origin, replay_of, started_sequence, ended_sequence, session, approval)
build_tool_call = _builder(ToolCallState)


def visit_index(step_path: str) -> int | None:
    match = _VISIT.search(step_path)
    return int(match.group(1)) if match else None


def next_visit_index(state: RunState, base_path: str, *, max_visits: int) -> int:
    """The visit a decision loop's next pass through `base_path` gets (0 when not a loop)."""
    if max_visits <= 1:
        return 0
    prefix = f"{base_path}.visit["
    return sum(
        1
        for path, step in state.steps.items()
        if path.startswith(prefix) and visit_index(path) is not None and step.status == "completed"
    )


_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z")


def occurred_at(payload: Mapping[str, Any], recorded_at: str | None, field: str = "occurredAt") -> str | None:
    """When an event's fact happened: its payload's `occurredAt` (ISO 8601 UTC, `Z`, up to
    microseconds) when it names a real instant, else when the log recorded it. A writer that
    reports after the fact (OpenTelemetry spans arrive when they end, in batches) says when."""
    value = payload.get(field)
    if isinstance(value, str) and _TIME.fullmatch(value):
        try:
            datetime.fromisoformat(value)
        except ValueError:
            return recorded_at  # a well-formed text naming no day (month 13): ignored, never an error
        return value
    return recorded_at
