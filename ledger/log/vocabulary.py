"""The event vocabulary (docs/design.md §3) and payload validation.

Validation checks the listed fields' presence and types only; fields not listed are kept
untouched, because harnesses add their own and the interop vectors depend on it. One more rule,
for the fields whose values the projections keep in columns of a bounded size (COLUMN_LIMITS):
a longer text or a larger number is refused here, on both databases, instead of failing the
write on PostgreSQL (a varchar or an integer column) and passing on SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import CostNotAllowed, InvalidEvent, UnknownEventType
from ..fold.state import visit_index

STR = (str,)
INT = (int,)
NUM = (int, float)
OBJ = (dict,)
LIST = (list,)
ANY = (object,)

# field -> (accepted JSON types, required). A dotted field is checked inside its parent object.
Spec = dict[str, tuple[tuple[type, ...], bool]]

RUN_STARTED: Spec = {
    "workflowVersionId": (STR, True),
    "parentRunId": (STR, False),
    "outerLoopId": (STR, False),
    "label": (STR, False),
    "tags": (LIST + OBJ, False),
    "replayOf": (STR, False),
    "requestedBy": (STR, False),
}
STEP: Spec = {"stepPath": (STR, True), "stepId": (STR, False)}
ATTEMPT: Spec = {"stepPath": (STR, True), "attempt": (INT, True)}
TOOL_TERMINAL: Spec = {"callId": (STR, True), "durationMs": (NUM, True)}

VOCABULARY: dict[str, Spec] = {
    "RunStarted": RUN_STARTED,
    "RunCompleted": {"outputRef": (STR, False)},
    "RunFailed": {"error": (ANY, True)},
    "StepScheduled": STEP,
    "StepAttemptStarted": ATTEMPT,
    "StepCompleted": {**ATTEMPT, "outputRef": (STR, False), "artifactRefs": (LIST, False)},
    "StepFailed": {**ATTEMPT, "error": (ANY, True)},
    "ArtifactCreated": {},
    "ParallelGroupStarted": {},
    "ParallelBranchScheduled": {},
    "ParallelBranchCompleted": {},
    "ParallelBranchFailed": {},
    "ParallelGroupCompleted": {},
    "ParallelGroupFailed": {},
    "harness.session.started": {
        "role": (STR, True),
        "task": (ANY, True),
        "manifest": (OBJ, True),
        "manifestHash": (STR, True),
        "parentRunId": (STR, False),
    },
    "harness.session.completed": {},
    "harness.session.failed": {},
    "harness.model.called": {"turn": (INT, True), "promptHash": (STR, True), "request": (OBJ, True)},
    "harness.model.responded": {
        "turn": (INT, True),
        "callId": (STR, True),
        "stepPath": (STR, False),
        "model": (OBJ, True),
        "model.provider": (STR, True),
        "model.modelId": (STR, True),
        "response": (OBJ, True),
        "response.text": (STR, False),
        "response.toolCalls": (LIST, False),
        "response.usage": (OBJ, True),
    },
    "harness.model.failed": {"turn": (INT, True)},
    # `args` and `result` may be absent: a tracer that did not capture a call's content (an
    # OpenTelemetry tool span without its arguments) says nothing rather than an invented `{}`/`null`.
    "harness.tool_call.started": {
        "callId": (STR, True),
        "caller": (STR, True),
        "toolName": (STR, True),
        "args": (ANY, False),
        "turn": (INT, False),
    },
    "harness.tool_call.succeeded": {**TOOL_TERMINAL, "result": (ANY, False)},
    "harness.tool_call.failed": {**TOOL_TERMINAL, "error": (ANY, True)},
    "harness.tool_call.in_doubt": {"callId": (STR, True)},
    "harness.tool_call.reconciled": {"callId": (STR, True), "outcome": (STR, True)},
    # Ours: a call that waits for a human approver, and the approver's decision (ledger/replay/toolapproval.py).
    "harness.tool_call.approval_requested": {
        "callId": (STR, True),
        "toolName": (STR, True),
        "args": (ANY, True),
        "argsDigest": (STR, True),
    },
    "harness.tool_call.approved": {"callId": (STR, True), "argsDigest": (STR, True), "by": (STR, True)},
    "harness.tool_call.rejected": {
        "callId": (STR, True),
        "argsDigest": (STR, True),
        "by": (STR, True),
        "error": (ANY, True),
    },
    # Ours: a re-execution call its original's record could not answer (ledger/runtime/reexecute.py).
    "harness.replay.diverged": {"stepPath": (STR, True), "kind": (STR, True), "reason": (STR, True)},
    "harness.execute_step.started": {},
    "harness.execute_step.succeeded": {},
    "OuterLoopCycleCompleted": {
        "outerLoopId": (STR, True),
        "cycleNumber": (INT, True),
        "supervise": (OBJ, True),
    },
    # Little Workflow's compile, plan and legacy types: accepted so its logs import as they are.
    "OrchestrationRequested": {},
    "PlannerStarted": {},
    "PlannerDraftedWorkflow": {},
    "WorkflowValidationFailed": {},
    "WorkflowValidationSucceeded": {},
    "PlannerReuseDecisionRecorded": {},
    "WorkflowVersionRegistered": {},
    "StepOutputValidated": {},
    "StepRepairAttempted": {},
    "ToolCallStarted": {},
    "ToolCallCompleted": {},
    "ModelCallStarted": {},
    "ModelCallCompleted": {},
}

# Payload fields whose text a projection keeps in a column of this many characters (ledger/models.py;
# the numbers are held to the columns by tests/test_column_limits.py); `turn` (a tool call's
# column) and a step path's `visit[N]` (a step's) are 32-bit integers.
COLUMN_LIMITS: dict[str, int] = {
    "workflowVersionId": 200,
    "label": 200,
    "parentRunId": 84,
    "replayOf": 200,
    "outputRef": 200,
    "stepPath": 500,
    "callId": 200,
    "toolName": 200,
    "caller": 50,
}
MODEL_COLUMN_LIMITS: dict[str, int] = {"provider": 200, "modelId": 200}  # inside payload.model
INT32_MAX = 2**31 - 1
_INT32 = -1  # the limit of `turn`: a range, not a length
# What the fold projects of an event beyond the fields its type lists: every event's stepPath makes a
# step, an approval request names the call's caller and turn, and Little Workflow's registration of a
# workflow version names the run's (tests/test_column_limits.py tries every limited field in every type).
_PROJECTED_UNLISTED: dict[str, tuple[str, ...]] = {
    "harness.tool_call.approval_requested": ("caller", "turn"),
    "WorkflowVersionRegistered": ("workflowVersionId",),
}

# The most tokens one count of one model call may say (docs/api.md "Token counts"): ten thousand
# times the longest context of today's models, and small enough that a run at the highest events
# limit an operator may set (10,000,000, ledger.limits) sums to 10^18, inside its bigint columns.
MAX_TOKENS = 10**11
# Where the usage the fold counts sits, by type (ledger/fold/handlers.py): each count in it that is
# a JSON number is at most MAX_TOKENS. A count that is not a number counts 0, as it always has.
_USAGE_AT: dict[str, tuple[str, ...]] = {
    "harness.model.responded": ("response", "usage"),
    "ModelCallCompleted": ("usage",),
}
_COUNTS = frozenset({"inputTokens", "outputTokens", "cachedInputTokens", "reasoningTokens"})
_DETAIL_COUNTS = {"inputTokenDetails": "cacheReadTokens", "outputTokenDetails": "reasoningTokens"}
_NUMBER = (int, float)

MODEL_AND_TOOL_PREFIXES = ("harness.model.", "harness.tool_call.")
ORIGINS = ("recorded", "simulated", "live")
TERMINAL_RUN_TYPES = ("RunCompleted", "RunFailed")


def with_origin(event: Mapping[str, Any], origin: str | None) -> Mapping[str, Any]:
    """`event` with `payload.origin` set to `origin` when it is a model or tool event without one
    (what a re-execution's live calls carry); anything else unchanged."""
    kind, payload = event.get("type"), event.get("payload")
    if (
        origin is None
        or not isinstance(kind, str)
        or not kind.startswith(MODEL_AND_TOOL_PREFIXES)
        or not isinstance(payload, Mapping)
        or "origin" in payload
    ):
        return event
    return {**event, "payload": {**payload, "origin": origin}}


def is_custom(event_type: str) -> bool:
    return event_type.startswith("custom.") and len(event_type) > len("custom.")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )


def _type_ok(value: Any, accepted: tuple[type, ...]) -> bool:
    if accepted is ANY:
        return True
    if isinstance(value, bool):  # bool is an int subclass in Python, never in JSON
        return False
    return isinstance(value, accepted)


def _limit(field: str) -> int:
    """The limit of the column payload.`field` lands in: characters, _INT32, or 0 for none."""
    if field == "turn":
        return _INT32
    parent, _, leaf = field.rpartition(".")
    if parent == "model":
        return MODEL_COLUMN_LIMITS.get(leaf, 0)
    return 0 if parent else COLUMN_LIMITS.get(field, 0)


# VOCABULARY's specs as the validation walks them: (field, parent, leaf, accepted, required, limit),
# split once here rather than per event.
_CHECKS: dict[str, tuple[tuple[str, str, str, tuple[type, ...], bool, int], ...]] = {
    event_type: tuple(
        (field, *field.rpartition(".")[::2], accepted, required, _limit(field))
        for field, (accepted, required) in spec.items()
    )
    for event_type, spec in VOCABULARY.items()
}
# The projected fields a type does not list, with their limits: (field, limit).
_UNLISTED: dict[str, tuple[tuple[str, int], ...]] = {
    event_type: tuple(
        (field, _limit(field)) for field in ("stepPath", *_PROJECTED_UNLISTED.get(event_type, ())) if field not in spec
    )
    for event_type, spec in VOCABULARY.items()
}


def validate_payload(index: int, event_type: str, payload: Any) -> None:
    """Raise InvalidEvent / UnknownEventType / CostNotAllowed for a payload that does not fit."""
    validate_fields(index, event_type, payload)
    reject_recorded_cost(index, payload)


# Little Workflow's legacy harness type names (harness/event-names.ts LEGACY_HARNESS_EVENT_TYPES):
# its recorder renames them on the way in, its fold (run-state.ts applyEvent) reads a log that holds
# them as the current names; ours does too (ledger/fold/handlers.py LEGACY_HARNESS_TYPES).
LEGACY_HARNESS_TYPES: dict[str, str] = {
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


def validate_fields(index: int, event_type: str, payload: Any, *, imported: bool = False) -> None:
    """`validate_payload` but for the recorded-cost rule, which walks the whole payload (the
    append does that in its redaction walk, ledger.log.redaction.Redactor.plain).

    `imported` (a Little Workflow log, `ledger import-little`): its store validated no payload
    (world.ts appendEvent takes any object), so a field its writers left out or wrote with
    another type (`attempt` missing, `response.text: null`, no `promptHash`) is taken as it is,
    and the fold reads it defensively; a legacy harness type name is its current one. What a
    column cannot hold is refused all the same."""
    if payload.__class__ is not dict and not isinstance(payload, dict):
        raise InvalidEvent(f"event {index}: payload must be an object", index=index, field="payload")
    if imported:
        event_type = LEGACY_HARNESS_TYPES.get(event_type, event_type)
    if not is_custom(event_type):
        checks = _CHECKS.get(event_type)
        if checks is None:
            raise UnknownEventType(
                f"event {index}: unknown event type {event_type!r} (custom types start with 'custom.')",
                index=index,
                field="type",
            )
        for field, parent, leaf, accepted, required, limit in checks:
            holder = payload.get(parent) if parent else payload
            if not isinstance(holder, dict):
                continue  # the parent's own check reports it
            if leaf not in holder:
                if required and not imported:
                    raise InvalidEvent(
                        f"event {index}: {event_type} needs payload.{field}",
                        index=index,
                        field=f"payload.{field}",
                    )
                continue
            value = holder[leaf]
            # _type_ok, inlined: bool is an int subclass in Python, never in JSON.
            if accepted is not ANY and (value.__class__ is bool or not isinstance(value, accepted)):
                if imported:
                    continue
                raise InvalidEvent(
                    f"event {index}: payload.{field} has the wrong type ({_json_type(holder[leaf])})",
                    index=index,
                    field=f"payload.{field}",
                )
            if limit:
                _check_limit(index, field, value, limit)
        for field, limit in _UNLISTED[event_type]:
            value = payload.get(field)
            if value is not None:
                _check_limit(index, field, value, limit)
        usage_at = _USAGE_AT.get(event_type)
        if usage_at is not None:
            _check_tokens(index, payload, usage_at, whole=not imported)
        if event_type.startswith(MODEL_AND_TOOL_PREFIXES):
            origin = payload.get("origin")
            if origin is not None and origin not in ORIGINS:
                raise InvalidEvent(
                    f"event {index}: payload.origin must be one of {', '.join(ORIGINS)}",
                    index=index,
                    field="payload.origin",
                )


def column_text_with_nul(event_type: str, payload: Any) -> str | None:
    """The first payload field whose string a text column keeps and that holds U+0000, which
    PostgreSQL's text columns cannot (an imported log's JSON values may: ledger.log.projection)."""
    event_type = LEGACY_HARNESS_TYPES.get(event_type, event_type)
    fields = [c[0] for c in _CHECKS.get(event_type, ()) if c[5] and c[5] != _INT32]
    fields += [f for f, limit in _UNLISTED.get(event_type, ()) if limit and limit != _INT32]
    for field in fields:
        parent, _, leaf = field.rpartition(".")
        holder = payload.get(parent) if parent else payload
        value = holder.get(leaf) if isinstance(holder, dict) else None
        if isinstance(value, str) and "\x00" in value:
            return field
    return None


def _check_limit(index: int, field: str, value: Any, limit: int) -> None:
    """Refuse `value` of payload.`field` if its column cannot hold it (`limit`: _limit's)."""
    if limit == _INT32:
        if value.__class__ is int and not -INT32_MAX - 1 <= value <= INT32_MAX:
            raise InvalidEvent(
                f"event {index}: payload.{field} must be from {-INT32_MAX - 1} to {INT32_MAX}",
                index=index,
                field=f"payload.{field}",
            )
        return
    if value.__class__ is not str:
        return
    if len(value) > limit:
        raise InvalidEvent(
            f"event {index}: payload.{field} is longer than {limit} characters", index=index, field=f"payload.{field}"
        )
    if field == "stepPath" and "visit[" in value:
        visit = visit_index(value)  # a step path's visit[N]: the step's 32-bit column
        if visit is not None and visit > INT32_MAX:
            raise InvalidEvent(
                f"event {index}: payload.stepPath's visit index must be at most {INT32_MAX}",
                index=index,
                field="payload.stepPath",
            )


def _check_tokens(index: int, payload: Mapping[str, Any], usage_at: tuple[str, ...], *, whole: bool) -> None:
    """Refuse a token count of the usage at `usage_at` that is a number above MAX_TOKENS: the fold
    would sum it into bigint columns and price it into numeric ones that cannot hold it. With
    `whole` (our rules: every append but Little Workflow's imported logs, whose fractions its
    rules count), also one that is a fraction (1.5): the fold counts whole tokens and would floor
    it, so a sum would quietly differ from what was sent. An integral double (12.0, what SDKs that
    count in floats send) is a whole count: it is stored as 12. One pass over the usage's own keys
    (two, most often): this runs for every model call appended."""
    usage: Any = payload
    for key in usage_at:
        usage = usage.get(key) if isinstance(usage, dict) else None
    if not isinstance(usage, dict):
        return
    for key, value in usage.items():
        if value.__class__ in _NUMBER:
            if key in _COUNTS:
                _check_count(index, (*usage_at, key), value, whole)
        elif value.__class__ is dict and (inner := _DETAIL_COUNTS.get(key)) is not None:
            count = value.get(inner)
            if count.__class__ in _NUMBER:
                _check_count(index, (*usage_at, key, inner), count, whole)


def _check_count(index: int, path: tuple[str, ...], count: float, whole: bool) -> None:
    field = ".".join(("payload", *path))
    if count > MAX_TOKENS:
        raise InvalidEvent(
            f"event {index}: {field} is more than {MAX_TOKENS:,} tokens, the most one model call may count",
            index=index,
            field=field,
            limit=MAX_TOKENS,
        )
    if whole and count.__class__ is float and not count.is_integer():
        raise InvalidEvent(
            f"event {index}: {field} is {count!r}, not a whole number of tokens", index=index, field=field
        )


def reject_recorded_cost(index: int, payload: Any) -> None:
    # Dollars are only ever computed by the fold; a harness's own figure would disagree with it.
    holder = _recorded_cost_holder(payload)
    if holder is not None:
        raise CostNotAllowed(
            f"event {index}: payload{holder}.usage.costUsd is not accepted; cost is computed from tokens",
            index=index,
            field=f"payload{holder}.usage.costUsd",
        )


def _recorded_cost_holder(value: Any) -> str | None:
    """The path below `value` of an object whose `usage` holds a `costUsd`, or None. The path is
    assembled only on the way back from a find: most payloads have none and pay no strings."""
    if isinstance(value, dict):
        for key, child in value.items():
            if key == "usage" and isinstance(child, dict) and "costUsd" in child:
                return ""
            if isinstance(child, (dict, list)) and (found := _recorded_cost_holder(child)) is not None:
                return f".{key}{found}"
    elif isinstance(value, list):
        for i, child in enumerate(value):
            if isinstance(child, (dict, list)) and (found := _recorded_cost_holder(child)) is not None:
                return f"[{i}]{found}"
    return None
