"""The fold's handlers: one per event type, each advancing a RunState by one event.

`HANDLERS` and `_FAST` (the two types of most of a long run, whose handlers take the payload as
arguments) are the vocabulary: an event type neither names changes only the counters (custom.*
events and types from newer harnesses). `fold_events` is the loop that dispatches them. Payload
fields are read defensively: a field of the wrong type is ignored, never an exception.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .pricing import (
    EXACT,
    LITTLE_WORKFLOW,
    MONEY,
    PriceTable,
    Tokens,
    Usage,
    UsageTotals,
    exact_tokens,
    reports_tokens,
)
from .state import (
    ARTIFACT_REF_PREFIX,
    REPLAYED_ORIGINS,
    Artifact,
    Attempt,
    CostEntry,
    HarnessSession,
    ModelCall,
    OuterLoopCycle,
    ParallelBranch,
    ParallelGroup,
    RunState,
    StepState,
    ToolCallState,
    build_cost_entry,
    build_model_call,
    build_tool_call,
    occurred_at,
    visit_index,
)


@dataclass(slots=True)
class _Event:
    """One event as the handlers read it. Handlers never assign to it; it is not frozen because a
    frozen dataclass pays a call per field on construction, and one is built per event."""

    sequence: int
    at: str | None
    payload: Mapping[str, Any]
    step_path: str | None
    table: PriceTable


_Handler = Callable[[RunState, _Event], None]
# ModelRates.scaled and the price table key that gave it.
_Rates = tuple[int, int, int, int, str]

# What a JSON object may be. isinstance tries dict, what a decoded payload holds, before the Mapping
# ABC, whose check is a Python-level call: several per model call otherwise.
_OBJECT = (dict, Mapping)
_intern = sys.intern
_new = object.__new__
_Decimal = Decimal
# Usage's slot setters: it is frozen, and the fold builds one per model call (pricing._fill_usage).
_set_input, _set_output, _set_cached, _set_reasoning = (
    Usage.__dict__[name].__set__
    for name in ("input_tokens", "output_tokens", "cached_input_tokens", "reasoning_tokens")
)
_MONEY_ADD = MONEY.add
_SCALEB = EXACT.scaleb
_ZERO = Decimal(0)
_UNKNOWN = object()
# A usage object with only these keys has no cached or reasoning counts (Usage.from_payload).
_PLAIN_USAGE = frozenset({"inputTokens", "outputTokens", "totalTokens"})


def apply(state: RunState, event: Mapping[str, Any], table: PriceTable) -> None:
    """Advance `state` by one event (`fold_events` of one)."""
    fold_events(state, (event,), table)


class _Totals:
    """A run's replayed totals while a fold runs: counted in place, built into the record once at
    the end, with the same `MONEY.add` steps in the same order as `add_call`."""

    __slots__ = ("input", "output", "cached", "reasoning", "cost", "priced", "unpriced")

    def __init__(self, start: UsageTotals) -> None:
        self.input, self.output = start.input_tokens, start.output_tokens
        self.cached, self.reasoning = start.cached_input_tokens, start.reasoning_tokens
        self.cost, self.priced, self.unpriced = start.cost_usd, start.priced_calls, start.unpriced_calls

    def count(self, usage: Usage, cost: Decimal | None) -> None:
        """`UsageTotals.add_call`, in place."""
        self.input += usage.input_tokens
        self.output += usage.output_tokens
        self.cached += usage.cached_input_tokens
        self.reasoning += usage.reasoning_tokens
        if cost is None:
            self.unpriced += 1
            if self.priced:
                self.cost = _MONEY_ADD(self.cost or _ZERO, _ZERO)
        else:
            self.priced += 1
            self.cost = _MONEY_ADD(self.cost or _ZERO, cost or _ZERO)

    def build(self) -> UsageTotals:
        return UsageTotals(
            self.input,
            self.output,
            self.cached,
            self.reasoning,
            None if self.priced == 0 else self.cost,
            self.priced,
            self.unpriced,
        )


class _Fold:
    """What one `fold_events` call keeps beside the state: the price table, its rates by
    (provider, model) as `price_call` uses them, and the running totals."""

    __slots__ = ("table", "version", "rates", "models", "replayed", "entries_from", "exact")

    def __init__(self, table: PriceTable, state: RunState) -> None:
        self.table = table
        self.version = table.version
        self.rates: dict[tuple[str | None, str | None], _Rates | None] = {}
        # (payload provider, payload modelId) -> (provider, model id, rates), for _model_responded
        self.models: dict[tuple[Any, Any], tuple[str | None, str | None, _Rates | None]] = {}
        self.replayed: _Totals | None = None
        self.entries_from = len(state.cost_entries)
        # Little Workflow's rule for its own logs: a token count is the number recorded, fractions
        # kept (ours: whole tokens, docs/operations.md § Prices).
        self.exact = table.rules == LITTLE_WORKFLOW

    def rates_of(self, provider: str | None, model_id: str | None) -> _Rates | None:
        """`price_call`'s rates for a model (`ModelRates.scaled`) and the key of the table's entry
        that prices it, looked up once per fold."""
        key = (provider, model_id)
        try:
            return self.rates[key]
        except KeyError:
            found = self.table.resolve(provider, model_id)
            scaled = self.rates[key] = None if found is None else (*found[1].scaled, found[0])
            return scaled

    def finish(self, state: RunState) -> None:
        """The run's and the steps' totals: every call they count has one cost entry, in order, so
        they are the entries this fold added, summed as `add_call` would have, call by call."""
        if self.replayed is not None:
            state.replayed_usage = self.replayed.build()
        entries = state.cost_entries
        if len(entries) == self.entries_from:
            return
        new = entries[self.entries_from :]
        state.usage = _add_entries(state.usage, new)
        by_step: dict[str, list[CostEntry]] = {}
        for entry in new:
            if entry.step_path is not None:
                by_step.setdefault(entry.step_path, []).append(entry)
        for path, step_entries in by_step.items():
            step = state.steps[path]
            step.usage = _add_entries(step.usage, step_entries)


def _add_entries(totals: UsageTotals, entries: list[CostEntry]) -> UsageTotals:
    """`totals.add_call(...)` for each entry's call in turn, in one loop: the same token sums and the
    same `MONEY.add` steps in the same order (so the same value, exponent and any rounding)."""
    input_tokens, output_tokens = totals.input_tokens, totals.output_tokens
    cached, reasoning = totals.cached_input_tokens, totals.reasoning_tokens
    cost, priced, unpriced = totals.cost_usd, totals.priced_calls, totals.unpriced_calls
    add, zero = _MONEY_ADD, _ZERO
    for entry in entries:
        input_tokens += entry.input_tokens
        output_tokens += entry.output_tokens
        cached += entry.cached_input_tokens
        reasoning += entry.reasoning_tokens
        dollars = entry.cost_usd
        if dollars is None:
            unpriced += 1
            if priced:
                cost = add(cost or zero, zero)
        else:
            priced += 1
            cost = add(cost or zero, dollars or zero)
    return UsageTotals(input_tokens, output_tokens, cached, reasoning, None if priced == 0 else cost, priced, unpriced)


def fold_events(state: RunState, events: Iterable[Mapping[str, Any]], table: PriceTable) -> None:
    """Advance `state` by `events` in order, without checking their run or sequence.

    The dispatch: the counters, the step an event names (any event naming a step touches it,
    whether or not a handler reads it), then the event type's handler. Model responses and tool
    starts, most of a long run, take handlers that read the payload directly (`_FAST`); the rest
    get an `_Event`. The counters stay in locals and the run's and steps' usage totals are summed
    from this fold's cost entries at the end (`_Fold.finish`): `state` is whole again when this
    returns, not between events.
    """
    fold = _Fold(table, state)
    steps = state.steps
    fast, slow = _FAST, HANDLERS
    count, custom, last = state.event_count, state.custom_event_count, state.last_sequence
    try:
        for event in events:
            event_type = event.get("type")
            sequence = event.get("sequence")
            count += 1
            if isinstance(sequence, int):
                last = sequence
            if not isinstance(event_type, str):
                continue
            handler = fast.get(event_type)
            if handler is None and event_type.startswith("custom."):
                custom += 1
                continue
            payload: Any = event.get("payload")
            if payload.__class__ is not dict and not isinstance(payload, Mapping):
                payload = {}
            step_path = payload.get("stepPath")
            if step_path is not None:
                if isinstance(step_path, str) and step_path:
                    step = steps.get(step_path)
                    if step is None:
                        step_path = _intern(step_path)
                        step = StepState(step_path=step_path, visit=visit_index(step_path), first_sequence=last)
                        steps[step_path] = step
                    else:
                        step_path = step.step_path  # the shared string (_name)
                    step.last_sequence = last
                else:
                    step_path = None
            if handler is not None:
                handler(state, payload, last, step_path, fold)
                continue
            other = slow.get(event_type)
            if other is not None:
                state.last_sequence = last
                at = _str(event.get("recordedAt"))
                if "occurredAt" in payload:
                    at = occurred_at(payload, at)
                other(state, _Event(last, at, payload, step_path, table))
    finally:
        state.event_count, state.custom_event_count, state.last_sequence = count, custom, last
        fold.finish(state)


def _run_started(state: RunState, e: _Event) -> None:
    p = e.payload
    state.status = "running"
    state.started_at = e.at
    state.workflow_version_id = _str(p.get("workflowVersionId")) or state.workflow_version_id
    state.workflow = _str(p.get("workflow"))
    state.workflow_version_hash = _str(p.get("workflowVersionHash"))
    state.input = p.get("input")
    state.input_ref = _ref(p.get("inputRef"))
    state.parent_run_id = _str(p.get("parentRunId"))
    state.outer_loop_id = _str(p.get("outerLoopId"))
    state.label = _str(p.get("label"))
    state.tags = p.get("tags")
    state.replay_of = _str(p.get("replayOf"))


def _workflow_version_registered(state: RunState, e: _Event) -> None:
    state.workflow_version_id = _str(e.payload.get("workflowVersionId")) or state.workflow_version_id


def _run_completed(state: RunState, e: _Event) -> None:
    state.status = "completed"
    state.finished_at = e.at
    _restated_start(state, e)
    state.error = None
    if "output" in e.payload:
        state.output = e.payload["output"]
        state.has_output = True
    ref = _ref(e.payload.get("outputRef"))
    if ref is not None:
        state.output_ref = ref
        _note_artifact(state, ref, e.sequence, None)


def _run_failed(state: RunState, e: _Event) -> None:
    state.status = "failed"
    state.finished_at = e.at
    state.error = e.payload.get("error")
    _restated_start(state, e)


def _restated_start(state: RunState, e: _Event) -> None:
    """A writer that learns when the run began only at its end (OpenTelemetry's root span is sent
    when it ends) restates it there as `runStartedAt`."""
    if "runStartedAt" in e.payload:
        state.started_at = occurred_at(e.payload, state.started_at, "runStartedAt")


def _step_scheduled(state: RunState, e: _Event) -> None:
    if e.step_path is None:
        return
    step = state.steps[e.step_path]
    step.scheduled = True
    step.step_id = _str(e.payload.get("stepId")) or step.step_id


def _step_attempt_started(state: RunState, e: _Event) -> None:
    if e.step_path is None:
        return
    step = state.steps[e.step_path]
    step.status = "running"
    step.error = None
    step.output, step.has_output, step.output_ref = None, False, None
    step.finished_at = None
    step.started_at = step.started_at or e.at
    step.step_id = _str(e.payload.get("stepId")) or step.step_id
    number = _int(e.payload.get("attempt"))
    step.attempts.append(
        Attempt(attempt=number if number is not None else len(step.attempts) + 1, status="running", started_at=e.at)
    )


def _step_completed(state: RunState, e: _Event) -> None:
    if e.step_path is None:
        return
    step = state.steps[e.step_path]
    step.status = "completed"
    step.error = None
    step.finished_at = e.at
    _close_attempt(step, _int(e.payload.get("attempt")), "completed", e.at, None)
    if "output" in e.payload:
        step.output = e.payload["output"]
        step.has_output = True
    ref = _ref(e.payload.get("outputRef"))
    if ref is not None:
        step.output_ref = ref
        _add_unique(step.artifact_refs, ref)
        _note_artifact(state, ref, e.sequence, e.step_path)
    for ref in _refs(e.payload.get("artifactRefs")):
        _add_unique(step.artifact_refs, ref)
        _note_artifact(state, ref, e.sequence, e.step_path)
    if isinstance(e.payload.get("metadata"), Mapping):
        step.metadata = e.payload["metadata"]


def _step_failed(state: RunState, e: _Event) -> None:
    if e.step_path is None:
        return
    step = state.steps[e.step_path]
    step.status = "failed"
    step.error = e.payload.get("error")
    step.finished_at = e.at
    _close_attempt(step, _int(e.payload.get("attempt")), "failed", e.at, step.error)


def _close_attempt(step: StepState, number: int | None, status: str, at: str | None, error: Any) -> None:
    target = None
    if number is not None:
        target = next((a for a in reversed(step.attempts) if a.attempt == number), None)
    if target is None and step.attempts and step.attempts[-1].status == "running":
        target = step.attempts[-1]
    if target is None:
        target = Attempt(attempt=number if number is not None else len(step.attempts) + 1, status=status, started_at=at)
        step.attempts.append(target)
    target.status = status
    target.finished_at = at
    target.error = error


def _artifact_created(state: RunState, e: _Event) -> None:
    ref = _ref(e.payload.get("artifactRef"))
    if ref is None:
        return
    artifact = _note_artifact(state, ref, e.sequence, e.step_path)
    artifact.step_path = e.step_path or artifact.step_path
    artifact.name = _str(e.payload.get("name")) or artifact.name
    artifact.content_type = _str(e.payload.get("contentType")) or artifact.content_type
    artifact.created_sequence = artifact.created_sequence or e.sequence
    artifact.payload = dict(e.payload)
    if e.step_path is not None:
        _add_unique(state.steps[e.step_path].artifact_refs, ref)


def _note_artifact(state: RunState, ref: str, sequence: int, step_path: str | None) -> Artifact:
    artifact = state.artifacts.get(ref)
    if artifact is None:
        artifact = Artifact(ref=ref, step_path=step_path, first_sequence=sequence)
        state.artifacts[ref] = artifact
    return artifact


def _group(state: RunState, e: _Event) -> ParallelGroup | None:
    if e.step_path is None:
        return None
    group = state.parallel_groups.get(e.step_path)
    if group is None:
        group = ParallelGroup(step_path=e.step_path, first_sequence=e.sequence)
        state.parallel_groups[e.step_path] = group
    group.last_sequence = e.sequence
    return group


def _branch(state: RunState, e: _Event) -> ParallelBranch | None:
    group = _group(state, e)
    branch_path = _str(e.payload.get("branchPath"))
    if group is None or branch_path is None:
        return None
    branch = group.branches.get(branch_path)
    if branch is None:
        branch = ParallelBranch(branch_path=branch_path, first_sequence=e.sequence)
        group.branches[branch_path] = branch
    branch.last_sequence = e.sequence
    output_ref = _ref(e.payload.get("outputRef"))
    for ref in _refs(e.payload.get("artifactRefs")) + ([output_ref] if output_ref else []):
        _add_unique(branch.artifact_refs, ref)
        _note_artifact(state, ref, e.sequence, e.step_path)
    return branch


def _parallel_group_started(state: RunState, e: _Event) -> None:
    group = _group(state, e)
    if group is None:
        return
    group.status = "running"
    group.error = None
    group.attempt = _int(e.payload.get("attempt"))
    group.branch_count = _int(e.payload.get("branchCount"))
    group.max_concurrency = _int(e.payload.get("maxConcurrency"))
    group.failure_mode = _str(e.payload.get("failureMode"))


def _parallel_group_ended(status: str) -> _Handler:
    def handler(state: RunState, e: _Event) -> None:
        group = _group(state, e)
        if group is None:
            return
        group.status = status
        if status == "failed":
            group.error = e.payload.get("error")
        else:
            group.fan_in_order = e.payload.get("fanInOrder", group.fan_in_order)
            group.branch_count = _int(e.payload.get("branchCount")) or group.branch_count

    return handler


def _parallel_branch_scheduled(state: RunState, e: _Event) -> None:
    branch = _branch(state, e)
    if branch is None:
        return
    branch.status = "scheduled"
    branch.item_key = e.payload.get("itemKey", branch.item_key)
    branch.branch_index = _int(e.payload.get("branchIndex"))


def _parallel_branch_ended(status: str) -> _Handler:
    def handler(state: RunState, e: _Event) -> None:
        branch = _branch(state, e)
        if branch is None:
            return
        branch.status = status
        branch.error = e.payload.get("error") if status == "failed" else None
        branch.output_ref = _ref(e.payload.get("outputRef")) or branch.output_ref

    return handler


def _session_started(state: RunState, e: _Event) -> None:
    p = e.payload
    state.sessions.append(
        HarnessSession(
            sequence=e.sequence,
            step_path=e.step_path,
            role=_str(p.get("role")),
            task=p.get("task"),
            manifest=p.get("manifest"),
            manifest_hash=_str(p.get("manifestHash")),
            parent_run_id=_str(p.get("parentRunId")),
            attempt=_int(p.get("attempt")) or 1,
        )
    )


def _session_ended(status: str) -> _Handler:
    def handler(state: RunState, e: _Event) -> None:
        # No session id on the wire: the session that ends is the newest open one of the same
        # step (harnesses stamp stepPath on every payload), narrowed by role when one is given.
        role = _str(e.payload.get("role"))
        index = _open_session(state, e.step_path, role)
        if index is None:
            return
        session = state.sessions[index]
        session.status = status
        session.ended_sequence = e.sequence
        if status == "failed":
            session.error = e.payload.get("error")
        else:
            session.output = e.payload.get("output")
        # harness.session.completed carries a usage rollup of calls already counted one by
        # one from harness.model.responded; adding it would count every call twice.

    return handler


def _open_session(state: RunState, step_path: str | None, role: str | None = None) -> int | None:
    """The newest open session of `step_path` (and `role`), else the newest open one, else None.

    Newest first, stopping at the first match: the session a model or tool event belongs to is
    nearly always the newest, and a long run has one session per AI step.
    """
    newest_open = None
    for i in range(len(state.sessions) - 1, -1, -1):
        session = state.sessions[i]
        if session.status != "started":
            continue
        if session.step_path == step_path and (role is None or session.role == role):
            return i
        if newest_open is None:
            newest_open = i
    return newest_open


def _model_called(state: RunState, e: _Event) -> None:
    p = e.payload
    state.model_calls.append(
        ModelCall(
            turn=_int(p.get("turn")),
            call_id=_str(p.get("callId")),
            step_path=e.step_path,
            prompt_hash=_str(p.get("promptHash")),
            called_sequence=e.sequence,
            origin=_str(p.get("origin")),
            replay_of=_str(p.get("replayOf")),
            session=_open_session(state, e.step_path),
        )
    )
    state.pending_model_calls.append(len(state.model_calls) - 1)


def _pending_model_call(state: RunState, p: Mapping[str, Any], step_path: str | None) -> ModelCall | None:
    """The called-but-unanswered call an answer belongs to: by callId, else by (stepPath, turn)."""
    call_id, turn = _str(p.get("callId")), _int(p.get("turn"))
    pending = [state.model_calls[i] for i in reversed(state.pending_model_calls)]
    if call_id is not None:
        for call in pending:
            if call.call_id == call_id:
                return call
    for call in pending:
        if call.call_id in (None, call_id) and call.step_path == step_path and call.turn == turn:
            return call
    return None


def _model_call_for_answer(state: RunState, p: Mapping[str, Any], step_path: str | None) -> ModelCall:
    call = _pending_model_call(state, p, step_path) if state.pending_model_calls else None
    if call is not None:
        state.pending_model_calls = [i for i in state.pending_model_calls if state.model_calls[i] is not call]
    else:
        turn = p.get("turn")
        call = ModelCall(
            turn=turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
            step_path=step_path,
            session=_open_session(state, step_path) if state.sessions else None,
        )
        state.model_calls.append(call)
    call_id, origin, replay_of = p.get("callId"), p.get("origin"), p.get("replayOf")
    if isinstance(call_id, str) and call_id:
        call.call_id = call_id
    if step_path is not None:
        call.step_path = step_path
    if origin is not None:  # absent in all but re-executions: skip the checks
        call.origin = _str(origin) or call.origin
    if replay_of is not None:
        call.replay_of = _str(replay_of) or call.replay_of
    return call


def _model_responded(state: RunState, p: Mapping[str, Any], sequence: int, step_path: str | None, fold: _Fold) -> None:
    # The usual answer (no `harness.model.called` waiting) is a new call: built once, positionally,
    # with the values `_model_call_for_answer` and the lines below would set one by one.
    call = _model_call_for_answer(state, p, step_path) if state.pending_model_calls else None
    model: Any = p.get("model")
    scaled: Any = _UNKNOWN  # ModelRates.scaled or None (unpriced), once known
    if model.__class__ is dict or isinstance(model, Mapping):
        raw_provider, raw_model_id = model.get("provider"), model.get("modelId")
        try:  # a run names a few models: what each (provider, modelId) means, once per fold
            provider, model_id, scaled = fold.models[raw_provider, raw_model_id]
        except (KeyError, TypeError):  # TypeError: an unhashable value from a payload
            provider = _intern(raw_provider) if isinstance(raw_provider, str) and raw_provider else None
            model_id = _intern(raw_model_id) if isinstance(raw_model_id, str) and raw_model_id else None
            scaled = fold.rates_of(provider, model_id)
            try:
                fold.models[raw_provider, raw_model_id] = (provider, model_id, scaled)
            except TypeError:
                pass
    elif call is not None:
        provider, model_id = call.provider, call.model_id
    else:
        provider = model_id = None
    response = p.get("response")
    raw_usage = response.get("usage") if isinstance(response, _OBJECT) else None
    usage: Usage | None = None
    cost: Decimal | None = None
    reported = True
    if isinstance(raw_usage, _OBJECT):  # Little Workflow's rule: a call without a usage object is not counted
        get = raw_usage.get
        input_tokens, output_tokens = get("inputTokens", 0), get("outputTokens", 0)
        if (
            input_tokens.__class__ is int
            and output_tokens.__class__ is int
            and input_tokens >= 0
            and output_tokens >= 0
            and raw_usage.keys() <= _PLAIN_USAGE
        ):
            usage = _new(Usage)  # Usage.from_payload's answer for plain counts, without its calls
            _set_input(usage, input_tokens)
            _set_output(usage, output_tokens)
            _set_cached(usage, 0)
            _set_reasoning(usage, 0)
            cached: Tokens = 0
            # pricing.reports_tokens: here a count that is present is an int
            reported = fold.exact or "inputTokens" in raw_usage or "outputTokens" in raw_usage
        else:
            usage = Usage.from_payload(raw_usage, exact=fold.exact)
            input_tokens, output_tokens = usage.input_tokens, usage.output_tokens
            cached = usage.cached_input_tokens
            reported = fold.exact or reports_tokens(raw_usage)
        if scaled is _UNKNOWN:
            scaled = fold.rates_of(provider, model_id)
        if scaled is not None and reported:  # price_call's sum (price_recorded's rule)
            rate_in, rate_cached, rate_out, exponent, priced_as = scaled
            if input_tokens.__class__ is int and output_tokens.__class__ is int and cached.__class__ is int:
                units: Any = (input_tokens - cached) * rate_in + cached * rate_cached + output_tokens * rate_out
            else:  # a fraction of a token (Little Workflow's logs): its decimal digits, exactly
                d_in, d_out, d_cached = exact_tokens(input_tokens), exact_tokens(output_tokens), exact_tokens(cached)
                units = (d_in - d_cached) * rate_in + d_cached * rate_cached + d_out * rate_out
            cost = _SCALEB(_Decimal(units), exponent)
    if call is None:
        call_id, origin, replay_of, turn = p.get("callId"), p.get("origin"), p.get("replayOf"), p.get("turn")
        call = build_model_call(
            turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
            call_id if isinstance(call_id, str) and call_id else None,
            step_path,
            "responded",
            provider,
            model_id,
            usage,
            cost,
            None,
            response,
            None,
            None,
            sequence,
            None,
            None if origin is None else _str(origin),
            None if replay_of is None else _str(replay_of),
            _open_session(state, step_path) if state.sessions else None,
            reported,
        )
        state.model_calls.append(call)
    else:
        call.status = "responded"
        call.responded_sequence = sequence
        call.provider, call.model_id = provider, model_id
        call.response = response
        if usage is not None:
            call.usage, call.cost, call.usage_reported = usage, cost, reported
    if usage is None:
        return
    priced_as = None if cost is None else scaled[4]
    if call.origin in REPLAYED_ORIGINS:
        # Served from the original's record: the original already counted (and paid) this call;
        # counting it here would double it in every rollup, so it gets no cost entry either.
        if fold.replayed is None:
            fold.replayed = _Totals(state.replayed_usage)
        fold.replayed.count(usage, cost)
        return
    # Counted into the run's and the step's totals at the end of the fold, from this entry.
    state.cost_entries.append(  # positional, in field order: one per priced or unpriced call
        build_cost_entry(
            sequence,
            call.call_id,
            call.turn,
            step_path,
            provider,
            model_id,
            input_tokens,
            output_tokens,
            cached,
            usage.reasoning_tokens,
            cost,
            fold.version,
            priced_as,
            reported,
        )
    )


def _model_call_completed(
    state: RunState, p: Mapping[str, Any], sequence: int, step_path: str | None, fold: _Fold
) -> None:
    """Little Workflow's legacy model event: `{model, usage}` at the top of the payload, counted
    as its fold counts it (and priced like harness.model.responded)."""
    _model_responded(state, {**p, "response": {"usage": p.get("usage")}}, sequence, step_path, fold)


def _model_failed(state: RunState, p: Mapping[str, Any], sequence: int, step_path: str | None, fold: _Fold) -> None:
    call = _model_call_for_answer(state, p, step_path)
    call.status = "failed"
    call.failed_sequence = sequence
    call.error = p.get("error")
    if p.get("requestLeft") is not True or fold.exact or call.origin in REPLAYED_ORIGINS:
        return
    # The request left before the call failed: the provider may have billed it, for an amount
    # nobody recorded. Unknown, never 0: an unpriced call with no token count (usage not reported),
    # as an evaluation counts its grader's (docs/operations.md § Prices).
    model = p.get("model")
    provider = model_id = None
    if isinstance(model, Mapping):
        provider, model_id = _name(model.get("provider")), _name(model.get("modelId"))
    state.cost_entries.append(
        build_cost_entry(
            sequence,
            call.call_id,
            call.turn,
            step_path,
            provider,
            model_id,
            0,
            0,
            0,
            0,
            None,
            fold.version,
            None,
            False,
        )
    )


def _tool_started(state: RunState, p: Mapping[str, Any], sequence: int, step_path: str | None, fold: _Fold) -> None:
    call_id = p.get("callId")
    if not isinstance(call_id, str) or not call_id:
        return
    call = state.tool_calls.get(call_id)
    if call is None:  # the usual: built once, positionally, with what the lines below would set
        name, caller, turn = p.get("toolName"), p.get("caller"), p.get("turn")
        origin, replay_of = p.get("origin"), p.get("replayOf")
        state.tool_calls[call_id] = build_tool_call(
            call_id,
            _intern(name) if isinstance(name, str) and name else None,
            p.get("args"),
            _intern(caller) if isinstance(caller, str) and caller else None,
            turn if isinstance(turn, int) and not isinstance(turn, bool) else None,
            step_path,
            "started",
            None,
            None,
            None,
            False,
            None if origin is None else _str(origin),
            None if replay_of is None else _str(replay_of),
            sequence,
            None,
            _open_session(state, step_path) if state.sessions else None,
            None,
        )
        return
    # A second `started` is the gateway re-claiming an expired lease: the call is live again.
    call.status = "started"
    call.result, call.error, call.duration_ms, call.ended_sequence = None, None, None, None
    name = p.get("toolName")
    if isinstance(name, str) and name:
        call.tool_name = _intern(name)
    call.args = p.get("args", call.args)
    caller = p.get("caller")
    if isinstance(caller, str) and caller:
        call.caller = _intern(caller)
    turn = p.get("turn")
    if isinstance(turn, int) and not isinstance(turn, bool):
        call.turn = turn
    if step_path is not None:
        call.step_path = step_path
    if "origin" in p or "replayOf" in p:
        _tool_origin(call, p)


def _tool_event(state: RunState, e: _Event) -> ToolCallState | None:
    call_id = _str(e.payload.get("callId"))
    if call_id is None:
        return None
    call = state.tool_calls.get(call_id)
    if call is None:
        call = ToolCallState(call_id=call_id, step_path=e.step_path, session=_open_session(state, e.step_path))
        state.tool_calls[call_id] = call
    call.step_path = call.step_path or e.step_path
    _tool_origin(call, e.payload)
    return call


def _tool_origin(call: ToolCallState, payload: Mapping[str, Any]) -> None:
    origin, replay_of = payload.get("origin"), payload.get("replayOf")
    if origin is not None:  # absent in all but re-executions: skip the checks
        call.origin = _str(origin) or call.origin
    if replay_of is not None:
        call.replay_of = _str(replay_of) or call.replay_of


def _tool_ended(status: str) -> _Handler:
    def handler(state: RunState, e: _Event) -> None:
        call = _tool_event(state, e)
        if call is None:
            return
        call.status = status
        call.ended_sequence = e.sequence
        if status == "succeeded":
            call.result = e.payload.get("result")
        else:
            call.error = e.payload.get("error")
        duration = e.payload.get("durationMs")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool):
            call.duration_ms = duration

    return handler


def _tool_in_doubt(state: RunState, e: _Event) -> None:
    call = _tool_event(state, e)
    if call is not None:
        call.status = "in_doubt"


def _tool_reconciled(state: RunState, e: _Event) -> None:
    outcome = e.payload.get("outcome")
    if outcome not in ("succeeded", "failed"):
        return
    call = _tool_event(state, e)
    if call is None:
        return
    call.status = outcome
    call.reconciled = True
    call.ended_sequence = e.sequence
    if outcome == "succeeded":
        call.result, call.error = e.payload.get("result"), None
    else:
        call.result, call.error = None, e.payload.get("error")


def _tool_approval_requested(state: RunState, e: _Event) -> None:
    call = _tool_event(state, e)
    if call is None:
        return
    p = e.payload
    if call.started_sequence is None:  # the call's first event: where it sits among the run's calls
        call.started_sequence = e.sequence
    call.status = "waiting_approval"
    call.tool_name = _name(p.get("toolName")) or call.tool_name
    call.args = p.get("args", call.args)
    call.caller = _name(p.get("caller")) or call.caller
    turn = _int(p.get("turn"))
    call.turn = turn if turn is not None else call.turn
    call.approval = {"status": "pending", "argsDigest": _str(p.get("argsDigest")), "sequence": e.sequence}


def _tool_decided(decision: str) -> _Handler:
    def handler(state: RunState, e: _Event) -> None:
        call = _tool_event(state, e)
        if call is None:
            return
        p = e.payload
        call.approval = {
            "status": decision,
            "argsDigest": _str(p.get("argsDigest")),
            "sequence": e.sequence,
            "by": _str(p.get("by")),
        }
        if decision == "approved":
            call.status = "approved"
            return
        call.status = "failed"  # a rejected call is over: it never ran
        call.error = p.get("error")
        call.ended_sequence = e.sequence

    return handler


def _replay_diverged(state: RunState, e: _Event) -> None:
    state.divergences.append({**e.payload, "sequence": e.sequence})


def _outer_loop_cycle(state: RunState, e: _Event) -> None:
    number = _int(e.payload.get("cycleNumber"))
    if number is None or any(c.cycle_number == number for c in state.outer_loop_cycles):
        return  # Little Workflow appends a cycle once; a repeat restates it
    state.outer_loop_cycles.append(
        OuterLoopCycle(
            outer_loop_id=_str(e.payload.get("outerLoopId")),
            cycle_number=number,
            supervise=e.payload.get("supervise"),
            sequence=e.sequence,
        )
    )


HANDLERS: dict[str, _Handler] = {
    "RunStarted": _run_started,
    "WorkflowVersionRegistered": _workflow_version_registered,
    "RunCompleted": _run_completed,
    "RunFailed": _run_failed,
    "StepScheduled": _step_scheduled,
    "StepAttemptStarted": _step_attempt_started,
    "StepCompleted": _step_completed,
    "StepFailed": _step_failed,
    "ArtifactCreated": _artifact_created,
    "ParallelGroupStarted": _parallel_group_started,
    "ParallelBranchScheduled": _parallel_branch_scheduled,
    "ParallelBranchCompleted": _parallel_branch_ended("completed"),
    "ParallelBranchFailed": _parallel_branch_ended("failed"),
    "ParallelGroupCompleted": _parallel_group_ended("completed"),
    "ParallelGroupFailed": _parallel_group_ended("failed"),
    "harness.session.started": _session_started,
    "harness.session.completed": _session_ended("completed"),
    "harness.session.failed": _session_ended("failed"),
    "harness.model.called": _model_called,
    "harness.tool_call.succeeded": _tool_ended("succeeded"),
    "harness.tool_call.failed": _tool_ended("failed"),
    "harness.tool_call.in_doubt": _tool_in_doubt,
    "harness.tool_call.reconciled": _tool_reconciled,
    "harness.tool_call.approval_requested": _tool_approval_requested,
    "harness.tool_call.approved": _tool_decided("approved"),
    "harness.tool_call.rejected": _tool_decided("rejected"),
    "OuterLoopCycleCompleted": _outer_loop_cycle,
    "harness.replay.diverged": _replay_diverged,
}
_FastHandler = Callable[[RunState, Mapping[str, Any], int, "str | None", _Fold], None]
# The handlers of most of a long run's events: the payload, sequence and step path as arguments.
_FAST: dict[str, _FastHandler] = {
    "harness.model.responded": _model_responded,
    "harness.tool_call.started": _tool_started,
    "ModelCallCompleted": _model_call_completed,
    "harness.model.failed": _model_failed,
}
# Little Workflow's legacy harness type names, read as the names they became (its
# normalizeHarnessEventType): logs it wrote before the rename keep them, and their ids hash them.
LEGACY_HARNESS_TYPES = {
    "HarnessSessionStarted": "harness.session.started",
    "HarnessSessionCompleted": "harness.session.completed",
    "HarnessSessionFailed": "harness.session.failed",
    "HarnessModelCalled": "harness.model.called",
    "HarnessModelResponded": "harness.model.responded",
    "HarnessModelFailed": "harness.model.failed",
    "HarnessToolCallStarted": "harness.tool_call.started",
    "HarnessToolCallSucceeded": "harness.tool_call.succeeded",
    "HarnessToolCallFailed": "harness.tool_call.failed",
    "HarnessExecuteStepStarted": "harness.execute_step.started",
    "HarnessExecuteStepSucceeded": "harness.execute_step.succeeded",
}
for _legacy, _current in LEGACY_HARNESS_TYPES.items():
    if _current in _FAST:
        _FAST[_legacy] = _FAST[_current]
    elif _current in HANDLERS:
        HANDLERS[_legacy] = HANDLERS[_current]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _name(value: Any) -> str | None:
    """`_str` for the values a run repeats on every call (step paths, providers, models, tools):
    one shared string each, instead of one per event held by every record of a long run."""
    return sys.intern(value) if isinstance(value, str) and value else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ref(value: Any) -> str | None:
    return value if isinstance(value, str) and value.startswith(ARTIFACT_REF_PREFIX) else None


def _refs(value: Any) -> list[str]:
    return [ref for ref in map(_ref, value) if ref is not None] if isinstance(value, list) else []


def _add_unique(items: list[str], value: str) -> None:
    if value not in items:
        items.append(value)
