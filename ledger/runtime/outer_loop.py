"""Outer loops (Layer B): a goal-driven loop that runs a workflow as cycles until a supervise
adapter says it is done.

Each cycle is a run of its own (`RunStarted.outerLoopId`); after it ends, the loop's supervise
adapter reads its outcome and answers `{"kind": "done", "finalOutput": …}` or
`{"kind": "continue", "promptNote": …?}`; the answer is recorded as
`OuterLoopCycleCompleted {outerLoopId, cycleNumber, runId, supervise}`, and a recorded one is
never asked for again.

Where the loop's facts live: in a run of its own, the loop's *record* (`run_<outerLoopId>`), whose
log holds nothing but loop facts, each an event through the one write path:

- `RunStarted {workflowVersionId: "outer_loop:<cycle workflow's version id>", outerLoopId,
  input, outerLoop: {goal: {workflow, workflowDefinitionHash, workflowVersionId, description},
  maxCycles, supervise: <adapter name> | null}}`: the goal, written once;
- one `OuterLoopCycleCompleted` per cycle, in cycle order;
- `RunCompleted {output: finalOutput}` in the same commit as the `done` cycle, or
  `RunFailed {error: {name: "OuterLoopExhausted", causeCode: "outer_loop_exhausted", …}}` in the
  same commit as the last `continue` of the allowed cycles.

The loop's state (`read_loop`, the reference's manifest shape plus what the ledger knows) is
derived from that log and the cycle runs' rows; there is no side file. The pending cycle's run id
is not written down, it is reserved by construction: cycle N of loop `ol_x` is the run
`run_ol_x_cN`, so a resumed loop finds the pending cycle's run (and resumes it, never starting it
twice) from the number of cycles recorded.

One driver per loop: the driver holds the record's run lease for the whole loop (ledger/log/leases.py,
through the runtime's Recorder), writes every loop fact with its fencing token, and each cycle run
is executed with the record's recorder as its parent, so the cycle's writes keep the loop's lease
alive. A second driver is refused (`run_leased`) while the lease is live; one that takes it over
(`take_over`) fences the first at its next write.

    register_supervisor("three_drafts", lambda c: {"kind": "done", "finalOutput": c.output}
                        if c.cycle_number == 3 else {"kind": "continue", "promptNote": "tighter"})
    state = start_outer_loop(workspace=ws, workflow="draft", input={"topic": "tides"},
                             goal="a tight paragraph", max_cycles=5, supervise="three_drafts")
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..canonical import canonical_json, digest
from ..errors import LedgerError, NotFound
from ..fold.pricing import UsageTotals
from ..log.envelopes import log_of
from ..models import Run, RunStatus, Workspace
from ..reads import selectors
from ..reads.subruns import subrun_tree
from .errors import RuntimeIntegrityError
from .executor import start_run
from .record import inline_or_ref, read_record
from .recorder import Recorder
from .registry import Workflow, get_workflow

OUTER_LOOP_ID = re.compile(r"^ol_[A-Za-z0-9_-]{1,60}$")
RECORD_VERSION_PREFIX = "outer_loop:"
MAX_CYCLES = 100  # a loop's cycles are listed on one page, each with its usage


# --- errors ----------------------------------------------------------------------------------


class OuterLoopConfigError(RuntimeIntegrityError):
    """The caller's request does not fit the recorded loop: refused before anything is written
    (the reference's RunFailedError with causeCode runtime_config_error)."""

    code = "outer_loop_config_error"


class OuterLoopMaxCyclesMismatch(OuterLoopConfigError):
    code = "outer_loop_max_cycles_mismatch"


class OuterLoopGoalMismatch(OuterLoopConfigError):
    code = "outer_loop_goal_mismatch"


class OuterLoopManifestCorrupt(OuterLoopConfigError):
    code = "outer_loop_manifest_corrupt"


class OuterLoopWithoutSupervisor(LedgerError):
    code = "outer_loop_requested_without_supervise_adapter"


class InvalidOuterLoop(LedgerError):
    code = "invalid_outer_loop"


class UnknownOuterLoop(NotFound):
    """No record of that loop in the workspace (`not_found`, like any missing object)."""


class UnknownSupervisor(NotFound):
    code = "unknown_supervise_adapter"


class SuperviseFailed(LedgerError):
    """The supervise adapter raised or answered something that is not a verdict. Nothing is
    recorded: the loop stays where it was, and a resume asks the adapter again."""

    code = "outer_loop_supervise_failed"


EXHAUSTED = "outer_loop_exhausted"


def exhausted_message(cycles: int, outer_loop_id: str) -> str:
    return f"Outer loop exhausted after {cycles} cycles (outerLoopId: {outer_loop_id})."


# --- ids -------------------------------------------------------------------------------------


def new_outer_loop_id() -> str:
    return "ol_" + uuid.uuid4().hex


def check_outer_loop_id(outer_loop_id: str) -> str:
    if not isinstance(outer_loop_id, str) or not OUTER_LOOP_ID.match(outer_loop_id):
        raise InvalidOuterLoop(
            f"outer loop id {outer_loop_id!r} must match {OUTER_LOOP_ID.pattern}", outerLoopId=str(outer_loop_id)[:80]
        )
    return outer_loop_id


def record_run_id(outer_loop_id: str) -> str:
    """The run whose log holds the loop's facts."""
    return "run_" + outer_loop_id


def cycle_run_id(outer_loop_id: str, cycle_number: int) -> str:
    """The reserved id of cycle N's run: the same cycle always names the same run."""
    return f"run_{outer_loop_id}_c{cycle_number}"


def outer_loop_of(run: Run) -> tuple[str, int | None] | None:
    """The outer loop `run` belongs to, from its RunStarted: (its id, the cycle number when the run
    is that loop's reserved cycle run, else None: the loop's record, or a run that names the loop
    from outside). None for a run of no loop."""
    first = run.events.filter(sequence=1).values_list("payload", flat=True).first()
    if first is None or '"outerLoopId"' not in first:  # canonical JSON: no need to parse a big input
        return None
    ol = json.loads(first).get("outerLoopId")
    if not isinstance(ol, str) or not OUTER_LOOP_ID.match(ol):
        return None
    prefix = f"run_{ol}_c"
    number = run.run_id.removeprefix(prefix)
    return ol, int(number) if run.run_id.startswith(prefix) and number.isdigit() else None


# --- supervise adapters ----------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    """One cycle as the ledger holds it."""

    cycle_number: int
    run_id: str
    status: str  # pending (reserved, not started) | running | completed | failed
    workflow_version_id: str = ""
    output: Any = None
    error: Any = None
    supervise: Mapping[str, Any] | None = None  # the recorded verdict; None while pending
    usage: UsageTotals = field(default_factory=UsageTotals)  # the cycle run's, with its sub-runs

    def to_json(self) -> dict[str, Any]:
        return {
            "cycleNumber": self.cycle_number,
            "runId": self.run_id,
            "status": self.status,
            "workflowVersionId": self.workflow_version_id,
            "output": self.output,
            "error": self.error,
            "supervise": dict(self.supervise) if self.supervise is not None else None,
            "usage": usage_json(self.usage),
        }


@dataclass(frozen=True)
class SuperviseContext:
    """What a supervise adapter is asked about: the cycle that just ended, and the loop so far."""

    outer_loop_id: str
    goal: str
    input: Any
    cycle_number: int
    max_cycles: int
    run_id: str
    status: str  # completed | failed
    output: Any
    error: Any
    earlier: tuple[Cycle, ...]  # the cycles before this one, with their verdicts


Supervisor = Callable[[SuperviseContext], Mapping[str, Any]]
_SUPERVISORS: dict[str, Supervisor] = {}


def register_supervisor(name: str, fn: Supervisor) -> Supervisor:
    """Make `fn` a supervise adapter a loop can name (and a resume find again)."""
    _SUPERVISORS[name] = fn
    return fn


def get_supervisor(name: str) -> Supervisor:
    from .registry import load_modules

    load_modules()
    try:
        return _SUPERVISORS[name]
    except KeyError:
        raise UnknownSupervisor(
            f"no supervise adapter named {name!r} is registered (known: "
            f"{sorted(_SUPERVISORS)}); register it with register_supervisor in a module of "
            "RUNLEDGER_WORKFLOW_MODULES",
            supervise=name,
        ) from None


def _supervisor_name(supervise: str | Supervisor | None) -> str | None:
    if supervise is None or isinstance(supervise, str):
        return supervise
    for name, fn in _SUPERVISORS.items():
        if fn is supervise:
            return name
    return str(getattr(supervise, "__qualname__", repr(supervise)))


def _verdict(answer: Any, ctx: SuperviseContext) -> dict[str, Any]:
    """The adapter's answer as recorded: `{"kind": "done", "finalOutput"}` (the cycle's output
    when the adapter gave none) or `{"kind": "continue"}` with an optional string `promptNote`."""
    kind = answer.get("kind") if isinstance(answer, Mapping) else None
    if kind == "done":
        final = answer["finalOutput"] if "finalOutput" in answer else ctx.output
        verdict: dict[str, Any] = {"kind": "done", "finalOutput": final}
    elif kind == "continue":
        note = answer.get("promptNote")
        if note is not None and not isinstance(note, str):
            raise SuperviseFailed(
                f"supervise of outer loop {ctx.outer_loop_id} cycle {ctx.cycle_number} answered a "
                "promptNote that is not a string",
                outerLoopId=ctx.outer_loop_id,
            )
        verdict = {"kind": "continue", **({"promptNote": note} if note is not None else {})}
    else:
        raise SuperviseFailed(
            f"supervise of outer loop {ctx.outer_loop_id} cycle {ctx.cycle_number} answered "
            f"{str(answer)[:200]!r}; expected {{'kind': 'done', 'finalOutput': …}} or "
            "{'kind': 'continue', 'promptNote': …}",
            outerLoopId=ctx.outer_loop_id,
        )
    try:
        canonical_json(verdict)
    except (TypeError, ValueError) as exc:
        raise SuperviseFailed(
            f"supervise of outer loop {ctx.outer_loop_id} cycle {ctx.cycle_number} answered a "
            f"value with no JSON form: {exc}",
            outerLoopId=ctx.outer_loop_id,
        ) from exc
    return verdict


# --- the loop's state, from the ledger -------------------------------------------------------


def usage_json(usage: UsageTotals) -> dict[str, Any]:
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "cachedInputTokens": usage.cached_input_tokens,
        "reasoningTokens": usage.reasoning_tokens,
        "costUsd": float(usage.cost_usd) if usage.cost_usd is not None else None,
        "pricedCalls": usage.priced_calls,
        "unpricedCalls": usage.unpriced_calls,
    }


@dataclass(frozen=True)
class LoopState:
    """The reference's outer-loop manifest, derived from the loop's record and its cycle runs."""

    outer_loop_id: str
    record: Run
    workflow: str
    workflow_definition_hash: str
    workflow_version_id: str
    description: str
    input: Any
    max_cycles: int
    supervise: str | None
    cycles: tuple[Cycle, ...]  # recorded ones, then the pending one (if the loop goes on)
    status: str  # running | completed | failed
    result: Mapping[str, Any] | None = None  # {"kind": "done", "finalOutput"}
    error: Any = None

    @property
    def record_run_id(self) -> str:
        return self.record.run_id

    @property
    def completed_cycles(self) -> tuple[Cycle, ...]:
        return tuple(c for c in self.cycles if c.supervise is not None)

    @property
    def pending(self) -> Cycle | None:
        last = self.cycles[-1] if self.cycles else None
        return last if last is not None and last.supervise is None else None

    @property
    def usage(self) -> UsageTotals:
        """Summed across every cycle (and their sub-runs)."""
        total = UsageTotals()
        for cycle in self.cycles:
            total = total.merge(cycle.usage)
        return total

    def to_json(self) -> dict[str, Any]:
        pending = self.pending
        return {
            "outerLoopId": self.outer_loop_id,
            "recordRunId": self.record_run_id,
            "status": self.status,
            "goal": {
                "workflow": self.workflow,
                "workflowDefinitionHash": self.workflow_definition_hash,
                "workflowVersionId": self.workflow_version_id,
                "description": self.description,
            },
            "input": self.input,
            "maxCycles": self.max_cycles,
            "supervise": self.supervise,
            "cycles": [c.to_json() for c in self.cycles],
            **({"result": dict(self.result)} if self.result is not None else {}),
            **({"error": self.error} if self.error is not None else {}),
            **({"pendingCycleRunId": pending.run_id} if pending is not None else {}),
            "usage": usage_json(self.usage),
        }


def find_loop_record(workspace: Workspace, outer_loop_id: str) -> Run | None:
    return selectors.find_run(workspace, record_run_id(check_outer_loop_id(outer_loop_id)))


def read_loop(workspace: Workspace, outer_loop_id: str, record: Run | None = None) -> LoopState:
    """The loop's state; UnknownOuterLoop when it has no record, OuterLoopManifestCorrupt when its
    record does not read as one."""
    record = record if record is not None else find_loop_record(workspace, outer_loop_id)
    if record is None:
        raise UnknownOuterLoop(f"outer loop {outer_loop_id} not found", outerLoopId=outer_loop_id)
    events = log_of(record)
    state = read_record(record.run_id, events).state
    started = events[0]["payload"] if events else {}
    spec = started.get("outerLoop") if isinstance(started, Mapping) else None
    goal = spec.get("goal") if isinstance(spec, Mapping) else None
    max_cycles = spec.get("maxCycles") if isinstance(spec, Mapping) else None

    def corrupt(why: str) -> OuterLoopManifestCorrupt:
        return OuterLoopManifestCorrupt(
            f"outer_loop_manifest_corrupt — existing outer loop '{outer_loop_id}' {why}", outerLoopId=outer_loop_id
        )

    if (
        not isinstance(goal, Mapping)
        or not isinstance(goal.get("workflowDefinitionHash"), str)
        or not isinstance(goal.get("workflow"), str)
    ):
        raise corrupt(
            "has no goal (its record's RunStarted carries no outerLoop.goal with a workflow and its "
            "workflowDefinitionHash)."
        )
    if not isinstance(max_cycles, int) or isinstance(max_cycles, bool) or not 1 <= max_cycles <= MAX_CYCLES:
        raise corrupt(f"has maxCycles={max_cycles!r}, not a whole number from 1 to {MAX_CYCLES}.")
    if started.get("outerLoopId") != outer_loop_id:
        raise corrupt(f"has a record naming outerLoopId={started.get('outerLoopId')!r}.")
    recorded = state.outer_loop_cycles
    if state.status == RunStatus.COMPLETED and not recorded:
        raise corrupt("has result.kind='done' but cycles is empty.")
    verdicts: dict[int, Mapping[str, Any]] = {}
    for position, entry in enumerate(recorded, start=1):
        verdict = entry.supervise
        if entry.cycle_number != position:
            raise corrupt(f"records cycle {entry.cycle_number} where cycle {position} was due.")
        if entry.outer_loop_id != outer_loop_id:
            raise corrupt(f"records cycle {position} for outerLoopId={entry.outer_loop_id!r}.")
        if position > max_cycles:
            raise corrupt(f"records cycle {position} past maxCycles={max_cycles}.")
        if not isinstance(verdict, Mapping) or verdict.get("kind") not in ("done", "continue"):
            raise corrupt(f"records cycle {position} with supervise={verdict!r}, neither done nor continue.")
        if position > 1 and verdicts[position - 1].get("kind") == "done":
            raise corrupt(f"records cycle {position} after cycle {position - 1} was done.")
        verdicts[position] = verdict
    done = verdicts.get(len(recorded), {}).get("kind") == "done"
    if state.status == RunStatus.COMPLETED and not done:
        raise corrupt("has ended completed, but its last cycle's verdict is not done.")

    numbers = list(range(1, len(recorded) + 1))
    if state.status not in RunStatus.finished() and not done and len(recorded) < max_cycles:
        numbers.append(len(recorded) + 1)  # the pending cycle, reserved by its id
    ids = {n: cycle_run_id(outer_loop_id, n) for n in numbers}
    rows = {r.run_id: r for r in selectors.runs(workspace).filter(run_id__in=ids.values())}
    cycles = []
    for n in numbers:
        row = rows.get(ids[n])
        if row is None:
            cycles.append(Cycle(cycle_number=n, run_id=ids[n], status="pending", supervise=verdicts.get(n)))
            continue
        row.workspace = workspace
        output = None
        if row.status == RunStatus.COMPLETED:
            output = inline_or_ref(row, row.output, row.output_ref or None)
        cycles.append(
            Cycle(
                cycle_number=n,
                run_id=row.run_id,
                status=row.status,
                workflow_version_id=row.workflow_version_id,
                output=output,
                error=row.error,
                supervise=verdicts.get(n),
                usage=subrun_tree(row).usage,
            )
        )
    result = None
    if state.status == RunStatus.COMPLETED:
        result = {"kind": "done", "finalOutput": inline_or_ref(record, state.output, state.output_ref)}
    return LoopState(
        outer_loop_id=outer_loop_id,
        record=record,
        workflow=str(goal["workflow"]),
        workflow_definition_hash=str(goal["workflowDefinitionHash"]),
        workflow_version_id=str(goal.get("workflowVersionId", "")),
        description=str(goal.get("description", "")),
        input=inline_or_ref(record, state.input, state.input_ref),
        max_cycles=max_cycles,
        supervise=spec.get("supervise") if isinstance(spec.get("supervise"), str) else None,  # type: ignore[union-attr]
        cycles=tuple(cycles),
        status=state.status if state.status in RunStatus.finished() else RunStatus.RUNNING,
        result=result,
        error=state.error if state.status == RunStatus.FAILED else None,
    )


# --- driving a loop --------------------------------------------------------------------------


def cycle_input(loop: LoopState, cycle_number: int) -> dict[str, Any]:
    """What cycle N's run gets: the goal, the loop's input, and what the cycle before left (its
    output and the supervise adapter's note), all from the ledger, so a resume computes it again."""
    before = loop.cycles[cycle_number - 2] if cycle_number > 1 else None
    note = before.supervise.get("promptNote") if before is not None and before.supervise is not None else None
    return {
        "goal": loop.description,
        "input": loop.input,
        "cycleNumber": cycle_number,
        "maxCycles": loop.max_cycles,
        "promptNote": note,
        "previousOutput": before.output if before is not None else None,
    }


def start_outer_loop(
    *,
    workspace: Workspace,
    workflow: str | Workflow,
    input: Any,
    max_cycles: int,
    goal: str = "",
    supervise: str | Supervisor | None = None,
    outer_loop_id: str | None = None,
    take_over: bool = False,
) -> LoopState:
    """Start a loop and drive it to its end; an existing `outer_loop_id` is resumed instead, after
    checking that the caller asks for the loop it was started as."""
    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    adapter = checked_start(max_cycles, supervise)
    outer_loop_id = check_outer_loop_id(outer_loop_id or new_outer_loop_id())
    canonical_json(input)  # a value with no JSON form is refused before anything is written
    record = find_loop_record(workspace, outer_loop_id)
    if record is not None:
        loop = read_loop(workspace, outer_loop_id, record)
        _check_same_loop(loop, wf, max_cycles, goal, input)
        return _drive(workspace, outer_loop_id, wf, adapter, take_over)
    Recorder(workspace=workspace, run_id=record_run_id(outer_loop_id), last_sequence=0).append(
        {
            "type": "RunStarted",
            "payload": {
                "workflowVersionId": RECORD_VERSION_PREFIX + wf.version_id,
                "outerLoopId": outer_loop_id,
                "label": f"outer loop {outer_loop_id}",
                "input": input,
                "outerLoop": {
                    "goal": {
                        "workflow": wf.name,
                        "workflowDefinitionHash": wf.version,
                        "workflowVersionId": wf.version_id,
                        "description": goal,
                    },
                    "maxCycles": max_cycles,
                    "supervise": _supervisor_name(supervise),
                },
            },
        }
    )
    return _drive(workspace, outer_loop_id, wf, adapter, take_over)


def checked_start(max_cycles: int, supervise: str | Supervisor | None) -> Supervisor | None:
    """The supervisor of a loop of `max_cycles`, or what `start_outer_loop` refuses before it
    writes anything (the command line asks before it prints the loop's id)."""
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or not 1 <= max_cycles <= MAX_CYCLES:
        raise InvalidOuterLoop(
            f"maxCycles must be a whole number from 1 to {MAX_CYCLES}, got {max_cycles!r}", maxCycles=str(max_cycles)
        )
    return _adapter(supervise, max_cycles)


def resume_outer_loop(
    *,
    workspace: Workspace,
    outer_loop_id: str,
    workflow: str | Workflow | None = None,
    max_cycles: int | None = None,
    supervise: str | Supervisor | None = None,
    take_over: bool = False,
) -> LoopState:
    """Continue a loop from where its record ends: recorded cycles are not run or supervised again,
    the pending cycle's run is resumed (or started, if it never was)."""
    loop = read_loop(workspace, outer_loop_id)
    wf = (
        get_workflow(workflow if workflow is not None else loop.workflow)
        if not isinstance(workflow, Workflow)
        else workflow
    )
    _check_same_loop(loop, wf, loop.max_cycles if max_cycles is None else max_cycles, None, None)
    adapter = _adapter(supervise if supervise is not None else loop.supervise, loop.max_cycles)
    return _drive(workspace, outer_loop_id, wf, adapter, take_over)


def _adapter(supervise: str | Supervisor | None, max_cycles: int) -> Supervisor | None:
    if supervise is None:
        if max_cycles > 1:
            raise OuterLoopWithoutSupervisor(
                f"outer_loop_requested_without_supervise_adapter — maxOuterCycles={max_cycles} needs a supervise "
                "adapter to decide between cycles; pass one, or maxCycles=1",
                maxCycles=max_cycles,
            )
        return None
    return get_supervisor(supervise) if isinstance(supervise, str) else supervise


def _check_same_loop(loop: LoopState, wf: Workflow, max_cycles: int, goal: str | None, input: Any) -> None:
    ol = loop.outer_loop_id
    if loop.max_cycles != max_cycles:
        raise OuterLoopMaxCyclesMismatch(
            f"outer_loop_max_cycles_mismatch — existing outer loop '{ol}' was started with "
            f"maxCycles={loop.max_cycles}, caller now passed maxOuterCycles={max_cycles}.",
            outerLoopId=ol,
            recorded=loop.max_cycles,
            passed=max_cycles,
        )
    if loop.workflow_definition_hash != wf.version:
        raise OuterLoopGoalMismatch(
            f"outer_loop_goal_mismatch — existing outer loop '{ol}' was started with "
            f"workflowDefinitionHash={loop.workflow_definition_hash}, caller now passed {wf.version}.",
            outerLoopId=ol,
            recorded=loop.workflow_definition_hash,
            passed=wf.version,
        )
    if goal is not None and goal != loop.description:
        raise OuterLoopGoalMismatch(
            f"outer_loop_goal_mismatch — existing outer loop '{ol}' was started with "
            f"description={canonical_json(loop.description)}, caller now passed {canonical_json(goal)}.",
            outerLoopId=ol,
        )
    if goal is not None and digest(input) != digest(loop.input):
        raise OuterLoopGoalMismatch(
            f"outer_loop_goal_mismatch — existing outer loop '{ol}' was started with input "
            f"{digest(loop.input)}, caller now passed {digest(input)}.",
            outerLoopId=ol,
        )


def _drive(
    workspace: Workspace, outer_loop_id: str, wf: Workflow, adapter: Supervisor | None, take_over: bool
) -> LoopState:
    with Recorder.leased(workspace=workspace, run_id=record_run_id(outer_loop_id), take_over=take_over) as recorder:
        loop = read_loop(workspace, outer_loop_id)  # as it stands now that this driver holds the loop
        while loop.status == RunStatus.RUNNING:
            pending = loop.pending
            if pending is None:  # killed between the done/last verdict and the record's end
                _finish(recorder, loop, wf, None)
                break
            n = pending.cycle_number
            outcome = start_run(
                workspace=workspace,
                workflow=wf,
                input=cycle_input(loop, n),
                run_id=pending.run_id,
                take_over=take_over,
                parent=recorder,
                outer_loop_id=outer_loop_id,
                label=f"{outer_loop_id} cycle {n}",
            )
            recorder.keep_alive()  # a long supervise call starts with the loop's lease renewed, if due
            earlier = loop.cycles[:-1]
            ctx = SuperviseContext(
                outer_loop_id=outer_loop_id,
                goal=loop.description,
                input=loop.input,
                cycle_number=n,
                max_cycles=loop.max_cycles,
                run_id=outcome.run_id,
                status=outcome.status,
                output=outcome.output,
                error=outcome.error,
                earlier=earlier,
            )
            verdict = _supervise(adapter, ctx)
            event = {
                "type": "OuterLoopCycleCompleted",
                "payload": {
                    "outerLoopId": outer_loop_id,
                    "cycleNumber": n,
                    "runId": outcome.run_id,
                    "supervise": verdict,
                },
            }
            done_cycle = replace(
                pending, status=outcome.status, output=outcome.output, error=outcome.error, supervise=verdict
            )
            loop = replace(loop, cycles=(*earlier, done_cycle))
            if verdict["kind"] == "done" or n >= loop.max_cycles:
                _finish(recorder, loop, wf, event)
                break
            recorder.append(event)
            loop = read_loop(workspace, outer_loop_id)
    return read_loop(workspace, outer_loop_id)


def _supervise(adapter: Supervisor | None, ctx: SuperviseContext) -> dict[str, Any]:
    if adapter is None:  # maxCycles=1 with no adapter: the one cycle is the result
        if ctx.status != RunStatus.COMPLETED:
            return {"kind": "continue"}  # nothing to be done with: the loop ends exhausted
        return {"kind": "done", "finalOutput": ctx.output}
    try:
        answer = adapter(ctx)
    except Exception as exc:  # the adapter's failure leaves the loop resumable, nothing recorded
        raise SuperviseFailed(
            f"supervise of outer loop {ctx.outer_loop_id} cycle {ctx.cycle_number} raised {type(exc).__name__}: {exc}",
            outerLoopId=ctx.outer_loop_id,
        ) from exc
    return _verdict(answer, ctx)


def _finish(recorder: Recorder, loop: LoopState, wf: Workflow, cycle_event: Mapping[str, Any] | None) -> None:
    """The record's end, in one commit with the last cycle's verdict when there is one."""
    last = loop.cycles[-1]
    version = RECORD_VERSION_PREFIX + wf.version_id
    assert last.supervise is not None
    if last.supervise["kind"] == "done":
        end: dict[str, Any] = {
            "type": "RunCompleted",
            "payload": {"workflowVersionId": version, "output": last.supervise.get("finalOutput")},
        }
    else:
        end = {
            "type": "RunFailed",
            "payload": {
                "workflowVersionId": version,
                "error": {
                    "name": "OuterLoopExhausted",
                    "causeCode": EXHAUSTED,
                    "message": exhausted_message(len(loop.cycles), loop.outer_loop_id),
                },
            },
        }
    recorder.append(*([cycle_event] if cycle_event is not None else []), end)
