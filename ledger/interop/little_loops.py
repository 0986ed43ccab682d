"""An outer loop imported from Little Workflow, read from its cycle runs.

Our runtime keeps a loop's facts in a record run of its own (ledger/runtime/outer_loop.py); Little
Workflow keeps them in its manifest (`outer-loops/<ol_id>.json`, which `ledger import-little` checks
and does not store) and in the cycle runs' logs: `RunStarted.outerLoopId` and, after each cycle's
end, `OuterLoopCycleCompleted {outerLoopId, cycleNumber, supervise}`. An imported loop is read from
those, so its page opens (docs/operations.md § Importing Little Workflow data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..canonical import canonical_json
from ..fold.pricing import LITTLE_WORKFLOW, UsageTotals
from ..models import Event, Run, Workspace
from ..replay.runlog import folded
from ..runtime.outer_loop import Cycle


@dataclass(frozen=True)
class ImportedLoop:
    """What the loop page shows of an imported loop; what only the manifest held (goal,
    maxCycles) is not in the ledger, and is left empty."""

    outer_loop_id: str
    cycles: tuple[Cycle, ...]
    status: str  # completed (a cycle's verdict is done) | running
    result: dict[str, Any] | None
    usage: UsageTotals
    description: str = ""
    workflow: str = ""
    workflow_definition_hash: str = ""
    max_cycles: int | None = None
    supervise: str | None = None
    error: Any = None

    @property
    def completed_cycles(self) -> tuple[Cycle, ...]:
        return tuple(c for c in self.cycles if c.supervise is not None)


def imported_loop(workspace: Workspace, outer_loop_id: str) -> ImportedLoop | None:
    """The imported loop `outer_loop_id` of `workspace`, or None when no imported run names it."""
    # Payloads are stored as canonical JSON text: the member is exactly this text wherever it is.
    member = canonical_json({"outerLoopId": outer_loop_id})[1:-1]
    run_pks = (
        Event.objects.filter(
            run__workspace=workspace,
            run__imported_from=LITTLE_WORKFLOW,
            type__in=("RunStarted", "OuterLoopCycleCompleted"),
            payload__contains=member,
        )
        .values_list("run_id", flat=True)
        .distinct()
    )
    runs = list(Run.objects.filter(pk__in=list(run_pks)).select_related("workspace"))
    if not runs:
        return None
    cycles: list[Cycle] = []
    for run in runs:
        state = folded(run).state
        for entry in state.outer_loop_cycles:
            if entry.outer_loop_id != outer_loop_id:
                continue
            cycles.append(
                Cycle(
                    cycle_number=entry.cycle_number,
                    run_id=run.run_id,
                    status=state.status,
                    workflow_version_id=state.workflow_version_id or "",
                    output=state.output,
                    error=state.error,
                    supervise=entry.supervise,
                    usage=state.usage,
                )
            )
    cycles.sort(key=lambda c: (c.cycle_number, c.run_id))
    usage = UsageTotals()
    for cycle in cycles:
        usage = usage.merge(cycle.usage)
    done = next(
        (c.supervise for c in cycles if isinstance(c.supervise, dict) and c.supervise.get("kind") == "done"), None
    )
    return ImportedLoop(
        outer_loop_id,
        tuple(cycles),
        "completed" if done is not None else "running",
        dict(done) if done is not None else None,
        usage,
    )
